"""Where domain pretraining starts, as a file: ``work/start/start.json``, written by the ``start`` stage.

The graph reads it like any other input (the vocab stage's ``start``, ``model`` and ``tokenizer`` inputs), so walking
the graph (`bertpipe stages`, dvc.yaml, every Prefect cache key) asks nothing of the MLflow registry; only the start
stage's run does (``bertpipe.start.stage``), once per run. The file::

    {"kind": "base" | "champion" | "path",
     "model": the encoder to extend (null for "base": the graph's base model, which may be a stage's output),
     "name", "version": the registered encoder version (champion), "model_digest": its exported files' digest,
     "corpus": the prepare fingerprint the decision was made for,
     "start": the record vocab stamps into the model's config (bertpipe_lineage.start)}

It holds no time stamps: the same decision is the same bytes, so rewriting it leaves vocab fresh.
"""

from __future__ import annotations

import json
from pathlib import Path

KEY = "bertpipe_lineage"  # the model config key holding {"corpus", "start"} (see bertpipe.lineage)
START_JSON = "start.json"


def start_dir(cfg) -> Path:
    return cfg.work / "start"


def start_file(cfg) -> Path:
    return start_dir(cfg) / START_JSON


def read_start(path: Path | str) -> dict | None:
    """The decision in a start.json, or None when there is none (yet) or it is not one."""
    try:
        rec = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return rec if isinstance(rec, dict) and rec.get("kind") in ("base", "champion", "path") else None


def encoder_paths(rec: dict | None, base_model, base_tokenizer) -> tuple[Path | str, Path | str]:
    """(model, tokenizer) the vocab stage extends: the base's (also while nothing is decided yet), or the decided
    dir (a registered version's export, or model.continue_from)."""
    if rec is None or rec["kind"] == "base" or not rec.get("model"):
        return base_model, base_tokenizer
    return Path(rec["model"]), Path(rec["model"])


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
