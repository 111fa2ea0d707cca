"""The tapt stages' declaration (see ``bertpipe.core.declared``): continued MLM on each task's train texts."""

from __future__ import annotations

from bertpipe.core.codeid import MODEL_LIBS
from bertpipe.core.declared import Family
from bertpipe.core.stage import Stage, deferred
from bertpipe.infra.config import Config
from bertpipe.lib.labelled import task_params
from bertpipe.lib.layout import adapted_model, tapt_out, tapt_tasks, task_dir
from bertpipe.stages.tapt.params import TaptParams

VERSION = "1"


def tapt_stage(task: str) -> Stage:
    def inputs(cfg: Config) -> dict:
        task_params(cfg, task)  # an unknown task name is a one-line error
        return {"model": adapted_model(cfg), "task": task_dir(cfg, task)}

    # prepare's clean/dedup/exclude params define the leak check that keeps the task's dev/test texts out
    return Stage(f"tapt/{task}", VERSION, ("tapt", "model.language", "prepare.clean", "prepare.dedup",
                                             "prepare.exclude"), inputs, lambda c: tapt_out(c, task),
                 deferred("bertpipe.stages.tapt.stage:build", task=task), params_section="tapt",
                 code=("tapt",), libs=(*MODEL_LIBS, "datasketch", "jieba", "numpy"),
                 cli=("tapt", "--task", task), task=task)


# `tapt/<task>`: continued MLM on each task's train texts (when finetune.encoders names tapt)
TAPT = Family("tapt", "Task-adaptive pretraining: continued MLM on each task's train texts (when finetune.encoders "
              "names tapt; or one with --task).", lambda c: [tapt_stage(t) for t in tapt_tasks(c)], ("task",),
              params={"tapt": TaptParams})
