"""Near-duplicates inside one task: which groups must share a split, and what to drop when they still cross one.

The MinHash is prepare's (``bertpipe.lib.cleaning.dedup``) with prepare's settings, so "near-duplicate" means the same
thing for a task's own splits as for the pretraining corpora.

Why groups are merged only when they share a good part of their examples: one boilerplate article ("本法自公布之日起
施行。") occurs in hundreds of laws, and linking every law through it put 20,610 of laws.db's 26,196 articles into
one component (one split). Amended versions of one law under different law_ids share most of their articles, so
requiring ``LINK_SHARE`` of *both* groups' examples to have a near-duplicate in the other merges those and leaves the
boilerplate to the second step: an example that still has a near-duplicate in another split is dropped from the less
precious split (train < dev < test; a test set given as a file is never changed).
"""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Sequence

import numpy as np

from bertpipe.lib.cleaning.dedup import components, near_duplicates
from bertpipe.lib.labelled import Example
from bertpipe.lib.training.taskfiles import own_group

# Two groups merge when at least this share of each one's examples has a near-duplicate in the other.
LINK_SHARE = 0.2
RANK = {"train": 0, "dev": 1, "test": 2}


def leak_text(ex: Example) -> str:
    """What a near-duplicate is judged on: the text, and the second text of a pair."""
    return ex.text if ex.text_pair is None else f"{ex.text}\n{ex.text_pair}"


def near_pairs(texts: Sequence[str], d) -> np.ndarray:
    """(k, 2) index pairs of near-duplicate texts (exact duplicates included), by prepare.dedup's settings."""
    if len(texts) < 2:
        return np.zeros((0, 2), dtype=np.int64)
    nd = near_duplicates(list(texts), d.ngram, d.num_perm, d.threshold, seed=d.seed, verify=d.verify,
                         batch=d.batch_ngrams, recall_weight=d.recall_weight)
    return nd.pairs


def merged_groups(exs: Sequence[Example], pairs: np.ndarray, share: float = LINK_SHARE) -> list[str]:
    """A split key per example: its group, merged with the groups it substantially near-duplicates."""
    groups = [own_group(e) for e in exs]
    size = Counter(groups)
    sides: dict[tuple[str, str], tuple[set, set]] = defaultdict(lambda: (set(), set()))
    for i, j in pairs.tolist():
        a, b = groups[i], groups[j]
        if a == b:
            continue
        if a > b:
            a, b, i, j = b, a, j, i
        sa, sb = sides[(a, b)]
        sa.add(i)
        sb.add(j)
    names = sorted(size)
    gid = {g: k for k, g in enumerate(names)}
    edges = [(gid[a], gid[b]) for (a, b), (sa, sb) in sides.items()
             if min(len(sa) / size[a], len(sb) / size[b]) >= share]
    labels = components(len(names), np.asarray(edges, dtype=np.int64).reshape(-1, 2))
    rep: dict[int, str] = {}
    for g in names:  # sorted: a component is named by its smallest group, independent of example order
        rep.setdefault(int(labels[gid[g]]), g)
    return [rep[int(labels[gid[g]])] for g in groups]


def decontaminate(data: dict[str, list[Example]], index: dict[int, int], pairs: np.ndarray,
                  counts: Counter) -> dict[str, list[Example]]:
    """Drop each example that has a near-duplicate in a more precious split (``index``: id(example) -> pair index)."""
    where = {index[id(ex)]: s for s, exs in data.items() for ex in exs}
    drop: set[int] = set()
    for i, j in pairs.tolist():
        si, sj = where.get(i), where.get(j)
        if si is None or sj is None or si == sj:
            continue
        drop.add(i if RANK[si] < RANK[sj] else j)
    out = {}
    for s, exs in data.items():
        out[s] = [ex for ex in exs if index[id(ex)] not in drop]
        counts[f"{s}_near_dup_dropped"] += len(exs) - len(out[s])
    return out
