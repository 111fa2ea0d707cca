"""The TAPT corpus of one task: its train split's texts, minus any that leak its dev/test texts.

The task's train texts (the text, a pair's second text, a QA question; each distinct text once) are checked against
the task's own dev and test texts with prepare's leakage exclusion (``bertpipe.lib.cleaning.exclude``: exact, contains,
near-duplicate, after prepare's normalisation and with ``prepare``'s clean/dedup/exclude params), so "leak" means
what it means for the pretraining corpora. The splits stage already drops train examples that near-duplicate dev or
test; this check also catches a train text that contains a dev/test text verbatim, and a task directory not made by
the splits stage.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from bertpipe.lib.cleaning.clean import Cleaner
from bertpipe.lib.cleaning.exclude import EvalTexts, exclude
from bertpipe.lib.labelled import read_split


@dataclass
class TaptCorpus:
    train: list[str]  # texts trained on
    held_out: list[str]  # texts for the held-out MLM loss (from train, never trained on)
    counts: dict = field(default_factory=dict)  # texts, dropped by reason, examples of dropped texts


def task_texts(examples) -> dict[str, str]:
    """{text: the id of the first example holding it}: every distinct non-empty text of ``examples`` in order (QA
    contexts repeat across questions)."""
    seen: dict[str, str] = {}
    for ex in examples:
        for t in (ex.text, ex.text_pair, ex.question):
            if t and t.strip():
                seen.setdefault(t, str(ex.id))
    return seen


def leak_checked(task: str, task_dir: Path, prepare_params) -> tuple[list[str], dict]:
    """(the task's train texts that leak none of its dev/test texts, counts of what was dropped and why)."""
    owners = task_texts(read_split(Path(task_dir) / "train.jsonl"))
    texts = list(owners)
    ev = EvalTexts.from_inputs({f"splits/{task}/{s}": Path(task_dir) / f"{s}.jsonl" for s in ("dev", "test")},
                               prepare_params)
    norm = Cleaner(prepare_params.clean).normalise
    docs = [{"id": str(i), "text": norm(t)} for i, t in enumerate(texts)]
    kept, stats = exclude(docs, ev, prepare_params)
    keep = {int(d["id"]) for d in kept}
    by_reason = (stats.get("by_task") or {}).get(task, {})
    shown = [{**e, "id": owners[texts[int(e["id"])]]} for e in stats.get("examples", [])]  # the train example's id
    counts = {"train_texts": len(texts), "eval_texts": len(ev.texts), "leak_dropped": stats.get("docs", 0),
              "leak_dropped_by_reason": dict(by_reason), "leak_examples": shown}
    return [t for i, t in enumerate(texts) if i in keep], counts


def tapt_corpus(task: str, task_dir: Path, prepare_params, holdout: float, seed: int) -> TaptCorpus:
    """The leak-checked train texts, a seeded ``holdout`` share of them (at least one) set aside for evaluation."""
    texts, counts = leak_checked(task, task_dir, prepare_params)
    n_held = min(max(1, round(holdout * len(texts))), max(len(texts) - 1, 0))
    held = set(np.random.default_rng(seed).permutation(len(texts))[:n_held].tolist())
    counts.update(trained_texts=len(texts) - n_held, held_out_texts=n_held)
    return TaptCorpus([t for i, t in enumerate(texts) if i not in held], [t for i, t in enumerate(texts) if i in held],
                      counts)
