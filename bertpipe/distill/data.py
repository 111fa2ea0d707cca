"""The examples a finetuned teacher saw: the materialised task splits when the `tasks` stage wrote them, else the
finetune stage's own reading and caps, so a student trains and is scored on exactly the teacher's data."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from bertpipe.errors import BertpipeError


def task_params(cfg, task: str, model=None, log=None):
    """(TaskParams, TrainParams) of a finetune task, overrides applied; with ``model`` (a dir), max_seq_len is cut to
    its position table as the finetune stage cut it, so a student, an export check or a prediction never feeds a
    longer sequence than the model has positions."""
    from bertpipe.taskdata import task_params as lookup

    fp = cfg.params.finetune
    p = lookup(cfg, task)
    tp = p.train_params(fp.train)
    if model is not None:
        from bertpipe.modelinfo import clamp_seq_len

        tp = tp.model_copy(update={"max_seq_len": clamp_seq_len(tp.max_seq_len, model, "finetune.train.max_seq_len",
                                                                 log)})
    return p, tp


def task_examples(cfg, task: str, counts: Counter | None = None) -> dict[str, list]:
    """{train, dev, test} examples of ``task`` as finetune trains, selects and scores on them."""
    from bertpipe.taskdata import SPLITS_JSON, read_task, task_dir

    counts = Counter() if counts is None else counts
    tdir = task_dir(cfg, task)
    if (tdir / SPLITS_JSON).is_file():
        return read_task(tdir)
    from bertpipe.finetune import data as D

    p, tp = task_params(cfg, task)
    data = D.load_task(p, cfg.path, counts)
    data["train"] = D.cap(data["train"], tp.max_train_examples, p.split_seed)
    for s in ("dev", "test"):
        data[s] = D.cap(data[s], tp.max_eval_examples, p.split_seed)
    return data


def model_labels(model_dir: Path | str) -> list[str]:
    """The label list a saved head was trained with (id order); empty for QA and encoders."""
    import json

    conf = json.loads((Path(model_dir) / "config.json").read_text(encoding="utf-8"))
    arch = (conf.get("architectures") or [""])[0]
    if arch.endswith(("ForQuestionAnswering", "ForMaskedLM")) or arch.endswith("Model"):
        return []
    id2label = conf.get("id2label") or {}
    return [id2label[k] for k in sorted(id2label, key=int)]
