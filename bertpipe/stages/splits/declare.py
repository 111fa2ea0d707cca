"""The splits stage's declaration (see ``bertpipe.core.declared``): every finetune task's splits, into work/splits."""

from __future__ import annotations

from pathlib import Path

from bertpipe.core.declared import Family
from bertpipe.core.stage import Stage, deferred
from bertpipe.lib.labelled import SPLITS as SPLIT_NAMES
from bertpipe.lib.labelled import task_params
from bertpipe.lib.layout import splits_dir

VERSION = "1"


def sections(cfg) -> tuple[str, ...]:
    """The params sections the splits read from (``spec`` says which part of each)."""
    tasks = tuple(f"finetune.tasks.{t}" for t in cfg.params.finetune.tasks)
    return (*tasks, "finetune.train", "prepare.dedup")


def spec(cfg) -> dict:
    """What the splits depend on: each task's data definition (not how a model is fed, not its training or search
    overrides) with its two caps resolved (``finetune.train`` < the task's ``train_overrides``), and the
    near-duplicate settings. A training setting, even a task's own, never reruns the splits and what reads them."""
    out: dict = {}
    for t, p in cfg.params.finetune.tasks.items():
        tp = p.train_params(cfg.params.finetune.train)
        out[f"finetune.tasks.{t}"] = {**p.data_definition(), "caps": {
            "max_train_examples": tp.max_train_examples, "max_eval_examples": tp.max_eval_examples}}
    out["prepare.dedup"] = cfg.section_dict("prepare.dedup")
    return out


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
    return Stage("splits", VERSION, sections(cfg), own_inputs, splits_dir,
                 deferred("bertpipe.stages.splits.stage:build"), params_section="finetune", code=("splits",),
                 libs=("numpy",), spec=spec)


SPLITS = Family("splits", "Materialise every finetune task's train/dev/test splits into work/splits (caps applied).",
                lambda c: [splits_stage(c)])
