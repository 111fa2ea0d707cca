"""Paired bootstrap intervals: how sure is "B scores higher than A on this test set"?

Both systems are scored on the *same* resampled examples in every replicate (paired), so the interval reflects how
much the difference depends on which test examples happened to be drawn, not the much larger spread of each score.
The evaluate stage uses it for adapted − base, register for challenger − champion: both pair two models' test
predictions (``shared_examples``) and resample them with the task type's statistic (``METRIC_FNS``).

The metric functions here recompute the finetune primary metrics from per-example prediction records fast enough for a
thousand replicates (tests check them against ``bertpipe.lib.measures.metrics``):

- ``macro_f1``: scikit-learn's macro-F1 over the classes present in the gold labels, as ``classification_metrics``;
- ``entity_f1``: strict entity-level micro F1 over ``(start, end, type)`` spans, which is seqeval's strict IOB2 score
  whenever the spans align with the scoring units (they do: predictions are decoded onto the same units);
- ``qa_f1``: CMRC-style F1, best over reference answers, as ``qa_metrics``.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Callable, Sequence

import numpy as np


def macro_f1(gold: Sequence, pred: Sequence) -> float:
    tp, fp, fn = Counter(), Counter(), Counter()
    for g, p in zip(gold, pred):
        if g == p:
            tp[g] += 1
        else:
            fp[p] += 1
            fn[g] += 1
    present = set(tp) | set(fn)  # classes with gold support
    if not present:
        return 0.0
    return sum(2 * tp[c] / (2 * tp[c] + fp[c] + fn[c]) for c in present) / len(present)


class SumMetric:
    """A metric computed from per-example counts summed over the examples. Called like any metric function; a
    bootstrap replicate is then a weighted sum of precomputed rows instead of a pass over the examples."""

    def __init__(self, width: int, stats: Callable[[object, object], Sequence[float]],
                 value: Callable[[np.ndarray], float]):
        self.width, self.stats, self.value = width, stats, value

    def rows(self, gold: Sequence, pred: Sequence) -> np.ndarray:
        return np.asarray([self.stats(g, p) for g, p in zip(gold, pred)], dtype=float).reshape(len(gold), self.width)

    def __call__(self, gold: Sequence, pred: Sequence) -> float:
        return self.value(self.rows(gold, pred).sum(axis=0))


def _entity_counts(g: Sequence, p: Sequence) -> tuple[int, int, int]:
    gs, ps = {tuple(s[:3]) for s in g}, {tuple(s[:3]) for s in p}
    return len(gs & ps), len(gs), len(ps)


entity_f1 = SumMetric(3, _entity_counts, lambda c: 2 * c[0] / (c[1] + c[2]) if c[1] + c[2] else 0.0)


def _qa_counts(answers: Sequence[str], pred: str) -> tuple[float, int]:
    from bertpipe.lib.measures.metrics import qa_f1 as f1

    return (max(f1(pred, a) for a in answers), 1) if answers else (0.0, 0)  # unanswerable: not scored


qa_f1 = SumMetric(2, _qa_counts, lambda c: c[0] / c[1] if c[1] else 0.0)


# sum(numerators) / sum(denominators): e.g. NLL per masked character over text windows (pred = (nll, chars)).
ratio = SumMetric(2, lambda _g, p: p, lambda c: c[0] / c[1] if c[1] else float("nan"))


METRIC_FNS: dict[str, Callable] = {"classification": macro_f1, "pair_classification": macro_f1, "ner": entity_f1,
                                   "qa": qa_f1}


PREDICTIONS = "predictions_test.jsonl"  # a task model's per-example test predictions (finetune, distill)


def read_predictions(path: Path) -> list[dict]:
    """The records of a ``predictions_test.jsonl`` (none when the file is missing)."""
    if not Path(path).is_file():
        return []
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def gold_pred(task_type: str, records: Sequence[dict]) -> tuple[dict, dict]:
    """{example id: gold}, {example id: prediction} from a finetune ``predictions_test.jsonl``'s records."""
    if task_type == "ner":
        return ({r["id"]: r["gold"] for r in records}, {r["id"]: r["pred"] for r in records})
    if task_type == "qa":
        return ({r["id"]: r["answers"] for r in records}, {r["id"]: r["prediction"] for r in records})
    return ({r["id"]: r["label"] for r in records}, {r["id"]: r["pred"] for r in records})


def shared_examples(task_type: str, reference: Sequence[dict], other: Sequence[dict]) -> tuple[list, list, list]:
    """(gold, reference's predictions, other's predictions) on the test examples both prediction-record lists hold,
    in ``reference``'s order with its gold: the pairs a paired bootstrap resamples."""
    gold, pred_ref = gold_pred(task_type, reference)
    _, pred_other = gold_pred(task_type, other)
    ids = [i for i in gold if i in pred_other]
    return [gold[i] for i in ids], [pred_ref[i] for i in ids], [pred_other[i] for i in ids]


def replicate_indices(m: int, n: int, seed: int) -> np.ndarray:
    """n bootstrap resamples (with replacement) of m example indices, fixed by seed."""
    return np.random.default_rng(seed).integers(0, m, size=(n, m))


def paired_deltas(gold: Sequence, pred_a: Sequence, pred_b: Sequence, metric_fn: Callable, n: int = 1000,
                  seed: int = 0) -> np.ndarray:
    """metric(B) − metric(A) on each of n paired resamples of the examples."""
    if not (len(gold) == len(pred_a) == len(pred_b)):
        raise ValueError(f"paired bootstrap needs equal lengths (gold {len(gold)}, a {len(pred_a)}, b {len(pred_b)})")
    reps = replicate_indices(len(gold), n, seed)
    if isinstance(metric_fn, SumMetric):  # each replicate: how often each example was drawn, times its counts
        weights = np.stack([np.bincount(idx, minlength=len(gold)) for idx in reps]).astype(float)
        sums_a, sums_b = weights @ metric_fn.rows(gold, pred_a), weights @ metric_fn.rows(gold, pred_b)
        return np.array([metric_fn.value(b) - metric_fn.value(a) for a, b in zip(sums_a, sums_b)])
    out = np.empty(n)
    for k, idx in enumerate(reps):
        g = [gold[i] for i in idx]
        out[k] = metric_fn(g, [pred_b[i] for i in idx]) - metric_fn(g, [pred_a[i] for i in idx])
    return out


def percentile_ci(values: np.ndarray) -> list[float]:
    lo, hi = np.percentile(values, [2.5, 97.5])
    return [float(lo), float(hi)]


def paired_bootstrap(gold: Sequence, pred_a: Sequence, pred_b: Sequence, metric_fn: Callable, n: int = 1000,
                     seed: int = 0) -> dict:
    """B − A with a 95% percentile interval from n paired resamples of the examples (fixed by ``seed``).

    ``metric_fn(gold, pred) -> float`` (higher or lower better: the sign is the caller's to read). Returns
    ``{"mean": metric(B) − metric(A) on all examples, "ci95": [lo, hi], "n": n, "examples": len(gold)}``.
    """
    if not gold:
        return {"mean": float("nan"), "ci95": [float("nan"), float("nan")], "n": 0, "examples": 0}
    point = metric_fn(gold, pred_b) - metric_fn(gold, pred_a)
    deltas = paired_deltas(gold, pred_a, pred_b, metric_fn, n, seed)
    return {"mean": float(point), "ci95": percentile_ci(deltas), "n": n, "examples": len(gold)}


def seeds_and_examples(seed_deltas: Sequence[float], example_deltas: np.ndarray, example_point: float,
                       seed: int = 0) -> list[float]:
    """A 95% interval for the mean over seeds of the paired difference, counting both sources of chance.

    Each replicate resamples the seeds' paired differences (the mean over a resample of seeds) and adds the test-set
    noise of one example-level replicate (its deviation from the full-set difference): only the saved seed's
    per-example predictions exist, so its example-level spread stands in for every seed's. With one seed this is the
    example-level interval.
    """
    s = np.asarray(seed_deltas, dtype=float)
    noise = np.asarray(example_deltas, dtype=float) - example_point
    if len(s) < 2:
        return percentile_ci(s.mean() + noise)
    pick = replicate_indices(len(s), len(noise), seed + 1)
    return percentile_ci(s[pick].mean(axis=1) + noise)
