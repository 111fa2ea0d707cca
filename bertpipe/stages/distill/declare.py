"""The distill stages' declaration (see ``bertpipe.core.declared``): one student per task."""

from __future__ import annotations

from bertpipe.core.codeid import MODEL_LIBS
from bertpipe.core.declared import Family
from bertpipe.core.stage import Stage, deferred
from bertpipe.infra.config import Config
from bertpipe.lib.labelled import reader_spec
from bertpipe.lib.layout import distill_out, distill_tasks, finetune_out, task_dir
from bertpipe.stages.distill.params import DistillParams

VERSION = "1"


def distill_stage(task: str) -> Stage:
    def inputs(cfg: Config) -> dict:
        # The student trains on the task's splits (bertpipe.lib.labelled) with the teacher's soft targets.
        return {"teacher": finetune_out(cfg, task, cfg.params.distill.teacher_encoder), "task": task_dir(cfg, task)}

    return Stage(f"distill/{task}", VERSION, ("distill", "finetune.train", f"finetune.tasks.{task}"), inputs,
                 lambda c: distill_out(c, task), deferred("bertpipe.stages.distill.stage:build", task=task),
                 params_section="distill", code=("distill",), libs=MODEL_LIBS, cli=("distill", "--task", task),
                 task=task, spec=lambda c: {"distill": c.params.distill, **reader_spec(c, task)})


DISTILL = Family("distill", "Distill each finetuned task into a smaller student (or one with --task).",
                 lambda c: [distill_stage(t) for t in distill_tasks(c)], ("task",), params={"distill": DistillParams})
