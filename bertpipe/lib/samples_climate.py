"""The `envtext` sample's files as bertpipe reads them: a climate-relevance task and an environment-domain corpus.

envtext (Apache-2.0) ships two labelled sets of Chinese Zhihu answers about the environment and climate change, each a
JSON object of splits:

- ``CLS_IsClimate.json``: ``{"train": {"pos": [...], "neg": [...]}, "valid": {...}}``, whether an answer is about
  climate change (pos) or not (neg);
- ``SA_Intensity.json``: ``{"train": {"text": [...], "label": [...]}, "valid": {...}}``, the same kind of answers
  scored for sentiment intensity (only their texts are used here, as domain text).

From them, as jsonl ``{"id", "text", "label"}`` / ``{"id", "text"}``:

- ``is_climate_train.jsonl``: the package's train split (the splits stage splits dev off it);
- ``is_climate_test.jsonl``: the package's valid split, the task's test set;
- ``corpus.jsonl``: the domain corpus, every distinct text of both files except the task's test texts, so the
  domain text holds no test example even with ``prepare.exclude.tasks`` off (prepare also drops the dev texts and
  near-duplicates of dev/test texts when it is on).
"""

from __future__ import annotations

import json
from pathlib import Path

from bertpipe.core.outputs import atomic_file
from bertpipe.infra.errors import BertpipeError

TASK_FILE = "CLS_IsClimate.json"
TEXT_FILE = "SA_Intensity.json"
LABELS = {"pos": "climate", "neg": "other"}  # the package's label names -> the task's
SPLITS = {"train": "is_climate_train.jsonl", "valid": "is_climate_test.jsonl"}


def _load(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise BertpipeError(f"{path}: not the JSON envtext ships ({e})") from None
    if not isinstance(data, dict) or set(data) != {"train", "valid"}:
        raise BertpipeError(f"{path}: expected an object with the splits train and valid")
    return data


def _write_jsonl(dest: Path, rows: list[dict]) -> None:
    with atomic_file(dest) as tmp, open(tmp, "w", encoding="utf-8") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")


def task_rows(data: dict, split: str) -> list[dict]:
    """One row per text of a CLS_IsClimate split, in the file's order (pos first, then neg), labels renamed."""
    rows = []
    for raw_label, label in LABELS.items():
        texts = data[split].get(raw_label)
        if not isinstance(texts, list):
            raise BertpipeError(f"{TASK_FILE}: {split}.{raw_label}: expected a list of texts")
        rows += [{"id": f"{split}-{raw_label}-{i}", "text": t, "label": label} for i, t in enumerate(texts)]
    return rows


def derive(folder: Path) -> None:
    """Write the task and corpus files next to the two unpacked JSON files in ``folder``."""
    task, extra = _load(folder / TASK_FILE), _load(folder / TEXT_FILE)
    test_texts = set()
    for split, fname in SPLITS.items():
        rows = task_rows(task, split)
        _write_jsonl(folder / fname, rows)
        if split == "valid":
            test_texts = {r["text"].strip() for r in rows}
    corpus, seen = [], set(test_texts)
    sources = [(f"isclimate-{s}", [r["text"] for r in task_rows(task, s)]) for s in SPLITS]
    sources += [(f"intensity-{s}", extra[s].get("text") or []) for s in ("train", "valid")]
    for name, texts in sources:
        for i, t in enumerate(texts):
            key = t.strip() if isinstance(t, str) else ""
            if key and key not in seen:
                seen.add(key)
                corpus.append({"id": f"{name}-{i}", "text": t})
    _write_jsonl(folder / "corpus.jsonl", corpus)
