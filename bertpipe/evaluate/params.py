"""Params of the evaluate stage: which split the comparison reads, and the held-out MLM perplexity."""

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class EvaluateParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    split: Literal["test", "dev"] = "test"  # the finetune split the base-vs-adapted table compares
    perplexity: bool = True  # held-out MLM perplexity of both encoders on the domain valid split
    mlm_max_texts: int = Field(2000, ge=0)  # 0: the whole valid split
    mlm_max_seq_len: int = Field(256, ge=8, le=8192)
    mlm_mask_prob: float = Field(0.15, gt=0.0, lt=1.0)
    mlm_batch_size: int = Field(16, ge=1, le=4096)
    mlm_seed: int = 0
    num_threads: int = Field(0, ge=0, le=1024)  # torch intra-op threads; 0 leaves torch's default
