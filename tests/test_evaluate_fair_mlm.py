"""The fair encoder comparison: the same words masked for every model, scored per masked character, on real tiny BERTs
with the real bert-base-chinese tokenizer."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from bertpipe.stages.evaluate.params import EvaluateParams
from tests.synthetic import tiny_encoder
from bertpipe.lib.measures import fair_mlm as F
from bertpipe.lib.measures import windows as W
from bertpipe.lib.measures.encoder_gate import encoder_gate_score
from tests.corpus import law_texts

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def texts(sample_raw):
    return law_texts(sample_raw, 24)


@pytest.fixture(scope="module")
def encoders(tmp_path_factory, zh_tokenizer_dir):
    root = tmp_path_factory.mktemp("fair")
    return {"a": tiny_encoder(root / "a", zh_tokenizer_dir, layers=1, hidden=32, seed=0),
            "b": tiny_encoder(root / "b", zh_tokenizer_dir, layers=1, hidden=32, seed=1), "root": root}


def _with_tokens(src, out, new_tokens, edit=None):
    """A copy of ``src`` with tokens added to its tokenizer and its embeddings resized (optionally edited)."""
    from transformers import AutoModelForMaskedLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(src))
    model = AutoModelForMaskedLM.from_pretrained(str(src))
    old = len(tok)
    tok.add_tokens(list(new_tokens))
    model.resize_token_embeddings(len(tok))
    with torch.no_grad():
        model.get_output_embeddings().bias[old:] = -1e4  # never predicted: the copy's distribution is the original's
        if edit:
            edit(model)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def test_spans_depend_only_on_texts_and_seed(texts):
    w1 = W.choose_windows(texts, 40, 0.15, seed=7)
    assert w1 == W.choose_windows(texts, 40, 0.15, seed=7)
    assert w1 != W.choose_windows(texts, 40, 0.15, seed=8)
    # a text's spans do not depend on which other texts are scored
    assert W.choose_windows(texts[3:4], 40, 0.15, seed=7) == [w for w in w1 if w[0] == texts[3][: len(w[0])]][:1]
    for window, spans in w1:
        assert 0 < len(window) <= 40 and spans == sorted(spans)
        assert all(any(ch.isalnum() for ch in window[a:b]) for a, b in spans)
    # the window ends on a jieba word boundary: the chosen words are whole
    from bertpipe.lib.textseg import jieba_spans

    for window, spans in w1:
        words = set(jieba_spans(window))
        assert all(s in words for s in spans)


def test_added_unused_tokens_do_not_change_the_score(encoders, texts, tmp_path):
    p = EvaluateParams(mlm_max_seq_len=64, mlm_batch_size=8)
    copy = _with_tokens(encoders["a"], tmp_path / "copy", ["甲乙丙丁戊己", "qqxzzy", "𠀀𠀁"])
    res = F.compare_encoders({"a": encoders["a"], "copy": copy}, texts, p, n_boot=200)
    a, c = res["a"], res["copy"]
    assert a["masked_chars"] == c["masked_chars"] > 0 and a["spans"] == c["spans"] and res["dropped_windows"] == 0
    assert c["nll_per_char"] == pytest.approx(a["nll_per_char"], rel=1e-6)
    assert res["delta"]["nll_per_char"] == pytest.approx(0.0, abs=1e-6)
    # a different model reads the same text and gets another number
    other = F.compare_encoders({"a": encoders["a"], "b": encoders["b"]}, texts, p, n_boot=200)
    assert other["a"] == a and other["b"]["masked_chars"] == a["masked_chars"]
    assert abs(other["b"]["nll_per_char"] - a["nll_per_char"]) > 1e-3
    lo, hi = other["delta"]["ci95"]
    assert lo <= other["delta"]["nll_per_char"] <= hi


def _uniform(model):
    """Every logit 0: each masked token costs exactly ln(vocabulary size) nats."""
    model.get_output_embeddings().weight.zero_()
    model.get_output_embeddings().bias.zero_()


def test_per_character_value_by_hand(encoders, tmp_path):
    from transformers import AutoTokenizer

    # base: one token per character; adapted: "专利权" is one token. Both predict uniformly over their vocabulary.
    base = _with_tokens(encoders["a"], tmp_path / "base", ["𠀀"], _uniform)
    adapted = _with_tokens(encoders["a"], tmp_path / "adapted", ["专利权"], _uniform)
    v_base, v_adapted = len(AutoTokenizer.from_pretrained(str(base))), len(AutoTokenizer.from_pretrained(str(adapted)))
    window = "保护专利权。"
    spans = [(2, 5)]  # "专利权"
    b = F.summarize(F.score_windows(base, [(window, spans)], 32), [(window, spans)])
    a = F.summarize(F.score_windows(adapted, [(window, spans)], 32), [(window, spans)])
    assert (b["masked_tokens"], b["masked_chars"], a["masked_tokens"], a["masked_chars"]) == (3, 3, 1, 3)
    assert b["nll_per_char"] == pytest.approx(3 * math.log(v_base) / 3, rel=1e-6)
    assert a["nll_per_char"] == pytest.approx(math.log(v_adapted) / 3, rel=1e-6)
    assert a["bits_per_char"] == pytest.approx(math.log2(v_adapted) / 3, rel=1e-6)
    # a token that only partly overlaps a chosen word is masked whole, and all its characters count
    part = F.summarize(F.score_windows(adapted, [(window, [(3, 4)])], 32), [(window, [(3, 4)])])
    assert (part["masked_tokens"], part["masked_chars"]) == (1, 3)


def test_windows_that_do_not_fit_are_dropped(encoders, texts):
    windows = W.choose_windows(texts[:6] + ["保护专利权。"], 60, 0.15, seed=0)
    scores = F.score_windows(encoders["a"], windows, max_len=30)
    assert any(s is None for s in scores) and any(s is not None for s in scores)
    summary = F.summarize(scores, windows)
    assert summary["windows"] == sum(s is not None for s in scores)


def test_seq_len_is_clamped_to_the_positions(encoders, texts, tmp_path):
    from transformers import AutoModelForMaskedLM, AutoTokenizer, BertConfig, BertForMaskedLM

    src = encoders["a"]
    cfg = BertConfig.from_pretrained(str(src))
    cfg.max_position_embeddings = 64
    short = tmp_path / "short"
    BertForMaskedLM(cfg).save_pretrained(short)
    AutoTokenizer.from_pretrained(str(src)).save_pretrained(short)
    assert AutoModelForMaskedLM.from_pretrained(str(short)).config.max_position_embeddings == 64
    notes = []
    long_texts = ["".join(texts)] * 3  # far longer than 64 tokens
    res = F.compare_encoders({"base": src, "adapted": short}, long_texts, EvaluateParams(mlm_max_seq_len=256),
                             log=notes.append, n_boot=50)
    assert res["window_chars"] == 62 and res["dropped_windows"] == 0 and res["adapted"]["masked_chars"] > 0
    assert any("evaluate.mlm_max_seq_len=256" in n and "64" in n for n in notes)


def test_gate_score_reads_the_domain_test_split(encoders, texts, tmp_path):
    corpus = tmp_path / "work" / "prepare" / "domain"
    corpus.mkdir(parents=True)
    pq.write_table(pa.table({"text": texts[:12]}), corpus / "test.parquet")
    pq.write_table(pa.table({"text": texts[12:]}), corpus / "valid.parquet")
    params = SimpleNamespace(evaluate=EvaluateParams(mlm_max_seq_len=64),
                             model=SimpleNamespace(base=str(encoders["a"])))
    cfg = SimpleNamespace(params=params, work=tmp_path / "work", path=lambda p: tmp_path / p, state=tmp_path / "state")
    name, value = encoder_gate_score(encoders["b"], cfg)
    direct = F.compare_encoders({"b": encoders["b"]}, texts[:12], params.evaluate)
    # a limit samples texts from the whole split, fixed by the seed, kept in file order
    sample = W.test_texts(corpus, 5, seed=0)
    assert sample == W.test_texts(corpus, 5, seed=0) != W.test_texts(corpus, 5, seed=1)
    assert len(sample) == 5 and sample != texts[:5] and sample == [t for t in texts[:12] if t in sample]
    assert name == "neg_nll_per_char" and value == pytest.approx(-direct["b"]["nll_per_char"], rel=1e-9)
    from bertpipe.infra.errors import BertpipeError

    pq.write_table(pa.table({"text": ["", "  "]}), corpus / "test.parquet")
    with pytest.raises(BertpipeError, match="test: no text"):
        encoder_gate_score(encoders["b"], cfg)
    (corpus / "test.parquet").unlink()
    with pytest.raises(BertpipeError, match="test.parquet"):
        encoder_gate_score(encoders["b"], cfg)


def test_a_headless_encoder_is_refused_not_scored_with_a_random_head(zh_tokenizer_dir, tmp_path):
    from bertpipe.infra.errors import BertpipeError

    headless = tiny_encoder(tmp_path / "headless", zh_tokenizer_dir, layers=1, hidden=32, with_mlm_head=False)
    with pytest.raises(BertpipeError, match="no masked-LM head"):
        F.score_windows(headless, [("保护专利权。", [(2, 5)])], 32)
