"""The splits stage's declaration (see ``bertpipe.declared``): every finetune task's splits, into work/splits."""

from __future__ import annotations

from pathlib import Path

from bertpipe.declared import Family
from bertpipe.layout import splits_dir
from bertpipe.stage import Stage, deferred
from bertpipe.tasklib import SPLITS as SPLIT_NAMES
from bertpipe.tasklib import task_params

VERSION = "1"


def sections(cfg) -> tuple[str, ...]:
    """The params the splits depend on: each task's definition, the caps, and the near-duplicate settings."""
    tasks = tuple(f"finetune.tasks.{t}" for t in cfg.params.finetune.tasks)
    return (*tasks, "finetune.train.max_train_examples", "finetune.train.max_eval_examples", "prepare.dedup")


def task_files(cfg, task: str) -> dict[str, Path]:
    """The raw files one task reads, keyed ``<task>:<split or label>``."""
    p = task_params(cfg, task)
    files = {s: getattr(p, s) for s in SPLIT_NAMES if getattr(p, s)}
    files.update(p.label_files)
    return {f"{task}:{k}": cfg.path(v) for k, v in files.items()}


def own_inputs(cfg) -> dict[str, Path]:
    out: dict[str, Path] = {}
    for task in cfg.params.finetune.tasks:
        out.update(task_files(cfg, task))
    return out


def splits_stage(cfg) -> Stage:
    return Stage("splits", VERSION, sections(cfg), own_inputs, splits_dir, deferred("bertpipe.splits.stage:build"),
                 params_section="finetune", code=("splits",), libs=("numpy",))


SPLITS = Family("splits", "Materialise every finetune task's train/dev/test splits into work/splits (caps applied).",
                lambda c: [splits_stage(c)])
