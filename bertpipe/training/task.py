"""A finetune task as a model trained on it saw it: its settings (overrides applied, max_seq_len cut to the model's
positions), its examples (the materialised task splits when the `tasks` stage wrote them, else the task files read
and capped the same way) and the labels of a saved head, so a student, an export check or a prediction uses exactly
the finetuned model's data."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path


def task_settings(cfg, task: str, model=None, log=None):
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


def task_examples(cfg, task: str) -> dict[str, list]:
    """{train, dev, test} examples of ``task`` as finetune trains, selects and scores on them."""
    from bertpipe.taskdata import SPLITS_JSON, read_task, task_dir

    tdir = task_dir(cfg, task)
    if (tdir / SPLITS_JSON).is_file():
        return read_task(tdir)
    from bertpipe.training import taskfiles as D

    p, tp = task_settings(cfg, task)
    data = D.load_task(p, cfg.path, Counter())
    data["train"] = D.cap(data["train"], tp.max_train_examples, p.split_seed)
    for s in ("dev", "test"):
        data[s] = D.cap(data[s], tp.max_eval_examples, p.split_seed)
    return data


def model_labels(model_dir: Path | str) -> list[str]:
    """The label list a saved head was trained with (id order); empty for QA and encoders."""
    conf = json.loads((Path(model_dir) / "config.json").read_text(encoding="utf-8"))
    arch = (conf.get("architectures") or [""])[0]
    if arch.endswith(("ForQuestionAnswering", "ForMaskedLM")) or arch.endswith("Model"):
        return []
    id2label = conf.get("id2label") or {}
    return [id2label[k] for k in sorted(id2label, key=int)]
