"""Params of the evaluate stage: the split the comparison reads, the fair encoder comparison, the bootstrap."""

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class EvaluateParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    split: Literal["test", "dev"] = "test"  # the finetune split the base-vs-adapted table compares
    baselines: bool = True  # majority / TF-IDF / lexicon baselines trained on each task's train split
    encoder_comparison: bool = True  # NLL per masked character of both encoders on the domain test split
    mlm_max_texts: int = Field(2000, ge=0)  # texts of the domain test split scored; 0: all
    mlm_max_seq_len: int = Field(256, ge=8, le=8192)  # clamped to each encoder's positions; sets the window length
    mlm_mask_prob: float = Field(0.15, gt=0.0, lt=1.0)  # fraction of each window's words masked
    mlm_batch_size: int = Field(16, ge=1, le=4096)
    mlm_seed: int = 0  # fixes the masked words
    bootstrap_samples: int = Field(1000, ge=0, le=100_000)  # 0: no intervals
    bootstrap_seed: int = 0
    # where the encoder comparison runs: auto (cuda when available), cpu, mps, cuda, cuda:N
    device: str = Field("auto", pattern=r"^(auto|cpu|mps|cuda(:\d+)?)$")
    num_threads: int = Field(0, ge=0, le=1024)  # torch intra-op threads; 0: bertpipe.infra.cores's share, every door
