"""The finetune stages' declaration (see ``bertpipe.core.declared``): one per task x encoder."""

from __future__ import annotations

from bertpipe.core.codeid import MODEL_LIBS
from bertpipe.core.declared import Family
from bertpipe.core.stage import Stage, deferred
from bertpipe.infra.config import Config
from bertpipe.lib.labelled import task_params
from bertpipe.lib.layout import encoder_dir, finetune_out, finetune_pairs, task_dir
from bertpipe.stages.finetune.params import FinetuneParams, spec

VERSION = "2"  # 2: reads the splits stage's splits; seeded before the model is built
TRIALS = "trials"  # under paths.state: the project's search trials, one Optuna journal (bertpipe.stages.finetune.search)


def finetune_stage(task: str, encoder: str) -> Stage:
    def inputs(cfg: Config) -> dict:
        task_params(cfg, task)  # an unknown task name is a one-line error
        return {"encoder": encoder_dir(cfg, encoder, task), "task": task_dir(cfg, task)}

    return Stage(
        f"finetune/{task}/{encoder}",
        VERSION,
        ("finetune.train", "finetune.search", f"finetune.tasks.{task}"),
        inputs,
        lambda c: finetune_out(c, task, encoder),
        deferred("bertpipe.stages.finetune.stage:build", task=task, encoder=encoder),
        params_section="finetune",
        code=("finetune",),
        libs=(*MODEL_LIBS, "numpy", "optuna"),
        cli=("finetune", "--task", task, "--encoder", encoder),
        task=task,
        encoder=encoder,
        spec=lambda cfg: spec(cfg, task),
        stores=(TRIALS,),
    )


FINETUNE = Family("finetune", "Finetune a task head (every task x encoder in params, or one with --task/--encoder).",
                  lambda c: [finetune_stage(t, e) for t, e in finetune_pairs(c)], ("task", "encoder"),
                  params={"finetune": FinetuneParams})
