"""Registered versions as save_pretrained dirs again, cached under ``paths.state/exported`` by their identity
(``version_key``): the register gate re-scores a champion with ``export_model``, and the start stage continues
pretraining from the champion encoder."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
from pathlib import Path

from bertpipe.lib.registered.champion import CHAMPION, get_version

EXPORTED = "exported"  # under paths.state


def version_key(mv) -> str:
    """What identifies a model version's content beyond its name and number: the run that logged it, its source and
    when it was created. A model deleted and registered again starts at v1 again, with another key."""
    ident = "\n".join(str(getattr(mv, k, "") or "") for k in ("name", "version", "run_id", "source",
                                                                "creation_timestamp"))
    return hashlib.sha256(ident.encode()).hexdigest()[:12]


def cache_dir(cfg, mv, suffix: str = "") -> Path:
    """``paths.state/exported/<name>-v<N>-<version_key><suffix>``; the same version's cache dirs under other keys
    (a deleted model's) are removed, best effort."""
    root = cfg.state / EXPORTED
    dest = root / f"{mv.name}-v{mv.version}-{version_key(mv)}{suffix}"
    same = re.compile(rf"{re.escape(f'{mv.name}-v{mv.version}')}(-[0-9a-f]{{12}})?{re.escape(suffix)}")
    if root.is_dir():
        for old in root.iterdir():
            if old != dest and same.fullmatch(old.name):
                shutil.rmtree(old, ignore_errors=True)
    return dest


def export_model(cfg, name: str, alias: str = CHAMPION, version: str | None = None):
    """A registered version (``name@alias``, or ``version``) as a plain save_pretrained dir (model + tokenizer)
    under paths.state/exported, or None when it does not exist. Cached by the version's identity (``version_key``):
    exporting one twice reads nothing."""
    from bertpipe.infra.tracking import client, fluent_mlflow

    c = client(cfg)
    mv = get_version(c, name, version) if version is not None else None
    if version is None:
        try:
            mv = c.get_model_version_by_alias(name, alias)
        except Exception:
            return None
    if mv is None:
        return None
    dest = cache_dir(cfg, mv)
    if (dest / "config.json").exists():
        return dest
    tmp = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    with fluent_mlflow(cfg) as mlflow:
        pipe = mlflow.transformers.load_model(f"models:/{name}/{mv.version}")
    pipe.model.save_pretrained(str(tmp))
    pipe.tokenizer.save_pretrained(str(tmp))
    if dest.exists():
        shutil.rmtree(dest)
    os.replace(tmp, dest)
    return dest
