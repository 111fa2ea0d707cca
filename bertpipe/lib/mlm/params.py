"""Params of the pretrain stage; the same model configures `base:` (from scratch) and `pretrain:` (continued)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from bertpipe.infra.switches import AttentionSetting, CompileSetting


class ArchParams(BaseModel):
    """Architecture of a from-scratch model (stage `base` only; continued pretraining keeps the checkpoint's)."""

    model_config = ConfigDict(extra="forbid")

    layers: int = Field(4, ge=1, le=48)
    hidden: int = Field(256, ge=16, le=8192)
    heads: int = Field(4, ge=1, le=128)
    intermediate: int = Field(1024, ge=16, le=32768)
    max_positions: int = Field(512, ge=16, le=8192)
    dropout: float = Field(0.1, ge=0.0, le=0.9)

    @model_validator(mode="after")
    def _heads_divide_hidden(self) -> "ArchParams":
        if self.hidden % self.heads:
            raise ValueError(f"arch.hidden ({self.hidden}) must be a multiple of arch.heads ({self.heads})")
        return self


class RtdParams(BaseModel):
    """ELECTRA's replaced-token detection (``objective: rtd``); defaults as in Clark et al. 2020."""

    model_config = ConfigDict(extra="forbid")

    # The generator's hidden size (and heads, feed-forward width) as a share of the discriminator's: the paper finds
    # 1/4-1/2 best; a generator as strong as the discriminator makes the task too hard.
    generator_ratio: float = Field(0.25, gt=0.0, le=1.0)
    # loss = generator MLM loss + disc_weight x discriminator loss (the paper's lambda)
    disc_weight: float = Field(50.0, gt=0.0, le=1000.0)


class PretrainParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    arch: ArchParams = Field(default_factory=ArchParams)

    # mlm: masked-language modelling; rtd: ELECTRA's replaced-token detection (a small generator fills the masks,
    # the discriminator - the saved encoder - tells original from replaced tokens). docs/objectives.md
    objective: Literal["mlm", "rtd"] = "mlm"
    rtd: RtdParams = Field(default_factory=RtdParams)

    # ---- examples
    max_seq_len: int = Field(128, ge=16, le=512)
    # none: RoBERTa-style full segments (no pair loss); nsp: BERT's next-sentence prediction; sop: ALBERT's order.
    pair_objective: Literal["none", "nsp", "sop"] = "none"
    # Without a pair objective, segments may continue into the next document (separated by [SEP]) so no text is
    # left in half-empty segments; with one, a segment stays inside its document as BERT's recipe requires.
    cross_document: bool = True
    max_train_examples: int = Field(0, ge=0)  # 0: every packed segment of the corpus
    eval_examples: int = Field(512, ge=1)

    # ---- masking
    mask_prob: float = Field(0.15, gt=0.0, le=0.5)
    mask_token_ratio: float = Field(0.8, ge=0.0, le=1.0)  # of the chosen tokens: -> [MASK]
    random_token_ratio: float = Field(0.1, ge=0.0, le=1.0)  # -> a random token
    keep_ratio: float = Field(0.1, ge=0.0, le=1.0)  # -> unchanged
    whole_word: bool = True
    masking: Literal["dynamic", "static"] = "dynamic"

    # ---- optimisation
    batch_size: int = Field(32, ge=1, le=4096)  # examples per micro-batch per process
    grad_accum: int = Field(1, ge=1, le=1024)
    max_steps: int = Field(10000, ge=1)
    max_time_s: float = Field(0.0, ge=0.0)  # wall-clock budget for this run; 0: none
    lr: float = Field(1e-4, gt=0.0, le=1.0)
    weight_decay: float = Field(0.01, ge=0.0, le=1.0)
    warmup_ratio: float = Field(0.06, ge=0.0, le=0.5)
    schedule: Literal["linear", "cosine", "constant"] = "linear"
    max_grad_norm: float = Field(1.0, ge=0.0)  # 0: no clipping
    # auto: bf16 where the device has bf16 units (CUDA cc >= 8.0, CPU AVX512-BF16/AMX), fp16 + GradScaler on older
    # GPUs, fp32 elsewhere (bertpipe/infra/device.py); the choice and its reason are in the manifest
    precision: Literal["auto", "bf16", "fp16", "fp32"] = "auto"
    bucket: bool = True  # length-bucketed batches (less padding)
    # torch.compile (Inductor) of the model: on, off, or auto = only a run of execution.AUTO_MIN_STEPS steps or more
    # that can repay the compile time, and only where a compiler exists (C++ on the CPU, Triton on CUDA); an unquoted
    # on/off means the word written
    compile: CompileSetting = "auto"
    # the attention kernel keeping each packed document to itself: auto (mask until a GPU check measures varlen ahead), mask (the
    # 4D document mask), varlen (FlashAttention's variable-length kernel) or flex (FlexAttention; no attention dropout)
    # (bertpipe/infra/attention.py)
    attention: AttentionSetting = "auto"

    # ---- evaluation, checkpoints
    eval_every: int = Field(200, ge=1)
    save_every: int = Field(200, ge=1)
    log_every: int = Field(10, ge=1)
    early_stop_patience: int = Field(0, ge=0)  # evals without improvement before stopping; 0: off
    output: Literal["best", "last"] = "best"  # which checkpoint becomes model/
    fill_mask_samples: int = Field(5, ge=0, le=50)

    seed: int = 42
    # torch intra-op threads; 0: the machine's cores // the flow's auto workers, in every door (bertpipe.infra.cores)
    threads: int = Field(0, ge=0, le=1024)
    # processes (torchrun, one per device): auto = one per visible GPU (1 with none or one); a number: that many
    # (CPU: gloo). `bertpipe run`, the flow and `dvc repro` all start them (bertpipe/stages/pretrain/run.py)
    nproc: Annotated[int, Field(ge=1, le=1024)] | Literal["auto"] = "auto"

    @model_validator(mode="after")
    def _segments_fit_positions(self) -> "PretrainParams":
        # Only a from-scratch model (stage `base`) takes its position table from `arch`; a checkpoint's table is
        # known once it is loaded, and max_seq_len is clamped to it there (with a notice).
        if self.max_seq_len > self.arch.max_positions:
            raise ValueError(f"max_seq_len ({self.max_seq_len}) exceeds arch.max_positions "
                             f"({self.arch.max_positions}); lower max_seq_len or raise arch.max_positions")
        return self

    @model_validator(mode="after")
    def _rtd_has_no_pair_loss(self) -> "PretrainParams":
        if self.objective == "rtd" and self.pair_objective != "none":
            raise ValueError(f"pair_objective {self.pair_objective!r} needs objective mlm (RTD trains no pair head); "
                             "set pair_objective: none")
        return self

    @model_validator(mode="after")
    def _ratios_sum_to_one(self) -> "PretrainParams":
        total = self.mask_token_ratio + self.random_token_ratio + self.keep_ratio
        if abs(total - 1.0) > 1e-6:
            raise ValueError(
                f"mask_token_ratio + random_token_ratio + keep_ratio must sum to 1 (got {total:g})"
            )
        return self
