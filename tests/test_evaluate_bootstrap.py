"""Paired bootstrap intervals and the fast metric functions they recompute (checked against the finetune metrics)."""

from __future__ import annotations

import random

import numpy as np
import pytest

from bertpipe.lib.measures import bootstrap as B
from bertpipe.lib.measures import metrics as M
from bertpipe.lib.training import tagging as T


def test_macro_f1_matches_the_finetune_metric():
    rng = random.Random(0)
    labels = ["a", "b", "c", "d"]
    for _ in range(20):
        gold = [rng.choice(labels[:3]) for _ in range(rng.randint(1, 40))]
        pred = [rng.choice(labels) for _ in gold]
        assert B.macro_f1(gold, pred) == pytest.approx(M.classification_metrics(gold, pred, labels)[0]["macro_f1"])


def test_entity_f1_matches_seqeval_strict_on_aligned_spans():
    rng = random.Random(1)
    for _ in range(20):
        gold, pred, gold_tags, pred_tags = [], [], [], []
        for _ in range(rng.randint(1, 8)):
            n = rng.randint(4, 12)
            units = [(i, i + 1) for i in range(n)]

            def spans():
                out, i = [], 0
                while i < n - 1:
                    if rng.random() < 0.3:
                        j = rng.randint(i + 1, min(n, i + 3))
                        out.append((i, j, rng.choice(["PER", "LOC"])))
                        i = j
                    else:
                        i += 1
                return out

            g, p = spans(), spans()
            gold.append(g)
            pred.append(p)
            gold_tags.append(T.spans_to_unit_tags(units, g))
            pred_tags.append(T.spans_to_unit_tags(units, p))
        ref = M.ner_metrics(gold_tags, pred_tags)[0].get("f1", 0.0)
        assert B.entity_f1(gold, pred) == pytest.approx(ref)
    assert B.entity_f1([], []) == 0.0


def test_fast_replicates_equal_recomputing_the_metric():
    """The summed-counts shortcut gives exactly what recomputing the metric on each resample gives."""
    rng = random.Random(3)
    gold = [[(0, 2, "PER")] if rng.random() < 0.7 else [] for _ in range(60)]
    a = [g if rng.random() < 0.5 else [(1, 2, "PER")] for g in gold]
    b = [g if rng.random() < 0.8 else [] for g in gold]
    slow = lambda g, p: B.entity_f1(g, p)  # noqa: E731  (a plain function: recomputed per replicate)
    assert B.paired_deltas(gold, a, b, B.entity_f1, n=200, seed=4) == pytest.approx(
        B.paired_deltas(gold, a, b, slow, n=200, seed=4))
    pairs = [(rng.random(), rng.randint(1, 5)) for _ in gold]
    other = [(x * 1.1, c) for x, c in pairs]
    slow_ratio = lambda g, p: sum(x for x, _ in p) / sum(c for _, c in p)  # noqa: E731
    assert B.paired_deltas(gold, pairs, other, B.ratio, n=100) == pytest.approx(
        B.paired_deltas(gold, pairs, other, slow_ratio, n=100))


def test_qa_f1_matches_the_finetune_metric():
    answers = [["北京"], ["专利权人", "专利权人的合法权益"], [], ["2021年6月1日"]]
    preds = ["北京市", "专利权人", "anything", "2021年6月"]
    assert B.qa_f1(answers, preds) == pytest.approx(M.qa_metrics(preds, answers)[0]["f1"])


def test_paired_bootstrap_interval():
    rng = random.Random(2)
    gold = [rng.choice("ab") for _ in range(200)]
    weak = [g if rng.random() < 0.6 else ("b" if g == "a" else "a") for g in gold]
    strong = [g if rng.random() < 0.9 else ("b" if g == "a" else "a") for g in gold]
    r = B.paired_bootstrap(gold, weak, strong, B.macro_f1, n=500, seed=0)
    assert r == B.paired_bootstrap(gold, weak, strong, B.macro_f1, n=500, seed=0)  # fixed by the seed
    assert r["mean"] == pytest.approx(B.macro_f1(gold, strong) - B.macro_f1(gold, weak))
    lo, hi = r["ci95"]
    assert 0 < lo < r["mean"] < hi  # clearly better: the interval excludes zero
    same = B.paired_bootstrap(gold, weak, weak, B.macro_f1, n=200)
    assert same["mean"] == 0 and same["ci95"] == [0.0, 0.0]  # paired: identical systems never differ
    flipped = B.paired_bootstrap(gold, strong, weak, B.macro_f1, n=500, seed=0)
    assert flipped["ci95"] == pytest.approx([-hi, -lo])
    # unpaired noise would be far wider than the paired interval: the pairing is what makes it tight
    assert hi - lo < 0.2
    with pytest.raises(ValueError):
        B.paired_bootstrap(gold, weak, strong[:-1], B.macro_f1)


def test_seeds_widen_the_interval():
    ex = np.random.default_rng(0).normal(0.1, 0.01, 1000)
    one = B.seeds_and_examples([0.1], ex, 0.1)
    assert one == pytest.approx(B.percentile_ci(ex), abs=1e-12)
    many = B.seeds_and_examples([0.0, 0.1, 0.2], ex, 0.1)
    assert many[0] < one[0] - 0.03 and many[1] > one[1] + 0.03
    assert many == B.seeds_and_examples([0.0, 0.1, 0.2], ex, 0.1)


def test_register_pairs_and_resamples_as_evaluate_does():
    """Register's challenger − champion interval is the evaluate stage's bootstrap: the examples both prediction
    files hold, in the challenger's order, with the task type's statistic (QA included)."""
    from bertpipe.stages.register.scoring import paired_interval

    rng = random.Random(3)
    champion = [{"id": f"q{i}", "answers": ["北京大学"], "prediction": rng.choice(["北京大学", "北京", "上海"])}
                for i in range(30)]
    challenger = [{"id": f"q{i}", "answers": ["北京大学"], "prediction": rng.choice(["北京大学", "北京大学", "北京"])}
                  for i in reversed(range(30))]
    gold, ours, theirs = B.shared_examples("qa", challenger, champion + [{"id": "extra", "answers": ["x"],
                                                                          "prediction": "x"}])
    assert len(gold) == 30 and ours[0] == challenger[0]["prediction"] and theirs[0] == champion[-1]["prediction"]
    ci, note = paired_interval("qa", champion, challenger, 200, 7)
    assert list(ci) == B.paired_bootstrap(gold, theirs, ours, B.qa_f1, 200, 7)["ci95"] and "30 test examples" in note
    assert paired_interval("qa", champion[:10], challenger, 200, 7)[0] is None  # not every example scored by both
