"""Evaluate's fair-MLM comparison reads the test split's windows from a keyed store: built once (the same windows
and metrics as choosing them from the texts), read by the second evaluate and by the register gate without reading
or segmenting the test split again, and rebuilt when what they depend on changes. Register reads the gate scores
evaluate recorded for the same models instead of scoring them again."""

from __future__ import annotations

from types import SimpleNamespace

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from bertpipe.stages.evaluate import stage as evaluate_stage
from bertpipe.stages.evaluate.params import EvaluateParams
from tests.synthetic import tiny_encoder
from bertpipe.lib.measures import encoder_gate as G
from bertpipe.lib.measures import fair_mlm as F
from bertpipe.lib.measures import windows as W
from bertpipe.lib.measures.encoder_gate import encoder_gate_score
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
        assert all(len(rec.pop("key")) == 32 for rec in out["gate"].values())  # register's check (below)
        assert out == expected  # every summary, the delta, its interval and the gate scores: identical


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


def _no_scoring(monkeypatch):
    """Running a model over the windows fails the test."""
    def boom(*a, **k):
        raise AssertionError("a model was scored again")

    monkeypatch.setattr(F, "score_windows", boom)
    monkeypatch.setattr(G, "score_windows", boom)


def test_register_reads_the_gate_scores_evaluate_recorded(tmp_path, corpus, encoders, monkeypatch):
    import json
    import shutil

    from bertpipe.stages.register.gate import encoder_floor

    p = EvaluateParams(mlm_max_seq_len=64, mlm_max_texts=10, bootstrap_samples=0)
    params = SimpleNamespace(evaluate=p, model=SimpleNamespace(base=str(encoders["base"])))
    cfg = SimpleNamespace(params=params, work=tmp_path / "work", path=lambda q: tmp_path / q, state=tmp_path / "st")
    ctx = SimpleNamespace(inputs={"corpus": str(corpus), **encoders}, cfg=cfg, log=lambda m: None, counts={})
    evaluated = tmp_path / "work" / "evaluate"
    evaluated.mkdir(parents=True)
    out = evaluate_stage._encoder_comparison(ctx, p, ["base", "adapted"])
    (evaluated / "metrics.json").write_text(json.dumps({"encoder_comparison": out}))
    scored = {e: encoder_gate_score(encoders[e], cfg) for e in ("base", "adapted")}

    with monkeypatch.context() as m:
        _no_scoring(m)
        for e in ("base", "adapted"):  # the same number register would compute, read without running the model
            assert G.gate_score(encoders[e], cfg, evaluated) == (*scored[e], True)
        floor = encoder_floor(cfg, "majority", evaluated)
        assert floor.value == scored["base"][1] and "evaluate's score" in floor.source

    # Another model (the same weights, one config byte more), or other scoring settings: scored here, not read.
    other = tmp_path / "other"
    shutil.copytree(encoders["adapted"], other)
    (other / "config.json").write_text((other / "config.json").read_text() + "\n")
    assert G.gate_score(other, cfg, evaluated) == (*scored["adapted"], False)
    cfg.params.evaluate = p.model_copy(update={"mlm_batch_size": 4})
    name, value, read = G.gate_score(encoders["adapted"], cfg, evaluated)
    assert not read and value == pytest.approx(scored["adapted"][1], rel=1e-5)
