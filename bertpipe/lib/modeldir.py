"""A saved model directory that loads anywhere: its tokenizer never promises more tokens than the model has positions.

A tokenizer saved from a 512-position checkpoint keeps ``model_max_length: 512`` in ``tokenizer_config.json`` when the
model beside it has 128 positions, so ``pipeline(task, model=dir)(long_text, truncation=True)`` truncates to 512
tokens and the model fails on a tensor size mismatch. ``fit_tokenizer`` sets the limit to the model's usable
positions (``bertpipe.lib.modelinfo.position_limit``: RoBERTa-like families reserve ``pad_token_id + 1``).
"""

from __future__ import annotations

import json
from pathlib import Path

from bertpipe.lib.modelinfo import position_limit

TOKENIZER_CONFIG = "tokenizer_config.json"


def fit_tokenizer(model_dir: Path) -> int | None:
    """Lower the saved tokenizer's ``model_max_length`` in ``model_dir`` to the model's position limit (set it when
    missing); return the limit (None when the directory has no tokenizer config or no known limit)."""
    path = Path(model_dir) / TOKENIZER_CONFIG
    limit = position_limit(Path(model_dir))
    if limit is None or not path.is_file():
        return None
    conf = json.loads(path.read_text(encoding="utf-8"))
    have = conf.get("model_max_length")
    if isinstance(have, (int, float)) and have <= limit:
        return int(have)
    conf["model_max_length"] = limit
    path.write_text(json.dumps(conf, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    return limit
