from pydantic import BaseModel, ConfigDict


class VocabParams(BaseModel):
    model_config = ConfigDict(extra="forbid")
