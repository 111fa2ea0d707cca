"""When a finetuned model is degenerate: it learned nothing the task's majority answer does not already give.

A model is degenerate on a split when it predicts one class for every example (classification), no entity at all
(NER), or no answer overlap at all (QA), or when its primary score does not beat the majority baseline on the same
examples. Such a run is never a result: the search passes over it, a seed that ends there is trained again with
another seed, and an encoder whose every run is degenerate gets no verdict and is never crowned.
"""

from __future__ import annotations

from collections import Counter
from typing import Sequence

from bertpipe.lib.measures import metrics as M


def majority_score(task_type: str, train_labels: Sequence[str], gold: Sequence[str], labels: Sequence[str]
                   ) -> float:
    """The primary score of always answering the train split's most frequent label (classification), or no
    entity / no answer (NER, QA: 0), on the examples whose labels are ``gold``."""
    if task_type not in ("classification", "pair_classification") or not gold or not train_labels:
        return 0.0
    top = Counter(train_labels).most_common(1)[0][0]
    return M.classification_metrics(gold, [top] * len(gold), labels)[0]["macro_f1"]


def reason(task_type: str, primary: str, flat: dict, recs: Sequence[dict], majority: float) -> str | None:
    """Why the predictions ``recs`` (with metrics ``flat``) are degenerate, in words; None when they are not."""
    if not recs:
        return None
    value = flat.get(primary, 0.0)
    if task_type in ("classification", "pair_classification"):
        preds = Counter(r["pred"] for r in recs)
        if len(preds) == 1:
            return f"predicts one class ({next(iter(preds))!r}) for all {len(recs)} examples"
        if round(value, 6) <= round(majority, 6):
            return f"{primary} {value:.4f} does not beat the majority baseline {majority:.4f}"
        return None
    if task_type == "ner":
        if not any(r["pred"] for r in recs):
            return f"predicts no entity in {len(recs)} examples"
    if value <= 0.0:
        return f"{primary} is 0 on {len(recs)} examples"
    return None
