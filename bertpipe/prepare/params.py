from pydantic import BaseModel, ConfigDict


class PrepareParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
