"""The extended tokenizer: added words are one token, everything else tokenises exactly as before, it round-trips
and reloads with AutoTokenizer alone."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from bertpipe.infra.errors import BertpipeError
from bertpipe.stages.vocab.extend import extend_tokenizer, load_tokenizer, tokenizer_stats
from bertpipe.stages.vocab.mining import unk_forms
from tests.test_vocab_helpers import legal_texts

WORDS_ZH = ["合同法", "违约金", "当事人", "人民法院", "不可抗力", "知识产权", "中华人民共和国", "法院", "民事"]
WORDS_EN = ["plaintiff", "indemnification", "subrogation", "estoppel"]

TRICKY = [
    "根据《中华人民共和国合同法》第107条，当事人应当承担违约责任。",
    "人民法院判决：被告支付违约金￥1,000,000.00元（壹佰万元整）",
    "ABC公司于2023年12月31日签订合同😀👍🏽，金额为3.14159亿元",
    "ＦＵＬＬ－ＷＩＤＴＨ　全角字符１２３与半角abc混排，ｐｌａｉｎｔｉｆｆ",
    "The Plaintiff's indemnification claim (subrogation) failed; plaintiffs & estoppel.",
    "nonplaintiff subrogationX estoppel_1 PLAINTIFF",
    "Café naïve résumé — “quotes” ‘single’ …",
    "民事法律行为、法院、民事诉讼法院",
    "",
    "   \t\n ",
    "㸃𠀀𪚥 rare CJK and ext-B characters",
    "Ａ股ｂ股\u3000港股 12.5% ±0.3 ℃ №5",
]


@pytest.fixture(scope="module")
def base(zh_tokenizer_dir):
    return load_tokenizer(zh_tokenizer_dir)


@pytest.fixture(scope="module")
def ext(base):
    forms = [f for f, _ in unk_forms(TRICKY, base, 1)]
    return extend_tokenizer(base, WORDS_ZH + WORDS_EN, forms)


def _expand(ids, base, ext):
    """Replace each added-word id by the base pieces of its text."""
    out = []
    added = ext.get_added_vocab()
    for i in ids:
        tok = ext.convert_ids_to_tokens(i)
        if i >= len(base) and added.get(tok) == i:
            out.extend(base(tok, add_special_tokens=False)["input_ids"])
        else:
            out.append(i)
    return out


def test_added_words_are_single_tokens(base, ext):
    for w in WORDS_ZH + WORDS_EN:
        ids = ext(w, add_special_tokens=False)["input_ids"]
        assert len(ids) == 1 and ids[0] >= len(base), w
        assert len(base(w, add_special_tokens=False)["input_ids"]) > 1


def test_longest_match_and_case(ext):
    toks = ext.tokenize("中华人民共和国人民法院 The PLAINTIFF and Plaintiff")
    assert toks[:2] == ["中华人民共和国", "人民法院"]
    assert toks.count("plaintiff") == 2  # matched after lower-casing, like the vocab
    # Latin words are matched only as whole words: never inside a longer word.
    assert "plaintiff" not in ext.tokenize("nonplaintiff plaintiffs")


@pytest.mark.parametrize("text", TRICKY)
def test_everything_else_tokenises_as_before(base, ext, text):
    # Characters that made a word [UNK] in the base vocab split into pieces; everything else must not move.
    norm = base.backend_tokenizer.normalizer.normalize_str
    new_chars = {f.removeprefix("##") for f, _ in unk_forms(TRICKY, base, 1)}
    clean = "".join(c for c in text if not (set(norm(c).strip()) & new_chars))
    assert base.unk_token_id not in base(clean)["input_ids"]
    assert _expand(ext(clean, add_special_tokens=False)["input_ids"], base, ext) == base(
        clean, add_special_tokens=False
    )["input_ids"]


def test_real_legal_text_tokenises_as_before(sample_raw, base, ext):
    texts = legal_texts(sample_raw, 300, offset=2000)
    b = base(texts, add_special_tokens=False)["input_ids"]
    e = ext(texts, add_special_tokens=False)["input_ids"]
    assert sum(len(x) for x in e) < sum(len(x) for x in b)
    for bi, ei in zip(b, e):
        if base.unk_token_id not in bi:
            assert _expand(ei, base, ext) == bi


def test_unk_characters_get_pieces(base, ext):
    text = "㸃字与表情😀hi😀"
    assert base.unk_token_id in base(text)["input_ids"]
    toks = ext.tokenize(text)
    assert ext.unk_token not in toks
    assert "㸃" in toks and "##😀" in toks


@pytest.mark.parametrize("text", TRICKY)
def test_round_trip_equals_normalised_input(ext, text):
    norm = ext.backend_tokenizer.normalizer.normalize_str(text)
    decoded = ext.decode(ext(text, add_special_tokens=False)["input_ids"])
    assert "".join(decoded.split()) == "".join(norm.split())


def test_reload_with_autotokenizer_alone(tmp_path, ext):
    ext.save_pretrained(tmp_path)
    again = AutoTokenizer.from_pretrained(tmp_path)
    assert len(again) == len(ext)
    for text in TRICKY:
        assert again(text)["input_ids"] == ext(text)["input_ids"]
    assert again(TRICKY, padding=True)["input_ids"] == ext(TRICKY, padding=True)["input_ids"]


def test_english_tokenizer_without_added_words_is_unchanged(minilm_dir):
    base = load_tokenizer(minilm_dir)
    ext = extend_tokenizer(base, [], [])
    assert len(ext) == len(base)
    for text in TRICKY:
        assert ext(text)["input_ids"] == base(text)["input_ids"]


def test_stats(base, ext, sample_raw):
    texts = legal_texts(sample_raw, 200, offset=100)
    b, e = tokenizer_stats(base, texts, repeats=1), tokenizer_stats(ext, texts, repeats=1)
    assert e["tokens_per_char"] < b["tokens_per_char"] <= 1.0
    assert b["chars"] == e["chars"] > 0 and b["chars_per_s"] > 0


@pytest.mark.parametrize("src", ["does/not/exist", "bert-base-nonexistent-hub-id"])
def test_not_a_tokenizer(src, tmp_path):
    with pytest.raises(BertpipeError) as e:
        load_tokenizer(src)
    assert "not a tokenizer" in str(e.value)
    (tmp_path / "junk.txt").write_text("x")
    with pytest.raises(BertpipeError):
        load_tokenizer(tmp_path)


def test_mixed_script_and_latin_words(base):
    ext = extend_tokenizer(base, ["A股", "wto", "合同法"])
    # Non-ASCII words match the raw text as written; ASCII words match the lower-cased text as whole words.
    assert ext.tokenize("买A股 WTO规则 合同法") == ["买", "A股", "wto", "规", "则", "合同法"]
    assert ext.tokenize("WTOs") == base.tokenize("WTOs")
