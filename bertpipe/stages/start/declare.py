"""The start stage's declaration (see ``bertpipe.core.declared``): where domain pretraining starts, into
work/start/start.json."""

from __future__ import annotations

from bertpipe.core.declared import Family
from bertpipe.core.stage import Stage, deferred
from bertpipe.lib.layout import start_dir
from bertpipe.lib.registered.versions import EXPORTED

VERSION = "1"
# What the rule reads from params (bertpipe.lib.lineage.resolve); the registry's answer is the external input.
SECTIONS = ("flow.retrain_from", "model.continue_from", "register.register_encoder", "register.prefix")
# Recorded with the decision (the manifest's "external"), never written to start.json: its bytes stay the decision's.
KEPT_WITH = ("registry", "params")


def own_inputs(cfg) -> dict:
    # The prepared corpora: the rule compares their identity with the champion's, so start runs after prepare.
    return {"corpus": cfg.work / "prepare"}


def start_stage() -> Stage:
    return Stage("start", VERSION, SECTIONS, own_inputs, start_dir, deferred("bertpipe.stages.start.stage:build"),
                 params_section="flow", code=("start",), external=deferred("bertpipe.stages.start.stage:decide"),
                 external_memo=KEPT_WITH, light=True, stores=(EXPORTED,))  # the champion, exported to start from


START = Family("start", "Decide where domain pretraining starts (the base, or the registry's champion encoder) into "
               "work/start/start.json.", lambda c: [start_stage()])
