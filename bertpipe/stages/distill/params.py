"""Params of the distill stage (`distill:` in params.yaml).

The student's shape is either explicit (``student: {layers, hidden, heads, intermediate}``, 0 = the teacher's) or a
``ratio`` of the teacher's layers. When the hidden size matches the teacher's, the student starts from the teacher's
embeddings, evenly spaced layers (every other one at ratio 0.5, as DistilBERT does) and task head; otherwise it
starts from a fresh config of the requested size.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from bertpipe.lib.training.params import TrainOverrides


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class StudentShape(_Strict):
    layers: int = Field(0, ge=0, le=96)  # 0: round(teacher layers * ratio)
    hidden: int = Field(0, ge=0, le=16384)  # 0: the teacher's (then its weights can be copied)
    heads: int = Field(0, ge=0, le=256)  # 0: the teacher's, or hidden // 64 (at least 1) for a new hidden size
    intermediate: int = Field(0, ge=0, le=65536)  # 0: the teacher's, or 4 * hidden for a new hidden size


class DistillParams(_Strict):
    enabled: bool = True
    tasks: list[str] = Field(default_factory=list)  # empty: every finetune task
    teacher_encoder: Literal["adapted", "base", "tapt"] = "adapted"  # which finetune/<task>/<encoder> teaches
    ratio: float = Field(0.5, gt=0.0, le=1.0)  # student layers = round(teacher layers * ratio) when layers is 0
    student: StudentShape = Field(default_factory=StudentShape)
    temperature: float = Field(2.0, gt=0.0, le=100.0)
    # loss = alpha * T^2 * KL(teacher_T || student_T) + (1 - alpha) * hard-label loss + hidden_weight * hidden MSE
    alpha: float = Field(0.5, ge=0.0, le=1.0)
    hidden_weight: float = Field(0.0, ge=0.0, le=100.0)  # > 0: match mapped hidden states (TinyBERT-style)
    # Overrides of the task's finetune train params for the student (e.g. {epochs: 4, lr: 1e-3}).
    train_overrides: TrainOverrides = Field(default_factory=dict)
    bench_batches: int = Field(8, ge=1, le=1000)  # test batches timed per model for the side-by-side throughput

