"""The start record: where domain pretraining began, as the vocab stage stamps it into its model's config (under
``KEY``) and as reports name it. The start stage decides it (``bertpipe.lib.lineage`` holds the rule); the vocab stage,
the lineage rule and register's tags read it."""

from __future__ import annotations

from pathlib import Path

KEY = "bertpipe_lineage"  # the model config key holding {"corpus", "start"}: where domain pretraining began


def describe(rec: dict | None, model: Path | str) -> str:
    """How reports name the start (``model``: the encoder dir the vocab stage extends)."""
    kind = (rec or {}).get("kind", "base")
    if kind == "champion":
        return f"the champion encoder {rec['name']} v{rec['version']} ({model})"
    if kind == "path":
        return f"model.continue_from {model}"
    return f"the base encoder {model}"


def lineage_record(rec: dict | None) -> dict:
    """What the vocab stage stamps into its model's config under KEY (pretraining and MLflow logging keep it)."""
    rec = rec or {}
    return {"corpus": rec.get("corpus"), "start": rec.get("start") or {"kind": "base"}}
