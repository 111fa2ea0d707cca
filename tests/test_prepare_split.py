"""Group-aware splitting: no group or near-duplicate cluster straddles two splits; sizes follow the fractions."""

from __future__ import annotations

import random
from collections import Counter, defaultdict

import pytest

from bertpipe.stages.prepare.split import assign_splits, leak_components

FRACTIONS = {"train": 0.8, "valid": 0.1, "test": 0.1}


def synthetic(n_groups: int, seed: int = 0) -> tuple[list[str], list[str]]:
    rng = random.Random(seed)
    groups, clusters = [], []
    for g in range(n_groups):
        for k in range(rng.randint(1, 60)):
            groups.append(f"法{g}")
            clusters.append(f"法{g}:{k}")
    # near-duplicate clusters that cross groups (boilerplate shared by laws)
    for _ in range(n_groups // 5):
        a, b = rng.randrange(len(groups)), rng.randrange(len(groups))
        clusters[b] = clusters[a]
    return groups, clusters


def _owners(keys, splits) -> dict:
    own = defaultdict(set)
    for k, s in zip(keys, splits):
        own[k].add(s)
    return own


@pytest.mark.parametrize("method", ["balanced", "hash"])
@pytest.mark.parametrize("n_groups", [3, 40, 400])
def test_no_group_or_cluster_straddles_splits(method, n_groups):
    groups, clusters = synthetic(n_groups)
    splits = assign_splits(groups, clusters, FRACTIONS, seed=1, method=method)
    assert all(len(v) == 1 for v in _owners(groups, splits).values())
    assert all(len(v) == 1 for v in _owners(clusters, splits).values())
    assert set(splits) == set(FRACTIONS)  # every split gets something when there are enough components


def test_balanced_sizes_follow_fractions():
    groups, clusters = synthetic(400)
    c = Counter(assign_splits(groups, clusters, FRACTIONS, seed=1))
    n = len(groups)
    for name, frac in FRACTIONS.items():
        assert abs(c[name] / n - frac) < 0.03, c


def test_deterministic_and_order_independent():
    groups, clusters = synthetic(100)
    a = assign_splits(groups, clusters, FRACTIONS, seed=3)
    perm = list(range(len(groups)))
    random.Random(9).shuffle(perm)
    b = assign_splits([groups[i] for i in perm], [clusters[i] for i in perm], FRACTIONS, seed=3)
    assert [a[i] for i in perm] == b
    assert assign_splits(groups, clusters, FRACTIONS, seed=4) != a  # the seed matters


def test_hash_method_is_stable_when_groups_are_added():
    groups, clusters = synthetic(200)
    before = dict(zip(groups, assign_splits(groups, clusters, FRACTIONS, method="hash")))
    more_g = groups + [f"新法{i}" for i in range(50)]
    more_c = clusters + [f"新法{i}:0" for i in range(50)]
    after = dict(zip(more_g, assign_splits(more_g, more_c, FRACTIONS, method="hash")))
    assert all(after[g] == s for g, s in before.items())


def test_leak_components_join_groups_through_clusters():
    labels = leak_components(["a", "a", "b", "c", "d"], ["x", "y", "y", "z", "w"])
    assert labels[0] == labels[1] == labels[2]
    assert len({labels[0], labels[3], labels[4]}) == 3


def test_edge_cases():
    assert assign_splits([], [], FRACTIONS) == []
    assert assign_splits(["只有一组"] * 5, [str(i) for i in range(5)], FRACTIONS) == ["train"] * 5
    assert set(assign_splits(["a", "b"], ["a", "b"], {"train": 0.9, "valid": 0.1})) == {"train", "valid"}
