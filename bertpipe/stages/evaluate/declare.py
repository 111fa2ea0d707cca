"""The evaluate stage's declaration (see ``bertpipe.core.declared``): every finetune scored, base vs adapted."""

from __future__ import annotations

from bertpipe.core.codeid import MODEL_LIBS
from bertpipe.core.declared import Family
from bertpipe.core.stage import Stage, deferred
from bertpipe.infra.config import Config
from bertpipe.lib.keyedstore import FOLDER as WINDOW_STORES
from bertpipe.lib.layout import (adapted_model, base_model, corpus_dir, evaluate_out, finetune_out, finetune_pairs,
                                 task_dir)
from bertpipe.stages.evaluate.params import EvaluateParams

VERSION = "2"


def evaluate_stage() -> Stage:
    def inputs(cfg: Config) -> dict:
        ins: dict = {f"finetune/{t}/{e}": finetune_out(cfg, t, e) for t, e in finetune_pairs(cfg)}
        ins["base"] = base_model(cfg)
        ins["adapted"] = adapted_model(cfg)
        ins["corpus"] = corpus_dir(cfg, "domain")
        # the materialised splits the baselines train/score on and whose test hash identifies the test set
        ins.update({f"splits/{t}": task_dir(cfg, t) for t in cfg.params.finetune.tasks})
        return ins

    return Stage("evaluate", VERSION, ("evaluate",), inputs, evaluate_out,
                 deferred("bertpipe.stages.evaluate.stage:build"), code=("evaluate",),
                 libs=(*MODEL_LIBS, "numpy", "scikit-learn", "seqeval"), sources_from=("finetune",),
                 stores=(WINDOW_STORES,))


EVALUATE = Family("evaluate", "Evaluate finetuned models; base vs adapted report.", lambda c: [evaluate_stage()],
                  params={"evaluate": EvaluateParams})
