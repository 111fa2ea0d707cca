"""A registered model version as something that answers a batch of requests.

One class serves every task: the transformers-flavor versions (classification, NER) load as a transformers pipeline,
which already knows batching, truncation and — for NER — sliding windows with stride and entity aggregation from word
pieces; any other version (e.g. a pyfunc QA model) goes through ``mlflow.pyfunc``. The service (`app.py`) and its
tests see only ``Predictor.predict(rows) -> list[dict]``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from bertpipe.errors import BertpipeError

# "NAME", "NAME@alias" or "NAME/3" (MLflow's own models:/ URI forms, without the prefix).
_REF = re.compile(r"^(?P<name>[A-Za-z0-9_.\-]+)(?:@(?P<alias>[A-Za-z0-9_\-]+)|/(?P<version>\d+))?$")


@dataclass(frozen=True)
class ModelRef:
    name: str
    alias: str | None = None
    version: str | None = None

    @classmethod
    def parse(cls, ref: str, default_alias: str = "champion") -> "ModelRef":
        m = _REF.match(ref.strip().removeprefix("models:/"))
        if not m:
            raise BertpipeError(f"model {ref!r}: expected NAME, NAME@alias or NAME/version")
        alias = m["alias"] or (None if m["version"] else default_alias)
        return cls(m["name"], alias, m["version"])

    def __str__(self) -> str:
        return self.name + (f"@{self.alias}" if self.alias else f"/{self.version}")


def resolve_version(client, ref: ModelRef) -> str:
    """The version ``ref`` points at now (an alias moves; a version number does not)."""
    try:
        if ref.version:
            return str(client.get_model_version(ref.name, ref.version).version)
        return str(client.get_model_version_by_alias(ref.name, ref.alias).version)
    except Exception:  # MlflowException: no such model/alias/version
        raise BertpipeError(f"model {ref}: not in the registry (bertpipe models list shows what is)") from None


def input_kind(task: str) -> str:
    """Which request fields a task takes: ``text`` or ``question``+``context``."""
    return "qa" if task == "question-answering" else "text"


class Predictor:
    """One loaded version. ``predict`` takes validated rows ({"text"} or {"question","context"})."""

    def __init__(self, name: str, version: str, tracking_uri: str):
        import mlflow

        self.name, self.version = name, str(version)
        uri = f"models:/{name}/{version}"
        mlflow.set_tracking_uri(tracking_uri)
        mlflow.set_registry_uri(tracking_uri)
        info = mlflow.models.get_model_info(uri)
        self.pipe: Any = None
        self.pyfunc: Any = None
        if "transformers" in (info.flavors or {}):
            self.pipe = mlflow.transformers.load_model(uri)
            self.task = self.pipe.task
            self._fit_lengths()
        else:
            self.pyfunc = mlflow.pyfunc.load_model(uri)
            meta = (info.metadata or {}) if hasattr(info, "metadata") else {}
            self.task = (meta or {}).get("bertpipe_task", "question-answering")

    def _fit_lengths(self) -> None:
        # The pipeline windows/truncates at tokenizer.model_max_length, which a saved tokenizer often leaves at a
        # huge sentinel; the model's position table is the real limit.
        from bertpipe.modelinfo import position_limit

        limit = position_limit(self.pipe.model)
        if limit:
            self.pipe.tokenizer.model_max_length = limit
        self.max_len = limit or 512

    def predict(self, rows: list[dict]) -> list[dict]:
        if not rows:
            return []
        if self.pipe is None:
            out = self.pyfunc.predict(rows)
            return [dict(o) if isinstance(o, dict) else {"prediction": o} for o in _records(out)]
        texts = [r["text"] for r in rows]
        if self.task == "token-classification":
            stride = max(1, self.max_len // 4)
            res = self.pipe(texts, batch_size=len(texts), aggregation_strategy="simple", stride=stride)
            if texts and isinstance(res, list) and (not res or isinstance(res[0], dict)) and len(texts) == 1:
                res = [res]
            return [{"entities": [_entity(t, e) for e in ents]} for t, ents in zip(texts, res)]
        if self.task == "text-classification":
            res = self.pipe(texts, batch_size=len(texts), truncation=True, max_length=self.max_len)
            return [{"label": r["label"], "score": float(r["score"])} for r in res]
        raise BertpipeError(f"model {self.name} v{self.version}: task {self.task!r} cannot be served")


def _entity(text: str, e: dict) -> dict:
    a, b = int(e["start"]), int(e["end"])
    return {"text": text[a:b], "label": e.get("entity_group") or e.get("entity"), "start": a, "end": b,
            "score": float(e["score"])}


def _records(out) -> list:
    if hasattr(out, "to_dict"):  # a pandas DataFrame
        return out.to_dict(orient="records")
    return list(out)
