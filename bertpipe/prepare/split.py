"""Split: deterministic train/valid/test by leakage group. Documents that share a group (e.g. one law) or a
near-duplicate cluster are joined into one component first, and a component never straddles two splits."""

from __future__ import annotations

import hashlib
from typing import Sequence

import numpy as np

from bertpipe.prepare.dedup import components


def leak_components(groups: Sequence[str], clusters: Sequence[str]) -> np.ndarray:
    """Component label per document: documents linked by an equal group or an equal cluster share a label."""
    n = len(groups)
    node: dict[tuple[str, str], int] = {}
    edges = []
    for i, (g, c) in enumerate(zip(groups, clusters)):
        gi = node.setdefault(("g", g), n + len(node))
        ci = node.setdefault(("c", c), n + len(node))
        edges.append((i, gi))
        edges.append((i, ci))
    labels = components(n + len(node), np.asarray(edges, dtype=np.int64).reshape(-1, 2))
    return labels[:n]


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
    n = len(groups)
    if n == 0:
        return []
    names = [k for k, v in fractions.items() if v > 0]
    shares = np.array([fractions[k] for k in names], dtype=np.float64)
    bounds = np.cumsum(shares) / shares.sum()
    labels = leak_components(groups, clusters)
    w = np.ones(n) if weights is None else np.asarray(weights, dtype=np.float64)
    # A component is named by its smallest group string, so its position does not depend on document order.
    first: dict[int, str] = {}
    for lab, g in zip(labels.tolist(), groups):
        if lab not in first or g < first[lab]:
            first[lab] = g
    comp_ids = sorted(first, key=lambda c: (_unit_hash(first[c], seed), first[c]))
    size = np.bincount(labels, weights=w)
    choice: dict[int, int] = {}
    if method == "hash":
        for c in comp_ids:
            choice[c] = int(np.searchsorted(bounds, _unit_hash(first[c], seed + 1), side="right"))
    else:
        total = size[comp_ids].sum()
        acc = 0.0
        for c in comp_ids:
            mid = (acc + size[c] / 2) / total
            choice[c] = int(np.searchsorted(bounds, mid, side="right"))
            acc += size[c]
    for c in choice:
        choice[c] = min(choice[c], len(names) - 1)
    _fill_empty(choice, comp_ids, size, len(names))
    return [names[choice[lab]] for lab in labels.tolist()]


def _fill_empty(choice: dict[int, int], comp_ids: list[int], size: np.ndarray, k: int) -> None:
    """With enough components, give every split at least one: an empty split takes the smallest component of the
    split that has the most."""
    if len(comp_ids) < k:
        return
    for s in range(k):
        if any(v == s for v in choice.values()):
            continue
        per = np.bincount(list(choice.values()), minlength=k)
        donor = int(np.argmax(per))
        cands = [c for c in comp_ids if choice[c] == donor]
        choice[min(cands, key=lambda c: (size[c], comp_ids.index(c)))] = s
