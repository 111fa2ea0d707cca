"""Baselines: majority class, char n-gram TF-IDF + logistic regression, train-lexicon NER — scored like the models."""

from __future__ import annotations

import pytest

from tests import synthetic as S
from bertpipe.lib.labelled import Example
from bertpipe.lib.measures import baselines as BL


def _cls(rows, prefix):
    return [Example(id=f"{prefix}{i}", text=r["text"], label=r["label"]) for i, r in enumerate(rows)]


def test_majority_by_hand():
    train = [Example(id=str(i), text="x", label=lab) for i, lab in enumerate(["pos", "pos", "pos", "neg"])]
    test = [Example(id=str(i), text="y", label=lab) for i, lab in enumerate(["pos", "pos", "neg", "neg"])]
    r = BL.task_baselines("classification", {"train": train, "test": test}, ["neg", "pos"])["majority"]
    # always "pos": pos p 1/2 r 1 -> f1 2/3; neg f1 0; macro over both present classes
    assert r["accuracy"] == pytest.approx(0.5) and r["macro_f1"] == pytest.approx(1 / 3)


def test_tfidf_learns_a_keyword_task_majority_does_not():
    rows = S.keyword_classification(400, seed=3, labels=("pos", "neg", "mid"))
    train, test = _cls(rows[:300], "tr"), _cls(rows[300:], "te")
    r = BL.task_baselines("classification", {"train": train, "test": test})
    assert set(r) == {"majority", "tfidf"}
    assert r["tfidf"]["macro_f1"] > 0.9 and r["majority"]["macro_f1"] < 0.25
    assert r == BL.task_baselines("classification", {"train": train, "test": test})  # deterministic
    pairs = [Example(id=str(i), text=e.text[:10], text_pair=e.text[10:], label=e.label) for i, e in enumerate(train)]
    assert BL.task_baselines("pair_classification", {"train": pairs, "test": pairs})["tfidf"]["accuracy"] > 0.9


def _ner(text, ents):
    spans = []
    for s, t in ents:
        a = text.index(s)
        spans.append((a, a + len(s), t))
    return Example(id=text, text=text, spans=spans)


def test_lexicon_longest_match_drops_strings_that_are_rarely_entities():
    train = [
        _ner("张三在北京工作。", [("张三", "PER"), ("北京", "LOC")]),
        _ner("中美两国", [("中", "LOC"), ("美", "LOC")]),
        _ner("其中有三个", []),
        _ner("中间的人", []),
        _ner("北京大学很大", [("北京大学", "ORG")]),
    ]
    lex = BL.Lexicon.from_train(train)
    assert "中" not in lex.entries and lex.entries["张三"] == "PER" and lex.entries["美"] == "LOC"
    assert lex.match("北京大学的张三去北京") == [(0, 4, "ORG"), (5, 7, "PER"), (8, 10, "LOC")]
    test = [_ner("张三和李四在北京", [("张三", "PER"), ("李四", "PER"), ("北京", "LOC")]), _ner("其中", [])]
    r = BL.task_baselines("ner", {"train": train, "test": test})
    # lexicon finds 张三 and 北京 (2 of 3 gold, no false positives): p 1, r 2/3
    assert r["lexicon"]["precision"] == pytest.approx(1.0) and r["lexicon"]["recall"] == pytest.approx(2 / 3)
    assert r["lexicon"]["f1"] == pytest.approx(0.8) and r["majority"]["f1"] == 0.0
    assert BL.task_baselines("qa", {"train": train, "test": test}) == {}
