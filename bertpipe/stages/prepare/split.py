"""Split: deterministic train/valid/test by leakage group. Documents that share a group (e.g. one law) or a
near-duplicate cluster are joined into one component first, and a component never straddles two splits."""

from __future__ import annotations

import hashlib
from typing import Callable, Sequence

import numpy as np

from bertpipe.lib.cleaning.dedup import components


def leak_components(groups: Sequence[str], clusters: Sequence[str]) -> np.ndarray:
    """Component label per document: documents linked by an equal group or an equal cluster share a label."""
    return _components(_codes(groups)[0], _codes(clusters)[0])


def _codes(values: Sequence[str]) -> tuple[np.ndarray, list[str]]:
    """(integer code per value, the distinct values by code)."""
    where: dict[str, int] = {}
    codes = np.fromiter((where.setdefault(v, len(where)) for v in values), dtype=np.int64, count=len(values))
    return codes, list(where)


def _components(group_codes: np.ndarray, cluster_codes: np.ndarray) -> np.ndarray:
    """Union of documents through shared group codes and shared cluster codes, over integer ids (scipy's
    connected components of the bipartite document-group-cluster graph)."""
    n = len(group_codes)
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    ng = int(group_codes.max()) + 1
    docs = np.arange(n, dtype=np.int64)
    edges = np.concatenate([np.stack([docs, n + group_codes], axis=1),
                            np.stack([docs, n + ng + cluster_codes], axis=1)])
    return components(n + ng + int(cluster_codes.max()) + 1, edges)[:n]


def _unit_hash(key: str, seed: int) -> float:
    h = hashlib.blake2b(f"{seed}\x00{key}".encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(h, "big") / 2**64


def assign_splits(
    groups: Sequence[str],
    clusters: Sequence[str],
    fractions: dict[str, float],
    seed: int = 0,
    method: str = "balanced",
    weights: Sequence[int] | None = None,
) -> list[str]:
    """Split name per document. ``fractions`` maps split -> share (they sum to 1, in the order given); ``weights``
    (e.g. characters) measure the shares, documents count 1 each by default."""
    if len(groups) == 0:
        return []
    gcodes, gvalues = _codes(groups)
    names = [k for k, v in fractions.items() if v > 0]
    order = sorted(range(len(gvalues)), key=gvalues.__getitem__)
    rank = np.empty(len(gvalues), dtype=np.int64)
    rank[order] = np.arange(len(gvalues))
    idx = assign_split_codes(gcodes, rank, lambda r: gvalues[order[r]], _codes(clusters)[0], fractions, seed,
                             method, weights)
    return [names[i] for i in idx.tolist()]


def assign_split_codes(
    group_codes: np.ndarray,
    group_rank: np.ndarray,
    group_name: Callable[[int], str],
    cluster_codes: np.ndarray,
    fractions: dict[str, float],
    seed: int = 0,
    method: str = "balanced",
    weights: Sequence[int] | np.ndarray | None = None,
) -> np.ndarray:
    """``assign_splits`` over integer codes: index into the positive ``fractions`` per document. ``group_rank``:
    each group code's position in the sorted group names, ``group_name(rank)``: the name at that position (only
    one per component is asked for, so the names can stay in Arrow or on disk)."""
    n = len(group_codes)
    names = [k for k, v in fractions.items() if v > 0]
    if n == 0:
        return np.zeros(0, dtype=np.int8)
    shares = np.array([fractions[k] for k in names], dtype=np.float64)
    bounds = np.cumsum(shares) / shares.sum()
    labels = _components(np.asarray(group_codes, dtype=np.int64), np.asarray(cluster_codes, dtype=np.int64))
    w = np.ones(n) if weights is None else np.asarray(weights, dtype=np.float64)
    # A component is named by its smallest group string, so its position does not depend on document order. Every
    # per-component quantity below is a numpy array, not a dict or list of Python objects: at a million components
    # those held ~450 MB in prepare's parent (docs/scale.md).
    ncomp = int(labels.max()) + 1
    first_rank = np.full(ncomp, np.iinfo(np.int64).max, dtype=np.int64)
    np.minimum.at(first_rank, labels, group_rank[group_codes])
    present = np.flatnonzero(first_rank != np.iinfo(np.int64).max)
    ranks = first_rank[present]
    # Components ordered by (hash of the name, name): a group belongs to one component only, so the names are
    # distinct and the name order is their rank order. The names are asked for one at a time and not kept.
    key = np.fromiter((_unit_hash(group_name(int(r)), seed) for r in ranks), dtype=np.float64, count=len(ranks))
    by = np.lexsort((ranks, key))
    comp_ids = present[by]
    size = np.bincount(labels, weights=w)
    if method == "hash":
        pos = np.fromiter((_unit_hash(group_name(int(r)), seed + 1) for r in ranks[by]), dtype=np.float64,
                          count=len(by))
    else:
        sz = size[comp_ids]
        total = sz.sum()
        # acc before each component: sequential sums in component order (np.cumsum adds in order, as a loop would)
        acc = np.concatenate([[0.0], np.cumsum(sz)[:-1]])
        pos = (acc + sz / 2) / total
    choice = np.minimum(np.searchsorted(bounds, pos, side="right"), len(names) - 1)
    _fill_empty(choice, size[comp_ids], len(names))
    lut = np.zeros(ncomp, dtype=np.int8)
    lut[comp_ids] = choice
    return lut[labels]


def _fill_empty(choice: np.ndarray, size: np.ndarray, k: int) -> None:
    """With enough components, give every split at least one: an empty split takes the smallest component of the
    split that has the most (the first in component order among equals). ``choice`` and ``size``: per component, in
    component order; ``choice`` is changed in place."""
    if len(choice) < k:
        return
    for s in range(k):
        if (choice == s).any():
            continue
        donor = int(np.argmax(np.bincount(choice, minlength=k)))
        cands = np.flatnonzero(choice == donor)
        choice[cands[np.argmin(size[cands])]] = s
