"""Params of the ``tapt/<task>`` stages (``tapt:`` in params.yaml): pretrain's, with TAPT's defaults and a length in
epochs over the task's texts."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from bertpipe.lib.mlm.params import PretrainParams


class TaptParams(PretrainParams):
    """Every pretrain knob (masking, optimisation, precision, evaluation) applies as under ``pretrain:``. Defaults
    follow the paper's TAPT recipe scaled to one process: lr 1e-4, mask 15% (whole words), many passes over a small
    text set; the last checkpoint is kept (the held-out texts are a small slice of train, for the report)."""

    # MLM only: TAPT continues the adapted encoder's masked-LM head; no pair loss, one process (task texts are small)
    objective: Literal["mlm"] = "mlm"
    pair_objective: Literal["none"] = "none"
    nproc: Literal[1] = 1

    # Passes over the task's (leak-checked) train texts; the steps are epochs x segments / (batch x grad_accum),
    # at most max_steps. 0: max_steps alone sets the length.
    epochs: float = Field(20.0, ge=0.0, le=1000.0)
    max_steps: int = Field(2000, ge=1)
    # Share of the task's train texts held out for the held-out MLM loss (never trained on; at least one text).
    holdout: float = Field(0.05, gt=0.0, le=0.5)
    eval_examples: int = Field(256, ge=1)
    eval_every: int = Field(100, ge=1)
    save_every: int = Field(100, ge=1)
    output: Literal["best", "last"] = "last"
    lr: float = Field(1e-4, gt=0.0, le=1.0)
    batch_size: int = Field(32, ge=1, le=4096)
    fill_mask_samples: int = Field(3, ge=0, le=50)
