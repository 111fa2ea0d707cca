"""The register stage."""
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field


class RegisterParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # Registered model names are "<prefix>-<task>" for each finetuned task and "<prefix>-encoder" for the encoder.
    prefix: str = Field("bertpipe", min_length=1, pattern=r"^[A-Za-z0-9_.-]+$")
    # A challenger becomes champion only if its primary test metric beats the champion's (on the same test set) by
    # more than this much; a tie never promotes, also with 0.
    min_delta: float = Field(0.0, ge=0.0, le=1.0)
    # ... and beats the task's floor by more than floor_margin: a baseline from work/evaluate/metrics.json
    # (majority class; tfidf = the trained simple baseline, the train-lexicon one for NER), or none. The encoder's
    # floor is the base encoder's gate score (any value but none).
    floor: Literal["majority", "tfidf", "none"] = "majority"
    floor_margin: float = Field(0.0, ge=0.0, le=1.0)
    # Also require the paired bootstrap interval of (challenger - champion) on the same test examples to exclude 0.
    require_ci: bool = False
    ci_samples: int = Field(1000, ge=100, le=100_000)
    ci_seed: int = 0
    register_encoder: bool = True
    # pip requirements written with each logged model (explicit, so serving does not depend on inference).
    pip_requirements: list[str] = Field(
        default_factory=lambda: ["torch>=2.3,<3", "transformers>=5,<6", "tokenizers>=0.21"]
    )
