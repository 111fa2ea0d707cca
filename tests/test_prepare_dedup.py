"""Exact and near-duplicate detection on real law articles and reviews, with planted duplicates."""

from __future__ import annotations

import json
import random
from collections import Counter
import sqlite3
from pathlib import Path

import numpy as np
import pytest

from bertpipe.lib.cleaning.dedup import (
    components,
    exact_key,
    jaccard,
    keep_rank,
    minhash_signatures,
    natural_key,
    near_duplicates,
    ngram_hashes,
)

DATA = Path(__file__).parent / "data" / "prepare"
N = 5


def grams(t: str, n: int = N) -> set[str]:
    return {t[i : i + n] for i in range(len(t) - n + 1)} if len(t) >= n else ({t} if t else set())


def py_jaccard(a: str, b: str) -> float:
    x, y = grams(a), grams(b)
    return len(x & y) / len(x | y)


@pytest.fixture(scope="module")
def articles() -> list[str]:
    con = sqlite3.connect(DATA / "laws_small.db")
    rows = [r[0] for r in con.execute("SELECT article_text FROM articles ORDER BY id") if r[0] and len(r[0]) >= 30]
    con.close()
    return rows


@pytest.fixture(scope="module")
def distinct(articles) -> list[str]:
    """Real articles and reviews, greedily chosen so that every pair's 5-gram Jaccard is below 0.3."""
    reviews = [x for x in (DATA / "pos_small.txt").read_text(encoding="utf-8").split("\n") if len(x) >= 30]
    chosen: list[str] = []
    sizes: list[int] = []
    index: dict[str, list[int]] = {}  # n-gram -> chosen texts holding it, to count overlaps without all pairs
    for t in articles[::2] + reviews[:150]:
        g = grams(t)
        shared = Counter(k for x in g for k in index.get(x, ()))
        if all(c / (len(g) + sizes[k] - c) < 0.3 for k, c in shared.items()):
            for x in g:
                index.setdefault(x, []).append(len(chosen))
            chosen.append(t)
            sizes.append(len(g))
    assert len(chosen) > 300
    return chosen


@pytest.mark.parametrize(
    "texts",
    [
        ["abcdefg", "abcdefh", "x", "", "本法自公布之日起施行。", "abcdefg"],
        ["😀😀😀😀😀😀", "ＡＢＣＤＥＦ", "中文English混合text", "ab"],
        [""],
        ["一二三四"],  # shorter than n: one shingle for the whole text
    ],
)
def test_ngram_hashes_follow_the_ngram_sets(texts):
    hashes, offsets = ngram_hashes(texts, N)
    assert len(offsets) == len(texts) + 1
    table: dict[str, int] = {}
    for i, t in enumerate(texts):
        mine = hashes[offsets[i] : offsets[i + 1]].tolist()
        expected = [t[k : k + N] for k in range(len(t) - N + 1)] if len(t) >= N else ([t] if t else [])
        assert len(mine) == len(expected)
        for g, h in zip(expected, mine):
            assert table.setdefault(g, h) == h  # one n-gram, one hash, in every text
    assert len(set(table.values())) == len(table)  # and different n-grams, different hashes


def test_minhash_estimates_jaccard(articles):
    rng = random.Random(0)
    pairs = []
    for a in rng.sample(articles, 40):
        b = list(a)
        for _ in range(rng.randint(1, 8)):  # a few substitutions: Jaccard spread over 0.3-0.95
            k = rng.randrange(len(b))
            b[k] = "某"
        pairs.append((a, "".join(b)))
    texts = [t for p in pairs for t in p]
    h, o = ngram_hashes(texts, N)
    sig = minhash_signatures(h, o, 256, seed=3)
    est = np.array([(sig[2 * i] == sig[2 * i + 1]).mean() for i in range(len(pairs))])
    true = np.array([py_jaccard(a, b) for a, b in pairs])
    assert true.min() < 0.8 and true.max() > 0.8
    assert np.abs(est - true).mean() < 0.04
    idx = np.arange(len(pairs) * 2).reshape(-1, 2)
    assert np.allclose(jaccard(h, o, idx), true)


def test_no_false_pair_among_clearly_different_texts(distinct):
    nd = near_duplicates(distinct, N, 128, 0.7)
    assert len(nd.pairs) == 0, [(distinct[i][:30], distinct[j][:30]) for i, j in nd.pairs[:5]]


def _perturb(text: str, rng: random.Random, edits: int) -> str:
    chars = list(text)
    for _ in range(edits):
        k = rng.randrange(len(chars))
        op = rng.random()
        if op < 0.4:
            chars[k] = "甲"
        elif op < 0.7:
            chars.insert(k, "乙")
        else:
            del chars[k]
    return "".join(chars)


def test_planted_near_and_exact_duplicates_are_found(distinct):
    rng = random.Random(42)
    base = list(distinct)
    planted_near = []
    for i in rng.sample(range(len(base)), 25):
        if len(base[i]) < 80:
            continue
        copy = _perturb(base[i], rng, edits=max(1, len(base[i]) // 80))
        if py_jaccard(base[i], copy) >= 0.8:
            planted_near.append((i, len(base)))
            base.append(copy)
    assert len(planted_near) >= 10
    planted_exact = []
    for i in rng.sample(range(len(distinct)), 10):
        variant = " ".join(distinct[i]).upper() if rng.random() < 0.5 else distinct[i] + "  \n"
        planted_exact.append((i, len(base)))
        base.append(variant)

    for i, j in planted_exact:
        assert exact_key(base[i]) == exact_key(base[j])
    assert len({exact_key(t) for t in base}) == len(base) - len(planted_exact)

    survivors = [t for k, t in enumerate(base) if k not in {j for _, j in planted_exact}]
    nd = near_duplicates(survivors, N, 128, 0.7)
    found = {tuple(p) for p in nd.pairs.tolist()}
    # Survivor indices equal base indices for everything before the exact plants, which come last.
    assert set(planted_near) <= found
    assert found <= set(planted_near), found - set(planted_near)  # nothing else
    assert np.all(nd.similarity >= 0.7)


def test_labelled_sample_precision():
    """Hand-labelled laws.db pairs (tests/data/prepare/labelled_near_dup_pairs.jsonl): the detector's pairs among
    them are mostly real near-duplicates, and it finds nearly all labelled duplicates over the threshold."""
    lines = (DATA / "labelled_near_dup_pairs.jsonl").read_text(encoding="utf-8").splitlines()
    pairs = [json.loads(x) for x in lines[1:]]
    assert len(pairs) >= 100
    texts: list[str] = []
    index: dict[str, int] = {}
    for p in pairs:
        for side in ("a", "b"):
            if p[f"{side}_id"] not in index:
                index[p[f"{side}_id"]] = len(texts)
                texts.append(p[side])
    nd = near_duplicates(texts, N, 128, 0.7)
    found = {tuple(sorted(x)) for x in nd.pairs.tolist()}
    labelled = {tuple(sorted((index[p["a_id"]], index[p["b_id"]]))): p for p in pairs}
    hits = [p for k, p in labelled.items() if k in found]
    precision = sum(p["label"] for p in hits) / len(hits)
    over = [p for p in pairs if py_jaccard(p["a"], p["b"]) >= 0.7]
    recall = sum(1 for p in hits if p["label"]) / sum(p["label"] for p in over)
    print(f"labelled pairs: {len(pairs)}, detected {len(hits)}, precision {precision:.3f}, recall {recall:.3f}")
    assert len(hits) >= 100
    assert precision >= 0.95
    assert recall >= 0.9
    for p in pairs:  # the stored Jaccard is the one the detector computes
        assert abs(py_jaccard(p["a"], p["b"]) - p["jaccard"]) < 1e-3


def test_components_and_keep_policy():
    labels = components(6, np.array([[0, 1], [1, 2], [4, 5]]))
    assert labels[0] == labels[1] == labels[2] != labels[3]
    assert labels[4] == labels[5] != labels[0]
    docs = [
        {"id": "law:10", "status": "历史版本", "publish_date": "2020-01-01"},
        {"id": "law:9", "status": "现行有效", "publish_date": "2019-01-01"},
        {"id": "law:11", "status": "现行有效", "publish_date": "2021-01-01"},
        {"id": "law:2", "status": "现行有效", "publish_date": None},
        {"id": "law:3", "status": "已废止", "publish_date": "2024-01-01"},
    ]
    order = keep_rank(docs, ["现行有效"], ["-publish_date", "id"])
    assert [docs[i]["id"] for i in order] == ["law:11", "law:9", "law:2", "law:3", "law:10"]
    order = keep_rank(docs, [], ["id"])
    assert [docs[i]["id"] for i in order] == ["law:2", "law:3", "law:9", "law:10", "law:11"]
    assert natural_key("a:9") < natural_key("a:10") < natural_key(None)


def test_near_duplicates_is_deterministic(articles):
    a = near_duplicates(articles, N, 64, 0.6, seed=5)
    b = near_duplicates(list(articles), N, 64, 0.6, seed=5)
    assert np.array_equal(a.pairs, b.pairs)


@pytest.mark.parametrize("num_perm", [16, 64, 128, 256])
def test_lsh_params_make_datasketchs_choice(num_perm):
    """Own quadrature (no datasketch/scipy import in every worker), same (bands, rows) as datasketch's."""
    from datasketch.lsh import _optimal_param

    from bertpipe.lib.cleaning.dedup import lsh_params

    for threshold in (0.5, 0.7, 0.8, 0.9):
        for recall_weight in (0.5, 0.9):
            want = _optimal_param(threshold, num_perm, 1.0 - recall_weight, recall_weight)
            assert lsh_params(threshold, num_perm, recall_weight) == want, (threshold, num_perm, recall_weight)
