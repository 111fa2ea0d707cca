"""Facts about a model that stages must respect, read from its config without loading weights."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable

from bertpipe.infra.errors import BertpipeError

# Where a checkpoint maps transformers' Auto classes to code it ships (what trust_remote_code would import and run).
_AUTO_MAP_FILES = ("config.json", "tokenizer_config.json")


def position_limit(model: Path | str | object) -> int | None:
    """Longest sequence the model's position table allows (None when unknown).

    Accepts a save_pretrained dir, a hub id / dir string, a PretrainedConfig, or a model with ``.config``.
    RoBERTa-style models reserve ``pad_token_id + 1`` positions, so their usable length is smaller.
    """
    cfg = getattr(model, "config", model)
    if isinstance(cfg, (str, Path)):
        p = Path(cfg) / "config.json"
        if p.is_file():
            cfg = json.loads(p.read_text(encoding="utf-8"))
        else:
            try:
                from transformers import AutoConfig

                cfg = AutoConfig.from_pretrained(str(model)).to_dict()
            except (OSError, ValueError):
                return None
    get = cfg.get if isinstance(cfg, dict) else (lambda k, d=None: getattr(cfg, k, d))
    limit = get("max_position_embeddings")
    if not limit:
        return None
    if get("model_type") in ("roberta", "xlm-roberta", "camembert", "longformer") and get("pad_token_id") is not None:
        limit -= int(get("pad_token_id")) + 1
    return int(limit)


def clamp_seq_len(requested: int, model, key: str, log: Callable[[str], None] | None = None) -> int:
    """``requested`` clamped to the model's position table, with a notice naming the params key that asked for more."""
    limit = position_limit(model)
    if limit is not None and requested > limit:
        if log is not None:
            log(f"{key}={requested} exceeds the model's {limit} positions; using {limit}")
        return limit
    return requested


def _checkpoint_file(ref: Path | str, name: str) -> Path | None:
    """``name`` of a save_pretrained dir, or of a hub id from the local hub cache (never downloaded here)."""
    p = Path(ref) / name
    if p.is_file():
        return p
    if Path(ref).exists() or not isinstance(ref, str):
        return None
    try:
        from huggingface_hub import try_to_load_from_cache

        hit = try_to_load_from_cache(ref, name)
    except Exception:  # noqa: BLE001 - not a valid repo id: nothing cached under it
        return None
    return Path(hit) if isinstance(hit, str) else None


def remote_code_classes(ref: Path | str) -> list[str]:
    """The Auto classes ``ref`` maps to code of its own (``auto_map`` in its config.json or tokenizer_config.json);
    empty when it needs none (or its files are not at hand)."""
    out: set[str] = set()
    for name in _AUTO_MAP_FILES:
        f = _checkpoint_file(ref, name)
        if f is None:
            continue
        try:
            auto_map = json.loads(f.read_text(encoding="utf-8")).get("auto_map")
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(auto_map, dict):
            out.update(str(k) for k in auto_map)
        elif auto_map:
            out.add(str(auto_map))
    return sorted(out)


def refuse_remote_code(ref: Path | str, key: str) -> None:
    """A one-line error naming ``key`` when the checkpoint needs its own code: bertpipe never runs a checkpoint's
    code (no ``trust_remote_code``), and transformers would otherwise prompt for it and fail with a traceback."""
    classes = remote_code_classes(ref)
    if classes:
        raise BertpipeError(f"{key}: {ref}: this checkpoint needs code of its own ({', '.join(classes)} in its "
                            "auto_map), and remote code is not run (no trust_remote_code); use a checkpoint of a "
                            "model type transformers implements (BERT, RoBERTa, ALBERT, ELECTRA, ...)")
