"""The start stage's declaration (see ``bertpipe.declared``): where domain pretraining starts, into
work/start/start.json."""

from __future__ import annotations

from bertpipe.declared import Family
from bertpipe.layout import start_dir
from bertpipe.stage import Stage


def start_stage() -> Stage:
    from bertpipe.start import stage as m

    return Stage("start", m.VERSION, m.SECTIONS, m.own_inputs, start_dir, m.build, params_section="flow",
                 code=("start",), external=m.decide, external_memo=m.KEPT_WITH, light=True)


START = Family("start", "Decide where domain pretraining starts (the base, or the registry's champion encoder) into "
               "work/start/start.json.", lambda c: [start_stage()])
