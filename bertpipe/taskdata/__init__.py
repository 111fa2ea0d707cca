"""Materialised task splits — the one place every stage reads a finetune task's data from.

Layout (written by the ``tasks`` stage)::

    work/tasks/<task>/train.jsonl   one Example per line (dataclasses.asdict; spans/units/answers as lists)
    work/tasks/<task>/dev.jsonl
    work/tasks/<task>/test.jsonl
    work/tasks/<task>/splits.json   {"splits": {split: {"examples": n, "sha256": hex}}, "labels": [...], ...}

The files hold exactly the examples finetune trains/selects/scores on (caps already applied), so prepare (leakage
exclusion), finetune, evaluate (baselines) and register (test-set identity = the test file's sha256) agree by
construction.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Iterable

from bertpipe.errors import BertpipeError

SPLITS = ("train", "dev", "test")
SPLITS_JSON = "splits.json"


@dataclass
class Example:
    id: str
    text: str  # the sentence, document, or (QA) the context
    where: str = ""  # file:line of the source record
    text_pair: str | None = None
    label: str | None = None
    group: str | None = None
    spans: list[tuple[int, int, str]] = field(default_factory=list)  # NER gold: character spans, end exclusive
    units: list[tuple[int, int]] = field(default_factory=list)  # NER: token character ranges seqeval scores on
    question: str | None = None
    answers: list[tuple[str, int]] = field(default_factory=list)  # QA: (text, char start in context)


def task_params(cfg, task: str):
    """A finetune task's params (``finetune.tasks.<task>``); an unknown name is a one-line error. The one lookup:
    every stage that reads a task goes through it."""
    p = cfg.params.finetune.tasks.get(task)
    if p is None:
        raise BertpipeError(f"finetune.tasks: no task named {task!r} (have {sorted(cfg.params.finetune.tasks)})")
    return p


def task_dir(cfg, task: str) -> Path:
    return cfg.work / "tasks" / task


def write_split(path: Path, examples: Iterable) -> dict:
    """Write examples as jsonl; returns {"examples": n, "sha256": digest of the file's bytes}."""
    h = hashlib.sha256()
    n = 0
    with open(path, "w", encoding="utf-8") as f:
        for ex in examples:
            line = json.dumps(asdict(ex), ensure_ascii=False, sort_keys=True) + "\n"
            f.write(line)
            h.update(line.encode("utf-8"))
            n += 1
    return {"examples": n, "sha256": h.hexdigest()}


def _example(rec: dict):
    names = {f.name for f in fields(Example)}
    ex = Example(**{k: v for k, v in rec.items() if k in names})
    ex.spans = [tuple(s) for s in ex.spans]
    ex.units = [tuple(u) for u in ex.units]
    ex.answers = [tuple(a) for a in ex.answers]
    return ex


def read_split(path: Path) -> list:
    """The examples of one split file (an empty list when the split is empty)."""
    path = Path(path)
    if not path.is_file():
        raise BertpipeError(f"{path}: task split missing (run the `tasks` stage first)")
    out = []
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f, 1):
            if line.strip():
                try:
                    out.append(_example(json.loads(line)))
                except (ValueError, TypeError) as e:
                    raise BertpipeError(f"{path}:{i}: not a task example ({e})") from None
    return out


def read_task(tdir: Path) -> dict[str, list]:
    """{train, dev, test} examples of a materialised task directory."""
    return {s: read_split(Path(tdir) / f"{s}.jsonl") for s in SPLITS}


def split_info(tdir: Path) -> dict:
    try:
        return json.loads((Path(tdir) / SPLITS_JSON).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
