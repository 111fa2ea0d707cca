"""The ``start`` stage: decide where domain pretraining starts and write it to ``work/start/start.json``.

The decision depends on the MLflow registry (is there a champion encoder, what was it trained on), which no file
in the project holds, so it is the stage's *external* input (``Stage.external``): ``run_stage`` asks it on every
run and rebuilds the output when the answer differs from the one recorded, while ``bertpipe stages``, dvc.yaml and
the Prefect cache keys read only the file. An unreachable registry fails the run (``bertpipe.lineage``).
"""

from __future__ import annotations

import json

from bertpipe.start import START_JSON, describe

VERSION = "1"
# What the rule reads from params (bertpipe.lineage.resolve); the registry's answer is the external input.
SECTIONS = ("flow.retrain_from", "model.continue_from", "register.register_encoder", "register.prefix")


def own_inputs(cfg) -> dict:
    # The prepared corpora: the rule compares their identity with the champion's, so start runs after prepare.
    return {"corpus": cfg.work / "prepare"}


def _corpus(cfg) -> str | None:
    try:
        return json.loads((cfg.work / "prepare" / "manifest.json").read_text())["fingerprint"]
    except (OSError, ValueError, KeyError):
        return None


def decide(cfg, corpus: str | None = None) -> dict:
    """The start.json record for this config and the registry as it is now (queries MLflow when the rule needs
    it; a registered version is exported once, under paths.state/exported). ``corpus``: the prepare fingerprint,
    read from its manifest when not given."""
    from bertpipe.lineage import resolve
    from bertpipe.stage import content_digest  # the hash cache: a 400 MB champion is read once, not every run

    corpus = corpus if corpus is not None else _corpus(cfg)
    s = resolve(cfg, corpus)
    rec = {"kind": s.kind, "model": None if s.kind == "base" else str(s.model), "name": s.name,
           "version": s.version, "model_digest": content_digest(s.model, cfg)[:32] if s.kind == "champion" else None,
           "corpus": corpus, "start": s.record()}
    return rec


def build(ctx) -> dict:
    rec = ctx.external
    (ctx.out / START_JSON).write_text(json.dumps(rec, indent=2, sort_keys=True, ensure_ascii=False) + "\n",
                                      encoding="utf-8")
    ctx.log(f"pretraining starts from {describe(rec, rec['model'] or 'of model.base')}")
    return {}
