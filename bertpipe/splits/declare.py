"""The splits stage's declaration (see ``bertpipe.declared``): every finetune task's splits, into work/splits."""

from __future__ import annotations

from bertpipe.declared import Family
from bertpipe.layout import splits_dir
from bertpipe.stage import Stage


def splits_stage(cfg) -> Stage:
    from bertpipe.splits import stage as m

    m.refuse_old_layout(cfg)
    return Stage("splits", m.VERSION, m.sections(cfg), m.own_inputs, splits_dir, m.build, params_section="finetune",
                 code=("splits",), libs=("numpy",))


SPLITS = Family("splits", "Materialise every finetune task's train/dev/test splits into work/splits (caps applied).",
                lambda c: [splits_stage(c)])
