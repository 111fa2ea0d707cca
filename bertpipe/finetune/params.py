from pydantic import BaseModel, ConfigDict, Field


class TrainParams(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TaskParams(BaseModel):
    model_config = ConfigDict(extra="forbid")


class FinetuneParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
    encoders: list[str] = Field(default_factory=lambda: ["base", "adapted"])
    train: TrainParams = Field(default_factory=TrainParams)
    tasks: dict[str, TaskParams] = Field(default_factory=dict)
