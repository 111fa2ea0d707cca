from pydantic import BaseModel, ConfigDict


class EvaluateParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
