"""Reading a finetune task: its params, its materialised split files, the label map of a model trained on it.

A library below the stages: every stage that reads a task's data reads it through here. Layout (written by the
``splits`` stage, under ``bertpipe.lib.layout.task_dir``)::

    work/splits/<task>/train.jsonl   one Example per line (dataclasses.asdict; spans/units/answers as lists)
    work/splits/<task>/dev.jsonl
    work/splits/<task>/test.jsonl
    work/splits/<task>/splits.json   {"splits": {split: {"examples": n, "sha256": hex}}, "labels": [...], ...}

The files hold exactly the examples finetune trains/selects/scores on (caps already applied when the splits stage
wrote them), so prepare (leakage exclusion), finetune, distill, export, evaluate (baselines) and register (test-set
identity = the test file's sha256) agree by construction.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Iterable

from bertpipe.infra.errors import BertpipeError
from bertpipe.lib.layout import task_dir

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


def task_settings(cfg, task: str, model=None, log=None):
    """(TaskParams, TrainParams) of a finetune task, overrides applied; with ``model`` (a dir), max_seq_len is cut to
    its position table as the finetune stage cut it, so a student, an export check or a prediction never feeds a
    longer sequence than the model has positions."""
    p = task_params(cfg, task)
    tp = p.train_params(cfg.params.finetune.train)
    if model is not None:
        from bertpipe.lib.modelinfo import clamp_seq_len

        tp = tp.model_copy(update={"max_seq_len": clamp_seq_len(tp.max_seq_len, model, "finetune.train.max_seq_len",
                                                                 log)})
    return p, tp


def reader_spec(cfg, task: str) -> dict:
    """The part of a stage's spec that a stage reading a task's models (distill, export) takes from the finetune
    section: the task's definition and its training settings, overrides folded in (``task_settings``), never the
    search or another task's settings."""
    p, tp = task_settings(cfg, task)
    return {f"finetune.tasks.{task}": p.model_copy(update={"train_overrides": {}, "search_overrides": {}}),
            "finetune.train": tp}


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
        raise BertpipeError(f"{path}: task split missing (run `bertpipe splits` first)")
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


def task_examples(cfg, task: str, splits: Iterable[str] = SPLITS) -> dict[str, list]:
    """{split: examples} of ``task`` as the splits stage materialised them: what finetune trains, selects and scores
    on (caps applied). A missing split file is a one-line error saying which stage writes it."""
    task_params(cfg, task)
    tdir = task_dir(cfg, task)
    return {s: read_split(tdir / f"{s}.jsonl") for s in splits}


def model_labels(model_dir: Path | str) -> list[str]:
    """The label list a saved head was trained with (id order); empty for QA and encoders."""
    conf = json.loads((Path(model_dir) / "config.json").read_text(encoding="utf-8"))
    arch = (conf.get("architectures") or [""])[0]
    if arch.endswith(("ForQuestionAnswering", "ForMaskedLM")) or arch.endswith("Model"):
        return []
    id2label = conf.get("id2label") or {}
    return [id2label[k] for k in sorted(id2label, key=int)]


def split_info(tdir: Path) -> dict:
    try:
        return json.loads((Path(tdir) / SPLITS_JSON).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def split_datasets(tdir: Path, task: str) -> list[tuple[Path, str, str, str]]:
    """A task's splits as a run's data inputs (``bertpipe.infra.tracking.dataset_inputs``): (file, ``task/split``, the
    file's sha256, the MLflow context: training, dev or test), for the splits splits.json records a digest of."""
    splits = split_info(tdir).get("splits") or {}
    return [(Path(tdir) / f"{split}.jsonl", f"{task}/{split}", rec["sha256"][:36],
             "training" if split == "train" else split) for split, rec in splits.items() if rec.get("sha256")]
