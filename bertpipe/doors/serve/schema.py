"""The service's request and response types, and the one decoder every `/predict` body goes through.

The same pydantic models are (1) what the ``Guard`` middleware decodes each body with before it is queued, (2) the
types LitServe hands FastAPI, so `/openapi.json` and `/docs` show the fields and examples, and (3) what the inference
worker receives. pydantic's JSON parser is strict where ``json.loads`` is not: a lone surrogate escape
(``"\\ud800"``) is invalid JSON there (``json.loads`` accepts it and the tokenizer raised later, failing the whole
batch), and nesting past its recursion limit is an ordinary parse error (``json.loads`` raised RecursionError -> 500).

A request carries one example or a list (``"text": ["a", "b"]``; QA: ``"question"`` and ``"context"`` lists of
equal length); a list gets ``{"model", "version", "predictions": [...]}`` back, one prediction per item, in order.
"""

from __future__ import annotations

import re
from typing import Annotated, Union

from pydantic import (BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, WithJsonSchema, field_validator,
                      model_validator)
from pydantic_core import PydanticCustomError

# A text must hold one character outside this class: blank texts, and texts of only control, zero-width or other
# invisible format characters (which the tokenizer drops, leaving nothing to predict on), are refused. The class is
# spelled the same in Python's and ECMAScript's regex syntax, so the schema's ``pattern`` and the validator are one
# rule: JSON Schema clients (and schemathesis) see exactly what the service enforces.
NONBLANK = (r"[^\x00-\x20\x7f-\xa0\xad\u1680\u180e\u2000-\u200f\u2028-\u202f\u205f-\u2064\u2066-\u206f\u3000"
            r"\ufeff]")
_NONBLANK = re.compile(NONBLANK)
TEXT_SCHEMA = {"type": "string", "minLength": 1, "pattern": NONBLANK}
Text = Annotated[str, WithJsonSchema(TEXT_SCHEMA)]
Texts = Union[Text, Annotated[list[str], WithJsonSchema({"type": "array", "items": TEXT_SCHEMA, "minItems": 1})]]


def _check_text(name: str, v, info: ValidationInfo):
    """Empty and too-long texts (and lists) are refused; the limits come from serve params via the context (FastAPI's
    own re-validation of an already-checked body passes none, and then only the type is checked)."""
    ctx = info.context or {}
    items = [v] if isinstance(v, str) else v
    if isinstance(v, list):
        if not v:
            raise PydanticCustomError("empty", f'"{name}" is an empty list')
        if ctx.get("max_items") and len(v) > ctx["max_items"]:
            raise PydanticCustomError("too_long", f'"{name}" has {len(v)} items; the limit is {ctx["max_items"]}')
    for i, s in enumerate(items):
        where = f'"{name}"' + (f"[{i}]" if isinstance(v, list) else "")
        if not _NONBLANK.search(s):
            raise PydanticCustomError("empty", f"{where} is empty (blank, control or zero-width characters only)")
        if ctx.get("max_chars") and len(s) > ctx["max_chars"]:
            raise PydanticCustomError("too_long", f"{where} has {len(s)} characters; the limit is {ctx['max_chars']}")
    return v


class TextRequest(BaseModel):
    """Classification and NER: one text, or a list of texts."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [
        {"text": "这个产品质量很好，物流也快。"}, {"text": ["很好", "太差了"]}]})
    text: Texts = Field(description="a text, or a list of texts (answered in order under `predictions`)")

    @field_validator("text")
    @classmethod
    def _text(cls, v, info: ValidationInfo):
        return _check_text("text", v, info)

    def records(self) -> list[dict]:
        return [{"text": t} for t in ([self.text] if isinstance(self.text, str) else self.text)]

    @property
    def many(self) -> bool:
        return isinstance(self.text, list)


class QARequest(BaseModel):
    """Extractive QA: a question and its context, or two lists of equal length."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"examples": [
        {"question": "李四住在哪里？", "context": "李四住在上海。"}]})
    question: Texts
    context: Texts

    @field_validator("question", "context")
    @classmethod
    def _texts(cls, v, info: ValidationInfo):
        return _check_text(info.field_name, v, info)

    @model_validator(mode="after")
    def _same_shape(self):
        if isinstance(self.question, list) != isinstance(self.context, list) or (
                isinstance(self.question, list) and len(self.question) != len(self.context)):
            raise PydanticCustomError("shape", '"question" and "context" must both be strings or lists of one length')
        return self

    def records(self) -> list[dict]:
        if isinstance(self.question, str):
            return [{"question": self.question, "context": self.context}]
        return [{"question": q, "context": c} for q, c in zip(self.question, self.context)]

    @property
    def many(self) -> bool:
        return isinstance(self.question, list)


class Label(BaseModel):
    label: str = Field(examples=["pos"])
    score: float = Field(ge=0.0, le=1.0, examples=[0.91])


class Entity(BaseModel):
    text: str
    label: str
    start: int = Field(description="character offset into the text")
    end: int = Field(description="exclusive")
    score: float


class Entities(BaseModel):
    entities: list[Entity]


class Answer(BaseModel):
    answer: str
    score: float
    start: int = Field(description="character offset into the context; -1 when no answer was found")
    end: int


class _Named(BaseModel):
    model: str = Field(examples=["bertpipe-sentiment"])
    version: str = Field(examples=["3"], description="the registered version that produced this answer")


class LabelResponse(_Named, Label):
    pass


class EntitiesResponse(_Named, Entities):
    pass


class AnswerResponse(_Named, Answer):
    pass


class BatchResponse(_Named):
    predictions: list[Union[Label, Entities, Answer]]


class Failed(BaseModel):
    """A request the model failed on (its batch's other requests are answered); the Guard sends it with ``status``."""

    error: str
    status: int = 500


PredictResponse = Union[LabelResponse, EntitiesResponse, AnswerResponse, BatchResponse, Failed]
REQUEST = {"text": TextRequest, "qa": QARequest}
STATUS = {"too_long": 413}  # pydantic error type -> HTTP status; any other problem is 400 (syntax) or 422


def decode(body: bytes, kind: str, max_chars: int, max_items: int):
    """The request, or (status, one-line reason) for a bad body."""
    try:
        body.decode("utf-8")
    except UnicodeDecodeError as e:
        return 400, f"body is not UTF-8 (byte {e.start})"
    model = REQUEST[kind]
    try:
        return model.model_validate_json(body, context={"max_chars": max_chars, "max_items": max_items})
    except ValidationError as e:
        return _reason(e, model)


def _reason(e: ValidationError, model) -> tuple[int, str]:
    errs = e.errors(include_url=False)
    first = errs[0]
    if first["type"] == "json_invalid":
        return 400, "body is not JSON (" + first["msg"].removeprefix("Invalid JSON: ") + ")"
    if first["type"] == "model_type":
        return 422, 'expected a JSON object such as ' + ('{"text": "..."}' if model is TextRequest
                                                         else '{"question": "...", "context": "..."}')
    fields = list(model.model_fields)
    missing = [er["loc"][0] for er in errs if er["type"] == "missing"]
    extra = sorted(str(er["loc"][0]) for er in errs if er["type"] == "extra_forbidden")
    if missing or extra:
        want = ", ".join(f'"{f}"' for f in fields)
        return 422, f"expected field(s) {want}" + (f"; unknown: {', '.join(extra)}" if extra else "")
    if first["type"] in ("empty", "too_long", "shape"):
        return STATUS.get(first["type"], 422), first["msg"]
    return 422, f'"{first["loc"][0]}" must be a string or a list of strings'
