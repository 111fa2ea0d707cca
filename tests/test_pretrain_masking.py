"""Masking statistics: chosen share ~ mask_prob, the 80/10/10 split, whole words together, never specials/padding."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import AutoTokenizer

from bertpipe.graph.pipeline import load_config
from bertpipe.infra.errors import BertpipeError
from bertpipe.lib.mlm.data import build_examples, collate
from bertpipe.lib.mlm.masking import IGNORE, MaskSpec, mask_batch, normal_token_ids, seeded
from bertpipe.lib.mlm.params import PretrainParams
from tests.test_pretrain_support import english_texts, law_texts

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def zh(zh_tokenizer_dir, sample_raw):
    tok = AutoTokenizer.from_pretrained(zh_tokenizer_dir)
    ex = build_examples(law_texts(sample_raw, 400), tok, "zh", PretrainParams(max_seq_len=128))
    return tok, collate(ex, tok.pad_token_id)


@pytest.fixture(scope="module")
def en(minilm_dir):
    tok = AutoTokenizer.from_pretrained(minilm_dir)
    ex = build_examples(english_texts()[:300], tok, "en", PretrainParams(max_seq_len=128))
    return tok, collate(ex, tok.pad_token_id)


def _mask(tok, batch, spec, seed=0):
    return mask_batch(batch["input_ids"], batch["word_ids"], spec, tok.mask_token_id, normal_token_ids(tok), seeded(seed))


def _within(observed: float, p: float, n: int, sigmas: float = 5.0) -> bool:
    return abs(observed - p) <= sigmas * math.sqrt(p * (1 - p) / n) + 1e-9


@pytest.mark.parametrize("whole_word", [True, False])
@pytest.mark.parametrize("mask_prob,ratios", [(0.15, (0.8, 0.1, 0.1)), (0.2, (0.8, 0.1, 0.1)), (0.15, (0.5, 0.3, 0.2))])
def test_realised_rates(zh, mask_prob, ratios, whole_word):
    tok, batch = zh
    spec = MaskSpec(mask_prob, *ratios, whole_word=whole_word)
    ids, labels = _mask(tok, batch, spec)
    real = batch["word_ids"] >= 0
    chosen = labels != IGNORE
    n_words = int(sum(len(set(w[w >= 0].tolist())) for w in batch["word_ids"])) if whole_word else int(real.sum())
    assert n_words > 20000
    # words are drawn independently, so the token share is mask_prob in expectation; its spread is per word
    share = float(chosen.sum() / real.sum())
    assert _within(share, mask_prob, n_words, 6.0), share
    orig = batch["input_ids"]
    k = int(chosen.sum())
    to_mask = float(((ids == tok.mask_token_id) & chosen).sum()) / k
    kept = float(((ids == orig) & chosen).sum()) / k
    replaced = float(((ids != orig) & (ids != tok.mask_token_id) & chosen).sum()) / k
    assert _within(to_mask, ratios[0], k)
    # a random replacement can draw the original token again (1 in ~21k): it then counts as kept
    assert _within(kept, ratios[2], k, 6.0)
    assert _within(replaced, ratios[1], k, 6.0)
    assert torch.equal(labels[chosen], orig[chosen])
    assert not (ids != orig)[~chosen].any(), "an unchosen token was changed"


@pytest.mark.parametrize("lang", ["zh", "en"])
def test_whole_words_are_masked_together(zh, en, lang):
    tok, batch = zh if lang == "zh" else en
    _, labels = _mask(tok, batch, MaskSpec(0.2))
    chosen = labels != IGNORE
    words = batch["word_ids"]
    multi = 0
    for r in range(words.shape[0]):
        for w in words[r][words[r] >= 0].unique():
            sel = chosen[r][words[r] == w]
            assert sel.all() or not sel.any(), f"word {int(w)} of row {r} partly masked"
            multi += int(len(sel) > 1)
    assert multi > 100, "the corpus should have many multi-token words"
    if lang == "en":  # a ## piece belongs to the word before it
        toks = tok.convert_ids_to_tokens(batch["input_ids"][0].tolist())
        for i, t in enumerate(toks):
            if t.startswith("##"):
                assert words[0][i] == words[0][i - 1]


def test_specials_and_padding_never_chosen(zh):
    tok, batch = zh
    _, labels = _mask(tok, batch, MaskSpec(0.5, 1.0, 0.0, 0.0))
    special = torch.isin(batch["input_ids"], torch.tensor(tok.all_special_ids))
    assert not (labels[special] != IGNORE).any()
    assert not (labels[batch["attention_mask"] == 0] != IGNORE).any()
    assert ((labels != IGNORE).sum(1) > 0).all(), "every example must have a chosen token"


def test_mask_is_a_function_of_its_seed(zh):
    tok, batch = zh
    a = _mask(tok, batch, MaskSpec(), seed=1)
    b = _mask(tok, batch, MaskSpec(), seed=1)
    c = _mask(tok, batch, MaskSpec(), seed=2)
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
    assert not torch.equal(a[1], c[1])  # dynamic masking: another step, another mask


@pytest.mark.parametrize("text", ["", "   ", "😀", "今天天气很好😀👍，我们去公园吧！", "ＡＢＣ公司（全角）１２３４５号",
                                  "Hello wonderful world, 2023年的GDP增长了5.2%", "a" * 700])
def test_tricky_texts(zh, text):
    tok, _ = zh
    ex = build_examples([text, "第一条 为了规范合同行为，制定本法。"], tok, "zh", PretrainParams(max_seq_len=64))
    for e in ex:
        assert len(e.ids) <= 64 and len(e.ids) == len(e.words)
        assert e.ids[0] == tok.cls_token_id and e.ids[-1] == tok.sep_token_id
        assert (e.words[[0, -1]] == -1).all()
    batch = collate(ex, tok.pad_token_id)
    _, labels = _mask(tok, batch, MaskSpec())
    assert ((labels != IGNORE).sum(1) > 0).all()


@pytest.mark.parametrize("override", ["pretrain.mask_token_ratio=0.7", "base.keep_ratio=0.3", "pretrain.mask_prob=0.9",
                                      "pretrain.arch.heads=3"])
def test_bad_ratios_are_one_line_errors(tmp_path, override):
    with pytest.raises(BertpipeError) as e:
        load_config(None, None, [override])
    assert "\n" not in str(e.value) and override.split("=")[0].split(".")[0] in str(e.value)
