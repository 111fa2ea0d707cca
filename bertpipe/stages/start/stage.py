"""The ``start`` stage: decide where domain pretraining starts and write it to ``work/start/start.json``.

The decision depends on the MLflow registry (is there a champion encoder, what was it trained on), which no file
in the project holds, so it is the stage's *external* input (``Stage.external``): ``run_stage`` asks it on every
run and rebuilds the output when the answer differs from the one recorded, while ``bertpipe stages``, dvc.yaml and
the Prefect cache keys read only the file. An unreachable registry fails the run (``bertpipe.lib.lineage``).

DVC runs this stage on every `dvc repro` (``always_changed``: no file it could hash holds the registry in every copy
of the repo). So that a repro with nothing to do stays cheap, the decision is kept with a digest of the registry
(``_registry_stamp``: the embedded sqlite store's aliases and versions, read with the stdlib) and of the params it
depends on; while both and the corpus are unchanged the recorded decision stands and MLflow (seconds to import) is
not asked. With a tracking server there is no such shortcut: it is asked every run. When the registry moved but the
answer did not (a task model got a version), the digest is a memo (``Stage.external_memo``): start is not rebuilt,
its manifest records the new digest.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import sqlite3
from pathlib import Path

from bertpipe.lib.layout import START_JSON, start_dir
from bertpipe.lib.startrecord import describe
from bertpipe.stages.start.declare import KEPT_WITH, SECTIONS


def _corpus(cfg) -> str | None:
    try:
        return json.loads((cfg.work / "prepare" / "manifest.json").read_text())["fingerprint"]
    except (OSError, ValueError, KeyError):
        return None


def _registry_stamp(cfg) -> str | None:
    """A digest of the registry's aliases and model versions, read-only from the embedded sqlite store; None for a
    tracking server, or if the store does not read as expected (then MLflow is asked). With tracking off there is
    no registry: a constant, so the decision (the base, ``bertpipe.lib.lineage``) stands until tracking is on again."""
    from bertpipe.infra.tracking import OFF, tracking_off, tracking_uri

    if tracking_off(cfg):
        return f"tracking.uri: {OFF}"
    uri = tracking_uri(cfg)
    if not uri.startswith("sqlite:///"):
        return None
    db = Path(uri[len("sqlite:///"):])
    if not db.exists():
        return "no store"
    try:
        with contextlib.closing(sqlite3.connect(db.resolve().as_uri() + "?mode=ro", uri=True, timeout=30)) as con:
            rows = [con.execute("SELECT name, alias, version FROM registered_model_aliases "
                                "ORDER BY 1, 2, 3").fetchall(),
                    con.execute("SELECT name, version, status, last_updated_time FROM model_versions "
                                "ORDER BY 1, 2").fetchall()]
    except sqlite3.Error:
        return None
    return hashlib.sha256(json.dumps(rows, default=str).encode()).hexdigest()


def decide(cfg, corpus: str | None = None) -> dict:
    """The start.json record for this config and the registry as it is now (queries MLflow when the rule needs
    it; a registered version is exported once, under paths.state/exported), plus KEPT_WITH. ``corpus``: the
    prepare fingerprint, read from its manifest when not given."""
    from bertpipe.core.outputs import read_manifest

    corpus = corpus if corpus is not None else _corpus(cfg)
    kept = {"registry": _registry_stamp(cfg), "params": cfg.section_hash(*SECTIONS)}
    prev = (read_manifest(start_dir(cfg)) or {}).get("external")
    if (kept["registry"] is not None and isinstance(prev, dict) and prev.get("corpus") == corpus
            and all(prev.get(k) == v for k, v in kept.items())
            and (not prev.get("model") or Path(prev["model"]).exists())):
        return prev  # nothing the rule reads has changed: the decision stands, MLflow is not imported
    from bertpipe.core.stage import content_digest  # the hash cache: a 400 MB champion is read once, not every run
    from bertpipe.lib.lineage import resolve

    s = resolve(cfg, corpus)
    rec = {"kind": s.kind, "model": None if s.kind == "base" else str(s.model), "name": s.name,
           "version": s.version, "model_digest": content_digest(s.model, cfg)[:32] if s.kind == "champion" else None,
           "corpus": corpus, "start": s.record()}
    return {**rec, **kept}


def build(ctx) -> dict:
    rec = {k: v for k, v in ctx.external.items() if k not in KEPT_WITH}
    (ctx.out / START_JSON).write_text(json.dumps(rec, indent=2, sort_keys=True, ensure_ascii=False) + "\n",
                                      encoding="utf-8")
    ctx.log(f"pretraining starts from {describe(rec, rec['model'] or 'of model.base')}")
    return {}
