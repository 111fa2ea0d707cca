"""Metrics: classification, strict entity-level NER, CMRC-style QA (encoders: see test_evaluate_fair_mlm)."""

from __future__ import annotations

import pytest

from bertpipe.lib.measures import metrics as M


def test_classification_metrics_by_hand():
    gold = ["a", "a", "a", "b", "b", "c"]
    pred = ["a", "a", "b", "b", "c", "c"]
    flat, det = M.classification_metrics(gold, pred, ["a", "b", "c", "never"])
    assert flat["accuracy"] == pytest.approx(4 / 6)
    # a: p 1, r 2/3 -> f1 0.8; b: p 1/2, r 1/2 -> 0.5; c: p 1/2, r 1 -> 2/3; "never" has no support: left out
    assert flat["macro_f1"] == pytest.approx((0.8 + 0.5 + 2 / 3) / 3)
    assert det["confusion"]["matrix"] == [[2, 1, 0, 0], [0, 1, 1, 0], [0, 0, 1, 0], [0, 0, 0, 0]]
    assert det["per_class"]["c"]["recall"] == 1.0 and det["per_class"]["never"]["support"] == 0


def test_ner_metrics_are_strict_entity_level():
    gold = [["B-PER", "I-PER", "O", "B-LOC"], ["B-ORG", "I-ORG", "I-ORG"]]
    pred = [["B-PER", "I-PER", "O", "B-LOC"], ["B-ORG", "I-ORG", "O"]]  # ORG boundary wrong: no credit
    flat, det = M.ner_metrics(gold, pred)
    assert flat["precision"] == pytest.approx(2 / 3) and flat["recall"] == pytest.approx(2 / 3)
    assert flat["f1_ORG"] == 0.0 and flat["f1_PER"] == 1.0 and det["per_type"]["LOC"]["support"] == 1
    # strict mode: an entity starting with I- is not an entity at all
    flat, _ = M.ner_metrics([["B-PER", "I-PER"]], [["I-PER", "I-PER"]])
    assert flat["f1"] == 0.0


@pytest.mark.parametrize(
    "pred, answers, em, f1",
    [
        ("北京", ["北京"], 1.0, 1.0),
        ("北京。", ["北京"], 1.0, 1.0),  # punctuation ignored
        ("北京市", ["北京"], 0.0, 0.8),  # character-level: p 2/3, r 1
        ("上海", ["北京"], 0.0, 0.0),
        ("Patent Law", ["patent law"], 1.0, 1.0),  # English words are units, case-folded
        ("2021年6月1日", ["2021年6月1日起"], 0.0, 2 * 1 * (6 / 7) / (1 + 6 / 7)),  # units: 2021 年 6 月 1 日
        ("专利权人", ["专利权人的合法权益", "专利权人"], 1.0, 1.0),  # best over references
        ("", ["北京"], 0.0, 0.0),
        ("😀北京", ["北京"], 0.0, 2 * (2 / 3) * 1 / (2 / 3 + 1)),  # the emoji is one unit
    ],
)
def test_qa_exact_match_and_char_f1(pred, answers, em, f1):
    flat, _ = M.qa_metrics([pred], [answers])
    assert flat["exact_match"] == pytest.approx(em) and flat["f1"] == pytest.approx(f1)


def test_qa_unanswerable_examples_are_not_scored():
    flat, det = M.qa_metrics(["a", "b"], [["a"], []])
    assert flat == {"exact_match": 1.0, "f1": 1.0} and det["unanswerable_skipped"] == 1
