"""The tapt stages' declaration (see ``bertpipe.declared``): continued MLM on each task's train texts."""

from __future__ import annotations

from bertpipe.codeid import MODEL_LIBS
from bertpipe.config import Config
from bertpipe.declared import Family
from bertpipe.layout import adapted_model, tapt_out, tapt_tasks, task_dir
from bertpipe.pretrain.tapt.params import TaptParams
from bertpipe.stage import Stage, deferred
from bertpipe.tasklib import task_params

VERSION = "1"


def tapt_stage(task: str) -> Stage:
    def inputs(cfg: Config) -> dict:
        task_params(cfg, task)  # an unknown task name is a one-line error
        return {"model": adapted_model(cfg), "task": task_dir(cfg, task)}

    # prepare's clean/dedup/exclude params define the leak check that keeps the task's dev/test texts out
    return Stage(f"tapt/{task}", VERSION, ("tapt", "model.language", "prepare.clean", "prepare.dedup",
                                             "prepare.exclude"), inputs, lambda c: tapt_out(c, task),
                 deferred("bertpipe.pretrain.tapt.stage:build", task=task), params_section="tapt",
                 code=("pretrain/tapt",), libs=(*MODEL_LIBS, "datasketch", "jieba", "numpy"),
                 cli=("tapt", "--task", task), task=task)


# `tapt/<task>`: continued MLM on each task's train texts (when finetune.encoders names tapt)
TAPT = Family("tapt", "Task-adaptive pretraining: continued MLM on each task's train texts (when finetune.encoders "
              "names tapt; or one with --task).", lambda c: [tapt_stage(t) for t in tapt_tasks(c)], ("task",),
              params={"tapt": TaptParams})
