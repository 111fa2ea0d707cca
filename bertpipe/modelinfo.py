"""Facts about a model that stages must respect, read from its config without loading weights."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable


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
