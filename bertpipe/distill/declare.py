"""The distill stages' declaration (see ``bertpipe.declared``): one student per task."""

from __future__ import annotations

from bertpipe.codeid import MODEL_LIBS
from bertpipe.config import Config
from bertpipe.declared import Family
from bertpipe.distill.params import DistillParams
from bertpipe.layout import distill_out, distill_tasks, finetune_out, task_dir
from bertpipe.stage import Stage, deferred
from bertpipe.tasklib import reader_spec

VERSION = "1"


def distill_stage(task: str) -> Stage:
    def inputs(cfg: Config) -> dict:
        # The student trains on the task's splits (bertpipe.tasklib) with the teacher's soft targets.
        return {"teacher": finetune_out(cfg, task, cfg.params.distill.teacher_encoder), "task": task_dir(cfg, task)}

    return Stage(f"distill/{task}", VERSION, ("distill", "finetune.train", f"finetune.tasks.{task}"), inputs,
                 lambda c: distill_out(c, task), deferred("bertpipe.distill.stage:build", task=task),
                 params_section="distill", code=("distill",), libs=MODEL_LIBS, cli=("distill", "--task", task),
                 task=task, spec=lambda c: {"distill": c.params.distill, **reader_spec(c, task)})


DISTILL = Family("distill", "Distill each finetuned task into a smaller student (or one with --task).",
                 lambda c: [distill_stage(t) for t in distill_tasks(c)], ("task",), params={"distill": DistillParams})
