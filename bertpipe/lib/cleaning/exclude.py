"""Leakage exclusion: finetune tasks' dev/test texts never reach a pretraining corpus.

A cleaned document is removed when, compared in ``normal_form`` (no whitespace, case-folded) after the same
normalisation prepare applies to documents:

- ``exact``: it equals a dev/test text;
- ``contains``: it contains a dev/test text of at least ``prepare.exclude.contain_min_chars`` characters (a test
  sentence inside a longer article or line). Candidates come from a rolling hash of every document's windows of that
  length against each text's first window; each candidate is confirmed with a substring test;
- ``near``: it is a near-duplicate of one (prepare.dedup's MinHash, n-gram Jaccard >= threshold, verified).

Counts are kept per task and reason (a document matching two tasks counts for both; the total counts it once).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from bertpipe.lib.cleaning.clean import Cleaner
from bertpipe.lib.cleaning.dedup import Sketch, near_duplicates, ngram_hashes, normal_form, sketch
from bertpipe.lib.cleaning.params import CleaningSettings

REASONS = ("exact", "contains", "near")


@dataclass
class EvalTexts:
    """The dev/test texts to keep out, in normal form, each with the tasks it belongs to."""

    texts: list[str] = field(default_factory=list)
    owners: list[set[str]] = field(default_factory=list)
    tasks: list[str] = field(default_factory=list)

    @classmethod
    def from_inputs(cls, inputs: dict[str, Path | str], p: CleaningSettings) -> "EvalTexts":
        """From stage inputs keyed ``splits/<task>/<split>`` (split files of the ``splits`` stage)."""
        from bertpipe.lib.labelled import read_split

        norm = Cleaner(p.clean).normalise
        where: dict[str, int] = {}
        out = cls()
        for key, path in sorted(inputs.items()):
            if not key.startswith("splits/"):
                continue
            task = key.split("/")[1]
            if task not in out.tasks:
                out.tasks.append(task)
            for ex in read_split(Path(path)):
                for text in (ex.text, ex.text_pair):
                    t = normal_form(norm(text or ""))
                    if not t:
                        continue
                    if t not in where:
                        where[t] = len(out.texts)
                        out.texts.append(t)
                        out.owners.append(set())
                    out.owners[where[t]].add(task)
        return out


def _contains(docs: list[str], ev: EvalTexts, m: int) -> dict[int, set[int]]:
    """doc index -> indices of the dev/test texts (>= m chars) it contains verbatim."""
    long = [k for k, t in enumerate(ev.texts) if len(t) >= m]
    if not long or not docs:
        return {}
    anchors, _ = ngram_hashes([ev.texts[k][:m] for k in long], m)
    by_anchor: dict[int, list[int]] = defaultdict(list)
    for k, h in zip(long, anchors.tolist()):
        by_anchor[h].append(k)
    hashes, offsets = ngram_hashes(docs, m)
    hit = np.flatnonzero(np.isin(hashes, np.fromiter(by_anchor, dtype=np.uint64)))
    out: dict[int, set[int]] = defaultdict(set)
    for pos, doc in zip(hit.tolist(), (np.searchsorted(offsets, hit, side="right") - 1).tolist()):
        for k in by_anchor[int(hashes[pos])]:
            if k not in out.get(doc, ()) and ev.texts[k] in docs[doc]:
                out[doc].add(k)
    return dict(out)


def exclude(docs: list[dict], ev: EvalTexts, p: CleaningSettings, sketched: Sketch | None = None,
            keep_out_sketch: Sketch | None = None) -> tuple[list[dict], dict]:
    """(kept documents, stats) with stats = {"docs": n removed, "by_task": {task: {reason: n}}, "examples": [...]}.
    ``sketched``: the documents' normal forms' ``dedup.sketch``, ``keep_out_sketch``: ``ev.texts``' (prepare's
    batches compute the first, the caller the second once)."""
    stats: dict = {"docs": 0, "by_task": {t: dict.fromkeys(REASONS, 0) for t in ev.tasks}, "examples": []}
    if not ev.texts or not docs:
        return docs, stats
    keys = [normal_form(d["text"]) for d in docs]
    found: dict[int, tuple[str, set[int]]] = {}  # doc -> (reason, dev/test text indices)
    index = {t: k for k, t in enumerate(ev.texts)}
    for i, key in enumerate(keys):
        if key in index:
            found[i] = ("exact", {index[key]})
    for i, ks in _contains(keys, ev, p.exclude.contain_min_chars).items():
        found.setdefault(i, ("contains", ks))
    d = p.dedup
    opts = dict(seed=d.seed, verify=d.verify, batch=d.batch_ngrams, recall_weight=d.recall_weight)
    if sketched is not None:
        theirs = keep_out_sketch or sketch(ev.texts, d.ngram, d.num_perm, d.threshold, **opts)
        sketched = Sketch.concat([sketched, theirs])
    nd = near_duplicates(keys + ev.texts, d.ngram, d.num_perm, d.threshold, **opts, cross_at=len(keys),
                         sketched=sketched)
    near: dict[int, set[int]] = defaultdict(set)
    for i, j in nd.pairs.tolist():
        near[i].add(j - len(keys))
    for i, ks in near.items():
        found.setdefault(i, ("near", ks))
    for i in sorted(found):
        reason, ks = found[i]
        tasks = sorted(set().union(*(ev.owners[k] for k in ks)))
        for t in tasks:
            stats["by_task"][t][reason] += 1
        if len(stats["examples"]) < 10:
            stats["examples"].append({"id": docs[i]["id"], "reason": reason, "tasks": tasks,
                                      "preview": docs[i]["text"][:60]})
    stats["docs"] = len(found)
    return [doc for i, doc in enumerate(docs) if i not in found], stats


def merge_excluded(total: dict, part: dict) -> dict:
    """Add one batch's ``exclude`` stats to the running ``total`` (examples: the first ten in corpus order)."""
    if not part:
        return total
    if not total:
        return {"docs": part["docs"], "by_task": {t: dict(c) for t, c in part["by_task"].items()},
                "examples": list(part["examples"])}
    total["docs"] += part["docs"]
    for t, c in part["by_task"].items():
        for r, n in c.items():
            total["by_task"].setdefault(t, dict.fromkeys(REASONS, 0))[r] += n
    total["examples"] = (total["examples"] + part["examples"])[:10]
    return total
