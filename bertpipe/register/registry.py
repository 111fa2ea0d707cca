"""Champion/challenger bookkeeping on the MLflow model registry, shared by the register stage and `bertpipe models`.

Aliases carry the state: the newest registered version is ``challenger``; ``champion`` moves only when a challenger's
primary test metric beats the champion's by at least ``min_delta`` (higher is better for every primary metric we use:
accuracy, macro-F1, entity F1, EM/F1). The registered model's tag ``bertpipe.champion_history`` lists the versions
that have held ``champion``, oldest first, so ``rollback`` can restore the previous one.
"""

from __future__ import annotations

from dataclasses import dataclass

from bertpipe.errors import BertpipeError

CHAMPION = "champion"
CHALLENGER = "challenger"
HISTORY_TAG = "bertpipe.champion_history"


@dataclass
class Decision:
    promoted: bool
    reason: str
    champion_version: str | None
    champion_value: float | None


def _history(client, name: str) -> list[str]:
    rm = client.get_registered_model(name)
    raw = (rm.tags or {}).get(HISTORY_TAG, "")
    return [v for v in raw.split(",") if v]


def set_champion(client, name: str, version: str) -> None:
    client.set_registered_model_alias(name, CHAMPION, str(version))
    hist = _history(client, name)
    if not hist or hist[-1] != str(version):
        hist.append(str(version))
    client.set_registered_model_tag(name, HISTORY_TAG, ",".join(hist))


def current_champion(client, name: str):
    try:
        return client.get_model_version_by_alias(name, CHAMPION)
    except Exception:  # no such alias (MlflowException RESOURCE_DOES_NOT_EXIST)
        return None


def decide(client, name: str, version: str, metric: str, value: float, test_hash: str, min_delta: float,
           champion_value_on_same_test: float | None = None) -> Decision:
    """Give ``version`` the challenger alias and promote it if it beats the champion on the same test set."""
    client.set_registered_model_alias(name, CHALLENGER, str(version))
    champ = current_champion(client, name)
    if champ is None:
        set_champion(client, name, version)
        return Decision(True, "first registered version becomes champion", None, None)
    tags = champ.tags or {}
    if champion_value_on_same_test is not None:
        champ_value = champion_value_on_same_test
    elif tags.get("bertpipe.test_hash") == test_hash and "bertpipe.primary_value" in tags:
        champ_value = float(tags["bertpipe.primary_value"])
    else:
        champ_value = None
    if champ_value is None:
        reason = (f"champion v{champ.version} has no {metric} on this test set ({test_hash[:12]}); "
                  "kept champion, re-evaluate it to compare")
        return Decision(False, reason, champ.version, None)
    if value >= champ_value + min_delta:
        set_champion(client, name, version)
        return Decision(True, f"{metric} {value:.4f} >= champion v{champ.version} {champ_value:.4f} + min_delta "
                              f"{min_delta}", champ.version, champ_value)
    return Decision(False, f"{metric} {value:.4f} < champion v{champ.version} {champ_value:.4f} + min_delta "
                           f"{min_delta}; champion kept", champ.version, champ_value)


def promote(client, name: str, version: str) -> None:
    try:
        client.get_model_version(name, str(version))
    except Exception:
        raise BertpipeError(f"model {name!r} has no version {version}") from None
    set_champion(client, name, str(version))


def rollback(client, name: str) -> str:
    """Give ``champion`` back to the version that held it before the current one; returns that version."""
    hist = _history(client, name)
    champ = current_champion(client, name)
    if champ is not None and hist and hist[-1] != str(champ.version):
        hist.append(str(champ.version))
    if len(hist) < 2:
        raise BertpipeError(f"model {name!r}: no earlier champion to roll back to (history: {hist or 'empty'})")
    hist.pop()
    previous = hist[-1]
    client.set_registered_model_alias(name, CHAMPION, previous)
    client.set_registered_model_tag(name, HISTORY_TAG, ",".join(hist))
    return previous


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
        client.get_registered_model(name)
    except Exception:
        raise BertpipeError(f"no registered model named {name!r}") from None
    rm = client.get_registered_model(name)
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


def export_model(cfg, name: str, alias: str = CHAMPION, version: str | None = None):
    """A registered version (``name@alias``, or ``version`` when given) as a plain save_pretrained dir (model +
    tokenizer) under paths.state/exported, or None when it does not exist. Cached by version: exporting the same
    version twice reads nothing."""
    import os
    import shutil

    from bertpipe.tracking import client, fluent_mlflow

    c = client(cfg)
    try:
        mv = c.get_model_version(name, version) if version else c.get_model_version_by_alias(name, alias)
    except Exception:
        return None
    dest = cfg.state / "exported" / f"{name}-v{mv.version}"
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
