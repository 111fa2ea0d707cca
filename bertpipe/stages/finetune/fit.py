"""One finetuning run: a fresh head on the encoder, one configuration, one seed, trained with the dev split as the
early-stopping and selection signal, then scored on dev (and judged for degeneracy)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

from bertpipe.lib.training import degenerate as D
from bertpipe.lib.training import imbalance as I
from bertpipe.lib.training.heads import load_model
from bertpipe.lib.training.loop import TrainResult, set_seed, train
from bertpipe.lib.training.params import TaskParams, TrainParams
from bertpipe.lib.training.predict import score


@dataclass
class Task:
    """What every run of one finetune stage shares: the task, its featurised splits and the encoder."""

    p: TaskParams
    encoder: Any  # the encoder dir or hub id
    labels: list[str]
    splits: dict  # split name -> bertpipe.lib.training.features.Split
    primary: str
    pad: int
    device: Any
    bf16: bool
    majority_dev: float  # the majority baseline's primary score on dev
    desc: str
    log_metrics: Callable[[dict, int], None] | None = None

    @property
    def has_dev(self) -> bool:
        return bool(self.splits["dev"].examples)

    def train_label_ids(self) -> list[int]:
        return [f["labels"] for f in self.splits["train"].feats if isinstance(f.get("labels"), int)]


@dataclass
class Fit:
    model: Any  # the trained model (best dev weights restored), unwrapped
    result: TrainResult
    seed: int
    dev: dict = field(default_factory=dict)
    degenerate: str | None = None  # why the run is degenerate on dev, in words


def fit(t: Task, tp: TrainParams, seed: int, on_eval: Callable[[float, int, bool], None] | None = None,
        metric_prefix: str = "") -> Fit:
    """Train ``tp`` on ``seed``. ``on_eval(dev primary, evaluation index, above the majority baseline)`` sees every
    dev evaluation and may raise to stop the run (a search's pruner does)."""
    set_seed(seed)  # the fresh head's init must not depend on what used the global RNG before
    model = load_model(t.p.type, t.encoder, t.labels).to(t.device)
    model = I.weighted(model, t.p.type, t.train_label_ids(), len(t.labels), tp.class_weight)
    seen = [0]

    if t.has_dev:
        def dev_eval(m):
            flat, _, recs = score(m, t.splits["dev"], t.p, t.labels, t.pad, tp.eval_batch_size, t.bf16)
            value = flat.get(t.primary, 0.0)
            if on_eval is not None:  # sound: above the majority baseline at this evaluation
                on_eval(value, seen[0], value > t.majority_dev)
            seen[0] += 1
            # kept by the loop for its best evaluation, whose weights it restores: that scoring is the trained
            # model's dev score, with no second pass over dev
            return value, flat, (flat, recs)
    else:  # nothing to select on: every evaluation "improves", so the last weights are kept
        def dev_eval(m):
            return time.monotonic(), {}

    log = None
    if t.log_metrics is not None:
        def log(m, step):
            t.log_metrics({f"{metric_prefix}{k}": v for k, v in m.items()}, step)
    res = train(model, t.splits["train"].feats, tp, dev_eval, t.pad, seed, log_metrics=log,
                desc=f"{t.desc} seed {seed}")
    model = I.unwrap(model)
    out = Fit(model, res, seed)
    if t.has_dev:
        out.dev, recs = res.best_kept
        out.degenerate = D.reason(t.p.type, t.primary, out.dev, recs, t.majority_dev)
    return out
