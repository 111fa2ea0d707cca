from pydantic import BaseModel, ConfigDict, Field


class RegisterParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    # Registered model names are "<prefix>-<task>" for each finetuned task and "<prefix>-encoder" for the encoder.
    prefix: str = Field("bertpipe", min_length=1, pattern=r"^[A-Za-z0-9_.-]+$")
    # A challenger becomes champion only if its primary test metric beats the champion's by at least this much.
    min_delta: float = Field(0.0, ge=0.0, le=1.0)
    register_encoder: bool = True
    # pip requirements written with each logged model (explicit, so serving does not depend on inference).
    pip_requirements: list[str] = Field(
        default_factory=lambda: ["torch>=2.3,<3", "transformers>=5,<6", "tokenizers>=0.21"]
    )
