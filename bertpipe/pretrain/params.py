from pydantic import BaseModel, ConfigDict


class PretrainParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
