"""Mining: glossary parsing, candidate filters and ranking, [UNK] characters."""

from __future__ import annotations

import pytest

from bertpipe.infra.errors import BertpipeError
from bertpipe.stages.vocab.count import is_cjk_word
from bertpipe.stages.vocab.extend import load_tokenizer
from bertpipe.stages.vocab.mining import GlossaryTerm, mine_batches, read_glossary, unk_forms
from bertpipe.stages.vocab.params import VocabParams
from tests.test_vocab_helpers import legal_texts


@pytest.fixture(scope="module")
def zh(zh_tokenizer_dir):
    return load_tokenizer(zh_tokenizer_dir)


@pytest.fixture(scope="module")
def legal(sample_raw):
    return legal_texts(sample_raw, 400)


def test_read_glossary_formats(tmp_path):
    p = tmp_path / "g.txt"
    p.write_text("不可抗力 100 n\n知识产权\n\n民事法律行为 nz\n缔约过失 7\n", encoding="utf-8")
    terms = read_glossary(p)
    assert [(t.word, t.freq, t.pos) for t in terms] == [
        ("不可抗力", 100, "n"),
        ("知识产权", None, None),
        ("民事法律行为", None, "nz"),
        ("缔约过失", 7, None),
    ]
    assert terms[2].source == f"{p}:4"


@pytest.mark.parametrize(
    "text, expected",
    [
        ("", "glossary is empty"),
        ("\n   \n\t\n", "glossary is empty"),
        ("合同\n违约 金 10 n\n", "g.txt:2"),
        ("合同 10 n extra\n", "g.txt:1"),
        ("合同 n 10\n", "g.txt:1"),
        ("合同 1.5\n", "g.txt:1"),
    ],
)
def test_bad_glossary(tmp_path, text, expected):
    p = tmp_path / "g.txt"
    p.write_text(text, encoding="utf-8")
    with pytest.raises(BertpipeError) as e:
        read_glossary(p)
    assert expected in str(e.value)


def test_missing_and_binary_glossary(tmp_path):
    with pytest.raises(BertpipeError, match="does not exist"):
        read_glossary(tmp_path / "nope.txt")
    (tmp_path / "b.txt").write_bytes(b"\xff\xfe\x00bad")
    with pytest.raises(BertpipeError, match="UTF-8"):
        read_glossary(tmp_path / "b.txt")


def test_candidates_are_filtered_and_ranked(zh, legal):
    p = VocabParams(top_k=200, min_freq=5, max_len=4)
    r = mine_batches([legal], zh, "zh", p)
    assert 50 < len(r.candidates) <= 200 and r.n_candidates >= len(r.candidates)
    words = [c.word for c in r.candidates]
    assert len(set(words)) == len(words)
    for c in r.candidates:
        assert is_cjk_word(c.word) and 2 <= len(c.pieces) <= 4 and c.freq >= 5
        assert c.word not in ("我们", "他们", "这些")
        assert c.pmi >= 0
    scores = [c.score for c in r.candidates]
    assert scores == sorted(scores, reverse=True)
    assert "人民法院" in words or "当事人" in words


def test_savings_score_and_top_k(zh, legal):
    r = mine_batches([legal], zh, "zh", VocabParams(top_k=30, min_freq=5, score="savings"))
    assert len(r.candidates) == 30
    for c in r.candidates:
        assert c.score == c.freq * (len(c.pieces) - 1)
    assert mine_batches([legal], zh, "zh", VocabParams(top_k=0)).candidates == []


def test_glossary_terms_always_kept(zh, legal):
    gl = [GlossaryTerm("量子纠缠态", None, None, "g:1"), GlossaryTerm("法", None, None, "g:2")]
    r = mine_batches([legal], zh, "zh", VocabParams(top_k=5, min_freq=5), gl)
    words = {c.word: c for c in r.candidates}
    assert words["量子纠缠态"].glossary and len(r.candidates) == 6
    assert r.glossary_in_base == ["法"]


def test_english_mining_lowercases_and_skips_numbers(minilm_dir):
    tok = load_tokenizer(minilm_dir)
    texts = ["The Indemnitor shall indemnify the indemnitee; indemnitor 2023 x9y9z9."] * 5
    r = mine_batches([texts], tok, "en", VocabParams(top_k=10, min_freq=3))
    words = [c.word for c in r.candidates]
    assert "indemnitor" in words and "indemnitee" in words
    assert all(w.isalpha() and w == w.lower() for w in words)


def test_unk_forms(zh):
    forms = dict(unk_forms(["㸃㸃字 hi😀 😀", "正常文本"], zh, 1))
    assert forms["㸃"] == 2 and forms["##㸃"] == 2
    assert forms["😀"] == 2 and forms["##😀"] == 2
    assert "字" not in forms
    assert unk_forms(["㸃"], zh, 0) == [] and unk_forms(["㸃"], zh, 2) == []


def _mined(r):
    return [(c.word, c.freq, c.pieces, c.pmi, c.score, c.glossary) for c in r.candidates], r.unk_forms, (
        r.n_texts, r.n_chars, r.n_words, r.n_candidates)


def test_two_workers_mine_exactly_what_one_does(zh, legal):
    gl = [GlossaryTerm("量子纠缠态", None, None, "g:1"), GlossaryTerm("法", None, None, "g:2")]
    texts = legal + ["㸃㸃字 罕见的㸃"] * 3
    p = VocabParams(top_k=100, min_freq=3)
    one = mine_batches([texts], zh, "zh", p, gl, workers=1)
    # Small chunks: the texts go to the 2 processes in many pieces, merged in the parent.
    two = mine_batches([texts], zh, "zh", p, gl, workers=2, chunk_chars=5_000)
    assert _mined(two) == _mined(one)
    assert len(one.candidates) > 50 and dict(one.unk_forms)["㸃"] == 9 and one.undercount == 0


def test_max_chars_streams_a_prefix_of_the_batches(zh, legal):
    p = VocabParams(top_k=50, min_freq=3, max_chars=20_000)
    batches = [legal[i : i + 7] for i in range(0, len(legal), 7)]
    streamed = mine_batches(iter(batches), zh, "zh", p, workers=1, chunk_chars=3_000)
    taken, total = [], 0
    for t in legal:  # a text is taken while fewer than max_chars precede it
        if total >= 20_000:
            break
        taken.append(t)
        total += len(t)
    assert streamed.n_texts == len(taken) < len(legal)
    assert _mined(streamed) == _mined(mine_batches([taken], zh, "zh", VocabParams(top_k=50, min_freq=3), workers=1))


def test_pruned_counts_keep_the_frequent_words_and_bound_the_error(zh, legal):
    p = VocabParams(top_k=20, min_freq=3)
    exact = mine_batches([legal], zh, "zh", p, workers=1)
    pruned = mine_batches([legal], zh, "zh", p, workers=1, chunk_chars=2_000, max_words=400)
    assert exact.undercount == 0 < pruned.undercount
    every = mine_batches([legal], zh, "zh", VocabParams(top_k=100_000, min_freq=1), workers=1)
    true = {c.word: c.freq for c in every.candidates}
    for c in pruned.candidates:  # a kept count is low by at most the bound, never high
        assert true[c.word] - pruned.undercount <= c.freq <= true[c.word]
    # Frequent words rank the same way: the top of the pruned ranking is in the exact top 20.
    assert {c.word for c in pruned.candidates[:10]} <= {c.word for c in exact.candidates}
