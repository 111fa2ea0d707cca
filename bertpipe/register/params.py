from pydantic import BaseModel, ConfigDict


class RegisterParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
