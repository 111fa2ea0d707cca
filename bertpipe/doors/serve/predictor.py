"""Which registered version a service answers with, and how it is loaded.

Inference itself is ``bertpipe.lib.inference.predictor.Predictor`` — the same code `bertpipe models predict` and the
registered pyfunc models use: the task's own long-text handling (head/tail truncation, sliding windows stitched back
for NER, doc-stride for QA), scores, and the torch / ONNX / int8 backends. This module adds only what serving needs
on top: a reference that may follow an alias, and a loaded version that knows its number and request fields.
"""

from __future__ import annotations

from dataclasses import dataclass

from bertpipe.infra.errors import BertpipeError
from bertpipe.lib.registered.files import REF
from bertpipe.lib.registered.files import resolve as resolve_registered


@dataclass(frozen=True)
class ModelRef:
    name: str
    alias: str | None = None  # followed: the service switches when it moves
    version: str | None = None  # pinned

    @classmethod
    def parse(cls, ref: str, default_alias: str = "champion") -> "ModelRef":
        m = REF.match(ref.strip().removeprefix("models:/"))
        if not m:
            raise BertpipeError(f"model {ref!r}: expected NAME, NAME@alias or NAME/version")
        return cls(m["name"], m["alias"] or (None if m["version"] else default_alias), m["version"])

    def __str__(self) -> str:
        return self.name + (f"@{self.alias}" if self.alias else f"/{self.version}")


def resolve_version(client, ref: ModelRef) -> str:
    """The version ``ref`` points at now (an alias moves; a version number does not)."""
    return str(resolve_registered(client, str(ref)).version)


def input_kind(task_type: str) -> str:
    """Which request fields a task takes: ``text``, or ``question`` + ``context`` for QA."""
    return "qa" if task_type == "qa" else "text"


class Served:
    """One loaded version: ``predict(rows)`` -> one dict per row (``entities`` for NER)."""

    def __init__(self, cfg, name: str, version: str, backend: str, batch_size: int, device: str = "cpu"):
        from bertpipe.lib.inference.predictor import Predictor
        from bertpipe.lib.registered.files import local_version

        lv = local_version(cfg, f"{name}/{version}")  # downloaded once per version, cached under paths.state
        self.name, self.version = name, str(version)
        self.predictor = Predictor.from_dir(lv.model_dir, lv.files_dir, backend=backend, batch_size=batch_size,
                                            device=device)
        self.task = self.predictor.type

    def predict(self, rows: list[dict]) -> list[dict]:
        out = self.predictor.predict(rows)
        return [{"entities": o} for o in out] if self.task == "ner" else out
