"""Whether the registry still holds what the register stage's output says it registered.

``registry.json`` names model versions that live in the tracking store, not in the output directory: deleting
``.bertpipe/mlflow.db``, pointing ``paths.state`` or the tracking URI at a new store, or deleting a model leaves the
output's fingerprint intact while the versions are gone. ``missing`` (the register Stage's ``lost``) says so, and
the stage is stale until it registers them again. A tracking server is asked only by a run: `bertpipe stages`
contacts nothing (``tracking.files_only``), so it reads a local sqlite store and leaves a server's answer to the run.
"""

from __future__ import annotations

import json
from pathlib import Path


def missing(cfg, out: Path) -> str | None:
    """Why the versions ``out/registry.json`` names are not in the project's registry, or None when they all are
    (with the content fingerprint recorded for them) or nothing is recorded. Never creates a store."""
    try:
        data = json.loads((out / "registry.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None  # no record (the fingerprint decides) or a torn one (its manifest is missing too)
    models = [m for m in data.get("models") or [] if m.get("registered", True) and m.get("version")]
    if not models:
        return None
    from bertpipe.infra.tracking import (client, display_uri, server_off_limits, store_file, tracking_uri,
                                         unreachable_line)
    from bertpipe.lib.registered.champion import FINGERPRINT_TAG

    uri = tracking_uri(cfg)
    if server_off_limits(uri):
        return None  # the run asks; the fingerprint decides here
    db = store_file(uri)
    if db is not None and not db.is_file():
        return f"the registry {display_uri(uri)} does not exist (it holds none of the versions registry.json names)"
    c = client(cfg, create=False)
    for m in models:
        try:
            mv = c.get_model_version(m["name"], str(m["version"]))
        except Exception as e:  # noqa: BLE001 (MLflow raises its one exception type for every failure)
            if unreachable_line(e) is not None:  # cannot tell: the output stands, the register run would fail
                return None
            mv = None  # RESOURCE_DOES_NOT_EXIST: the model or version is gone
        if mv is None:
            return f"{m['name']} v{m['version']} is not in the registry {display_uri(uri)}"
        if m.get("fingerprint") and (mv.tags or {}).get(FINGERPRINT_TAG) != m["fingerprint"]:
            return f"{m['name']} v{m['version']} in the registry {display_uri(uri)} holds other content"
    return None
