"""Where domain pretraining starts, as a file: ``work/start/start.json``, written by the ``start`` stage.

Its location and reader are in ``bertpipe.layout`` (``start_file``, ``read_start``): the graph reads it like any
other input (the vocab stage's ``start``, ``model`` and ``tokenizer`` inputs), so walking the graph (`bertpipe stages`, dvc.yaml, every Prefect cache key) asks nothing of the MLflow registry; only the start
stage's run does (``bertpipe.start.stage``), once per run. The file::

    {"kind": "base" | "champion" | "path",
     "model": the encoder to extend (null for "base": the graph's base model, which may be a stage's output),
     "name", "version": the registered encoder version (champion), "model_digest": its exported files' digest,
     "corpus": the prepare fingerprint the decision was made for,
     "start": the record vocab stamps into the model's config (bertpipe_lineage.start)}

It holds no time stamps: the same decision is the same bytes, so rewriting it leaves vocab fresh.
"""

from __future__ import annotations

from pathlib import Path

KEY = "bertpipe_lineage"  # the model config key holding {"corpus", "start"} (see bertpipe.lineage)


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
