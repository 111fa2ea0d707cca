"""Evaluate's fair-MLM comparison reads the test split's windows from a keyed store: built once (the same windows
and metrics as choosing them from the texts), read by the second evaluate and by the register gate without reading
or segmenting the test split again, and rebuilt when what they depend on changes."""

from __future__ import annotations

from types import SimpleNamespace

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from bertpipe.evaluate import stage as evaluate_stage
from bertpipe.evaluate.params import EvaluateParams
from bertpipe.finetune.synthetic import tiny_encoder
from bertpipe.scoring import fair_mlm as F
from bertpipe.scoring import windows as W
from bertpipe.scoring.encoder_gate import encoder_gate_score
from tests.corpus import law_texts

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def encoders(tmp_path_factory, zh_tokenizer_dir):
    root = tmp_path_factory.mktemp("enc")
    return {"base": tiny_encoder(root / "base", zh_tokenizer_dir, layers=1, hidden=32, seed=0),
            "adapted": tiny_encoder(root / "adapted", zh_tokenizer_dir, layers=1, hidden=32, seed=1)}


@pytest.fixture
def corpus(tmp_path, sample_raw):
    root = tmp_path / "work" / "prepare" / "domain"
    (root / "test").mkdir(parents=True)
    texts = law_texts(sample_raw, 40)
    pq.write_table(pa.table({"text": texts[:25]}), root / "test" / "part-00000.parquet")
    pq.write_table(pa.table({"text": texts[25:]}), root / "test" / "part-00001.parquet")
    return root


def _no_retokenizing(monkeypatch):
    """Reading or segmenting the test split again fails the test."""
    def boom(*a, **k):
        raise AssertionError("the test split was read and segmented again")

    monkeypatch.setattr(W, "test_texts", boom)
    monkeypatch.setattr(W, "choose_windows", boom)


def test_windows_are_built_once_and_equal_choosing_them(tmp_path, corpus, monkeypatch):
    p = EvaluateParams(mlm_max_texts=30, mlm_seed=3)
    expected = W.choose_windows(W.test_texts(corpus, 30, 3), 60, p.mlm_mask_prob, 3)
    got, rec = W.open_windows(corpus, p, 60, tmp_path / "state")
    assert rec["built"] and got == expected and rec["texts"] == 30 and rec["windows"] == len(expected) > 20
    with monkeypatch.context() as m:
        _no_retokenizing(m)
        again, rec2 = W.open_windows(corpus, p, 60, tmp_path / "state")
    assert not rec2["built"] and rec2["key"] == rec["key"] and again == expected
    # another window length, seed or corpus is another store
    keys = {rec["key"]}
    for args in ((p, 40, corpus), (EvaluateParams(mlm_max_texts=30, mlm_seed=4), 60, corpus)):
        keys.add(W.open_windows(args[2], args[0], args[1], tmp_path / "state")[1]["key"])
    pq.write_table(pa.table({"text": ["另一个测试文本，用于检验。"] * 3}), corpus / "test" / "part-00001.parquet")
    changed = W.open_windows(corpus, p, 60, tmp_path / "state")[1]
    assert changed["built"] and len(keys | {changed["key"]}) == 4


def test_second_evaluate_reads_the_store_with_the_same_metrics(tmp_path, corpus, encoders, monkeypatch):
    p = EvaluateParams(mlm_max_texts=20, mlm_max_seq_len=64, bootstrap_samples=50)
    expected = F.compare_encoders(encoders, W.test_texts(corpus, 20, p.mlm_seed), p, n_boot=50)  # before the store
    expected["texts"] = 20

    def ctx():
        return SimpleNamespace(inputs={"corpus": str(corpus), **encoders}, cfg=SimpleNamespace(state=tmp_path / "st"),
                               log=lambda m: None, counts={})

    first = ctx()
    out1 = evaluate_stage._encoder_comparison(first, p, ["base", "adapted"])
    assert first.counts["window_store"]["test"]["built"]
    second = ctx()
    with monkeypatch.context() as m:
        _no_retokenizing(m)
        out2 = evaluate_stage._encoder_comparison(second, p, ["base", "adapted"])
    assert not second.counts["window_store"]["test"]["built"]
    assert second.counts["window_store"]["test"]["key"] == first.counts["window_store"]["test"]["key"]
    for out in (out1, out2):
        out.pop("verdict")
        assert out == expected  # every summary, the delta and its interval: identical


def test_register_gate_scores_read_one_store(tmp_path, corpus, encoders, monkeypatch):
    params = SimpleNamespace(evaluate=EvaluateParams(mlm_max_seq_len=64, mlm_max_texts=10),
                             model=SimpleNamespace(base=str(encoders["base"])))
    cfg = SimpleNamespace(params=params, work=tmp_path / "work", path=lambda p: tmp_path / p, state=tmp_path / "st")
    first = encoder_gate_score(encoders["adapted"], cfg)
    with monkeypatch.context() as m:  # the champion, then the base, on the same windows
        _no_retokenizing(m)
        assert encoder_gate_score(encoders["adapted"], cfg) == first
        encoder_gate_score(encoders["base"], cfg)
    assert len([d for d in (tmp_path / "st" / "tokstore").iterdir() if d.is_dir()]) == 1
