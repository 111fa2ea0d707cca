"""Whole-word ids: the ids are the tokenizer's own, and every whole word (jieba / ## / digits) shares one index."""

from __future__ import annotations

import pytest
from tokenizers import AddedToken
from transformers import AutoTokenizer

from bertpipe.lib.textseg import jieba_spans, tokenize_with_words

TEXTS = [
    "根据合同法第107条规定，当事人应当支付违约金3000元。",
    "Hello wonderful world, 2023年的GDP增长了5.2%",
    "今天天气很好😀👍，我们去公园吧！",
    "ＡＢＣ公司（全角）１２３４５号",
    "中华人民共和国民法典 unbelievably long words",
    "",
    "   ",
    "😀",
]


@pytest.fixture(scope="module")
def zh_tok(zh_tokenizer_dir):
    return AutoTokenizer.from_pretrained(zh_tokenizer_dir)


def _check_shape(ids, words):
    assert len(ids) == len(words)
    if words:
        assert words[0] == 0
    for a, b in zip(words, words[1:]):
        assert b in (a, a + 1), words  # ordered, consecutive, and a word's tokens are contiguous


@pytest.mark.parametrize("text", TEXTS)
def test_ids_are_the_tokenizers_own(zh_tok, text):
    [(ids, words)] = tokenize_with_words([text], zh_tok, "zh")
    assert ids == zh_tok(text, add_special_tokens=False)["input_ids"]
    _check_shape(ids, words)


@pytest.mark.parametrize("text", TEXTS)
def test_continuation_pieces_share_their_words_index(zh_tok, text):
    for lang in ("zh", "en"):
        [(ids, words)] = tokenize_with_words([text], zh_tok, lang)
        toks = zh_tok.convert_ids_to_tokens(ids)
        for i, t in enumerate(toks):
            if t.startswith("##"):
                assert words[i] == words[i - 1], (lang, toks, words)


@pytest.mark.parametrize("text", [t for t in TEXTS if t.strip()])
def test_jieba_words_share_an_index_in_zh(zh_tok, text):
    [(ids, words)] = tokenize_with_words([text], zh_tok, "zh")
    offsets = zh_tok(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    for s, e in jieba_spans(text):
        inside = {words[i] for i, (a, b) in enumerate(offsets) if a < e and b > s}
        assert len(inside) <= 1, (text[s:e], inside)


def test_english_mode_gives_each_cjk_character_its_own_word(zh_tok):
    [(ids, words)] = tokenize_with_words(["规定 unbelievable"], zh_tok, "en")
    toks = zh_tok.convert_ids_to_tokens(ids)
    assert toks[:2] == ["规", "定"] and words[:2] == [0, 1]
    assert len(set(words[2:])) == 1 and len(toks) > 3  # one English word in several ## pieces


def test_digit_runs_are_one_word(zh_tok):
    [(ids, words)] = tokenize_with_words(["编号20231234567号"], zh_tok, "zh")
    toks = zh_tok.convert_ids_to_tokens(ids)
    digit_words = {w for t, w in zip(toks, words) if t.strip("#").isdigit()}
    assert len([t for t in toks if t.strip("#").isdigit()]) > 1 and len(digit_words) == 1


def test_added_token_spanning_jieba_words_unites_them(zh_tokenizer_dir):
    tok = AutoTokenizer.from_pretrained(zh_tokenizer_dir)
    text = "当事人可以约定违约金"
    # "事人可" crosses jieba's words 当事人 / 可以: its token must merge both into one word.
    assert not any(s < text.index("事") < e and e >= text.index("可") + 1 for s, e in jieba_spans(text))
    tok.add_tokens([AddedToken("事人可", normalized=False)])
    [(ids, words)] = tokenize_with_words([text], tok, "zh")
    toks = tok.convert_ids_to_tokens(ids)
    assert toks[:3] == ["当", "事人可", "以"]
    assert words[0] == words[1] == words[2]
    assert ids == tok(text, add_special_tokens=False)["input_ids"]


def test_batch_equals_one_by_one(zh_tok):
    batch = tokenize_with_words(TEXTS, zh_tok, "zh")
    assert batch == [tokenize_with_words([t], zh_tok, "zh")[0] for t in TEXTS]
    assert tokenize_with_words([], zh_tok) == []


def test_rejects_unknown_language(zh_tok):
    with pytest.raises(ValueError):
        tokenize_with_words(["x"], zh_tok, "fr")
