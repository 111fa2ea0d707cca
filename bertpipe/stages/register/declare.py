"""The register stage's declaration (see ``bertpipe.core.declared``): the models into the MLflow registry."""

from __future__ import annotations

from bertpipe.core.codeid import MODEL_LIBS
from bertpipe.core.declared import Family
from bertpipe.core.stage import Stage, deferred
from bertpipe.infra.config import Config
from bertpipe.lib.keyedstore import FOLDER as WINDOW_STORES
from bertpipe.lib.layout import (
    base_model, corpus_dir, distill_out, distill_tasks, evaluate_out, export_out, export_targets, finetune_out,
    task_dir, task_model_encoders,
)
from bertpipe.lib.registered.versions import EXPORTED
from bertpipe.stages.register.params import RegisterParams
from bertpipe.stages.register.present import missing

VERSION = "2"


def register_stage() -> Stage:
    def inputs(cfg: Config) -> dict:
        # every competing encoder's finetune of each task (register registers the best by dev score, as export
        # exports it; none when finetune.encoders is [base]: register then logs the encoder and any students)
        ins: dict = {f"finetune/{t}/{e}": finetune_out(cfg, t, e) for t in cfg.params.finetune.tasks
                     for e in task_model_encoders(cfg)}
        ins.update({f"distill/{t}": distill_out(cfg, t) for t in distill_tasks(cfg)})
        ins.update({f"export/{k}": export_out(cfg, k) for k in export_targets(cfg)})
        ins["evaluate"] = evaluate_out(cfg)
        ins["adapted"] = cfg.work / "pretrain"
        # Read too: each task's test split is re-scored and identified; the encoder gate (when the encoder is
        # registered) scores on the domain test split against the base (evaluate.fair_mlm); the lineage tags name
        # the vocab output's fingerprint where there is one (task models can be registered over a given encoder).
        if cfg.params.register.register_encoder:
            ins["corpus"] = corpus_dir(cfg, "domain")
            ins["base"] = base_model(cfg)
        if cfg.params.register.register_encoder or (cfg.work / "vocab").exists():
            ins["vocab"] = cfg.work / "vocab"
        # read where present (the split hashes identify the test set; a registry can be built from finetune
        # outputs alone)
        ins.update({f"splits/{t}": task_dir(cfg, t) for t in cfg.params.finetune.tasks if task_dir(cfg, t).exists()})
        return ins

    return Stage("register", VERSION, ("register", "tracking"), inputs, lambda c: c.work / "register",
                 deferred("bertpipe.stages.register.stage:build"), code=("register",), libs=(*MODEL_LIBS, "mlflow"),
                 sources_from=("finetune", "distill", "export"), lost=missing,
                 # a champion exported to be re-scored; the encoder gate's windows when evaluate has no score
                 stores=(EXPORTED, WINDOW_STORES), registry=True)


REGISTER = Family("register", "Register the finetuned models in the MLflow registry (champion/challenger).",
                  lambda c: [register_stage()], params={"register": RegisterParams})
