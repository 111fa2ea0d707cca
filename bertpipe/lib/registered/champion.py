"""Champion/challenger bookkeeping on the MLflow model registry, shared by the register stage and `bertpipe models`.

Aliases carry the state: ``challenger`` is the newest candidate the gate looked at; ``champion`` moves only through
the gate (register stage) or an explicit ``promote``/``rollback``. The registered model's tag
``bertpipe.champion_history`` lists the versions that have held ``champion``, oldest first, so ``rollback`` can
restore the previous one. Every read-modify-write of aliases and history happens under ``registry_lock``.
"""

from __future__ import annotations

import contextlib
import hashlib
import tempfile
from pathlib import Path
from typing import Iterator
from urllib.parse import unquote

from bertpipe.core.stage import output_lock
from bertpipe.infra.errors import BertpipeError

CHAMPION = "champion"
CHALLENGER = "challenger"
HISTORY_TAG = "bertpipe.champion_history"
FINGERPRINT_TAG = "bertpipe.fingerprint"
ROLLED_BACK_TAG = "bertpipe.rolled_back"
DEGENERATE_TAG = "bertpipe.degenerate"  # "true": the model learned nothing (register records it per task model)
# Set on the MLflow run before it logs and registers ``<name>``: every version that run creates is tied to the
# content fingerprint from the moment it exists (see ``claim`` / ``find_unfinished``).
CLAIM_TAG_PREFIX = "bertpipe.registering."


def _lock_target(client) -> Path:
    uri = str(getattr(client, "_registry_uri", "") or "")
    if uri.startswith("sqlite:"):
        db = Path(unquote(uri[len("sqlite:///"):].split("?", 1)[0]))
        return db.with_name(db.name + ".registry")
    # A server: the lock serialises writers on this machine only. MLflow's registry has no compare-and-set, so two
    # machines promoting the same model at the same moment can still interleave their history updates.
    return Path(tempfile.gettempdir()) / f"bertpipe-registry-{hashlib.sha256(uri.encode()).hexdigest()[:16]}"


@contextlib.contextmanager
def registry_lock(client) -> Iterator[None]:
    """Exclusive lock on the registry's aliases and history, across processes and threads (each holder opens its
    own file description). Not re-entrant: functions called while holding it are the ``_locked`` ones."""
    with output_lock(_lock_target(client)):
        yield


def history(client, name: str) -> list[str]:
    rm = client.get_registered_model(name)
    raw = (rm.tags or {}).get(HISTORY_TAG, "")
    return [v for v in raw.split(",") if v]


def set_champion_locked(client, name: str, version: str) -> None:
    """Move ``champion`` to ``version`` and append it to the history; the caller holds ``registry_lock``."""
    client.set_registered_model_alias(name, CHAMPION, str(version))
    hist = history(client, name)
    if not hist or hist[-1] != str(version):
        hist.append(str(version))
    client.set_registered_model_tag(name, HISTORY_TAG, ",".join(hist))


def current_champion(client, name: str):
    try:
        return client.get_model_version_by_alias(name, CHAMPION)
    except Exception:  # no such alias or model (MlflowException RESOURCE_DOES_NOT_EXIST)
        return None


def get_version(client, name: str, version: str):
    """The model version, or None when it does not exist (never registered, or deleted)."""
    try:
        return client.get_model_version(name, str(version))
    except Exception:
        return None


def find_by_fingerprint(client, name: str, fingerprint: str):
    """The oldest version of ``name`` whose content fingerprint tag is ``fingerprint``, or None."""
    try:
        client.get_registered_model(name)
    except Exception:
        return None
    hits = [v for v in client.search_model_versions(f"name='{name}'")
            if (v.tags or {}).get(FINGERPRINT_TAG) == fingerprint]
    return min(hits, key=lambda v: int(v.version)) if hits else None


def claim(client, run_id: str, name: str, fingerprint: str) -> None:
    """Record on ``run_id`` that it is about to register ``name`` with content ``fingerprint``. MLflow creates the
    version inside ``log_model`` and bertpipe can tag it only afterwards; a kill in between leaves a version with no
    fingerprint tag. Because the claim is written first, such a version is still recognisable by its run."""
    client.set_tag(run_id, CLAIM_TAG_PREFIX + name, fingerprint)


def find_unfinished(client, name: str, fingerprint: str):
    """The oldest version of ``name`` without a fingerprint tag that a run claimed for ``fingerprint`` (a register
    run killed between creating the version and tagging it), or None. The caller finishes it instead of
    registering the same content again."""
    try:
        client.get_registered_model(name)
    except Exception:
        return None
    claimed: dict[str, bool] = {}
    for v in sorted(client.search_model_versions(f"name='{name}'"), key=lambda v: int(v.version)):
        if FINGERPRINT_TAG in (v.tags or {}) or not v.run_id:
            continue
        if v.run_id not in claimed:
            try:
                tags = client.get_run(v.run_id).data.tags
            except Exception:  # the run was deleted: nothing ties this version to any content
                tags = {}
            claimed[v.run_id] = tags.get(CLAIM_TAG_PREFIX + name) == fingerprint
        if claimed[v.run_id]:
            return v
    return None


def promote(client, name: str, version: str, force: bool = False) -> None:
    """Make ``version`` the champion. A degenerate version (it learned nothing, so register never crowns it) only
    with ``force``."""
    if not str(version).isdigit():
        raise BertpipeError(f"model {name!r}: version must be a number (got {version!r})")
    with registry_lock(client):
        mv = get_version(client, name, version)
        if mv is None:
            raise BertpipeError(f"model {name!r} has no version {version} (never registered or deleted)")
        if (mv.tags or {}).get(DEGENERATE_TAG) == "true" and not force:
            raise BertpipeError(f"model {name!r} v{version} is degenerate (it learned nothing: one class, or no better "
                                f"than the majority baseline on dev), so it is never champion; --force promotes it")
        set_champion_locked(client, name, str(version))


def rollback(client, name: str) -> str:
    """Give ``champion`` back to the version that held it before the current one; returns that version."""
    with registry_lock(client):
        try:
            hist = history(client, name)
        except Exception:
            raise BertpipeError(f"no registered model named {name!r}") from None
        champ = current_champion(client, name)
        if champ is not None and hist and hist[-1] != str(champ.version):
            hist.append(str(champ.version))
        if len(hist) < 2:
            raise BertpipeError(f"model {name!r}: no earlier champion to roll back to (history: {hist or 'empty'})")
        hist.pop()
        previous = hist[-1]
        if get_version(client, name, previous) is None:
            raise BertpipeError(f"model {name!r}: the previous champion v{previous} no longer exists (deleted); "
                                f"choose one with `bertpipe models promote {name} VERSION`")
        client.set_registered_model_alias(name, CHAMPION, previous)
        client.set_registered_model_tag(name, HISTORY_TAG, ",".join(hist))
        if champ is not None:  # so a later register run with the same content does not crown it again
            client.set_model_version_tag(name, str(champ.version), ROLLED_BACK_TAG, f"rolled back to v{previous}")
        return previous


def was_champion(client, name: str, version: str) -> bool:
    """Whether ``version`` held champion and lost it (a rollback, or a later champion)."""
    mv = get_version(client, name, version)
    return mv is not None and (ROLLED_BACK_TAG in (mv.tags or {}) or str(version) in history(client, name))


def describe_models(client, prefix: str | None = None) -> list[dict]:
    out = []
    for rm in client.search_registered_models():
        if prefix and not rm.name.startswith(prefix):
            continue
        aliases = dict(rm.aliases or {})
        latest = max((int(v.version) for v in client.search_model_versions(f"name='{rm.name}'")), default=0)
        out.append({"name": rm.name, "latest": latest, "aliases": aliases})
    return sorted(out, key=lambda d: d["name"])


def describe_versions(client, name: str) -> list[dict]:
    try:
        rm = client.get_registered_model(name)
    except Exception:
        raise BertpipeError(f"no registered model named {name!r}") from None
    by_version: dict[str, list[str]] = {}
    for alias, v in (rm.aliases or {}).items():
        by_version.setdefault(str(v), []).append(alias)
    rows = []
    for v in sorted(client.search_model_versions(f"name='{name}'"), key=lambda v: int(v.version)):
        tags = v.tags or {}
        rows.append({
            "version": str(v.version),
            "aliases": sorted(by_version.get(str(v.version), [])),
            "metric": tags.get("bertpipe.primary_metric", ""),
            "value": tags.get("bertpipe.primary_value", ""),
            "decision": tags.get("bertpipe.decision", ""),
            "run_id": v.run_id,
        })
    return rows
