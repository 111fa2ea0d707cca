"""Tag schemes, repairs, and the character-span <-> word-piece mapping on mixed-script text."""

from __future__ import annotations

import pytest

from bertpipe.lib.training import tagging as T
from bertpipe.lib.training import windows as W


@pytest.fixture(scope="module")
def tok(zh_tokenizer_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(zh_tokenizer_dir))


@pytest.mark.parametrize(
    "tags, scheme, spans",
    [
        (["B-PER", "I-PER", "O", "B-LOC", "B-LOC", "I-LOC"], "BIO", [(0, 2, "PER"), (3, 4, "LOC"), (4, 6, "LOC")]),
        (["I-PER", "I-PER", "O", "I-LOC", "B-LOC"], "IOB1", [(0, 2, "PER"), (3, 4, "LOC"), (4, 5, "LOC")]),
        (["B-ORG", "I-ORG", "E-ORG", "S-LOC", "O"], "BIOES", [(0, 3, "ORG"), (3, 4, "LOC")]),
        (["B-ORG", "M-ORG", "M-ORG", "E-ORG", "O", "S-LOC", "B-PER", "E-PER"], "BMES",
         [(0, 4, "ORG"), (5, 6, "LOC"), (6, 8, "PER")]),
        ([], "BIO", []),
        (["O", "O"], "BMES", []),
    ],
)
def test_valid_tags_decode_without_repairs(tags, scheme, spans):
    got, repaired = T.tags_to_spans(tags, scheme, repair=False)
    assert got == spans and repaired == 0


@pytest.mark.parametrize(
    "tags, scheme, spans, repairs",
    [
        (["O", "I-PER", "I-PER"], "BIO", [(1, 3, "PER")], 1),  # I without B
        (["B-PER", "I-LOC"], "BIO", [(0, 1, "PER"), (1, 2, "LOC")], 1),  # type switch inside an entity
        (["B-ORG", "M-ORG", "O"], "BMES", [(0, 2, "ORG")], 1),  # never closed by E (as in the MSRA file)
        (["M-ORG", "E-ORG"], "BMES", [(0, 2, "ORG")], 1),
        (["B-LOC", "M-LOC"], "BMES", [(0, 2, "LOC")], 1),  # open at the end of the sentence
    ],
)
def test_invalid_tags_are_repaired_and_counted_or_raise(tags, scheme, spans, repairs):
    assert T.tags_to_spans(tags, scheme, repair=True) == (spans, repairs)
    with pytest.raises(T.TagError) as e:
        T.tags_to_spans(tags, scheme, repair=False)
    assert 0 <= e.value.index < len(tags)


@pytest.mark.parametrize("tags, scheme", [(["X-PER"], "BIO"), (["E-PER"], "BIO"), (["BPER"], "BIO"), (["I-PER"], "BMES")])
def test_unknown_prefixes_are_errors_even_when_repairing(tags, scheme):
    with pytest.raises(T.TagError):
        T.tags_to_spans(tags, scheme, repair=True)


@pytest.mark.parametrize(
    "tokens, mode, text",
    [
        (list("中国银行"), "auto", "中国银行"),
        (["EU", "rejects", "German", "call"], "auto", "EU rejects German call"),
        (["我", "爱", "New", "York", "😀"], "auto", "我爱 New York 😀"),
        (["北京", "大学", "Peking"], "auto", "北京大学 Peking"),
        (["ab", "cd"], "none", "abcd"),
    ],
)
def test_join_tokens_units_point_at_the_tokens(tokens, mode, text):
    got, units = T.join_tokens(tokens, mode)
    assert got == text
    assert [got[a:b] for a, b in units] == tokens


def _spans(text: str, *marks: tuple[str, str, int]) -> list[tuple[int, int, str]]:
    """Spans from (substring, type, which occurrence), so the cases stay readable."""
    out = []
    for sub, typ, nth in marks:
        start = -1
        for _ in range(nth + 1):
            start = text.index(sub, start + 1)
        out.append((start, start + len(sub), typ))
    return sorted(out)


MIXED = [
    (t, _spans(t, *m))
    for t, m in [
        ("我在Apple公司工作，去了New York。", [("Apple公司", "ORG", 0), ("New York", "LOC", 0)]),
        ("张三和Bob都住在北京", [("张三", "PER", 0), ("Bob", "PER", 0), ("北京", "LOC", 0)]),
        ("😀李四喜欢ＡＢＣ银行🎉", [("李四", "PER", 0), ("ＡＢＣ银行", "ORG", 0)]),
        ("全角：ＮＢＡ球星姚明，半角 NBA 球星", [("ＮＢＡ", "ORG", 0), ("姚明", "PER", 0), ("NBA", "ORG", 0)]),
        ("Unbelievable那个unaffordable的纽约", [("Unbelievable", "MISC", 0), ("纽约", "LOC", 0)]),
        ("北京上海北京", [("北京", "LOC", 0), ("上海", "LOC", 0), ("北京", "LOC", 1)]),  # adjacent-type entities stay apart
        ("", []),
        ("没有实体的句子。", []),
    ]
]


@pytest.mark.parametrize("text, spans", MIXED)
@pytest.mark.parametrize("scheme", ["BIO", "BIOES"])
@pytest.mark.parametrize("all_pieces", [False, True])
def test_alignment_and_span_mapping_round_trip(tok, text, spans, scheme, all_pieces):
    types = sorted({t for *_, t in spans}) or ["PER"]
    names = T.label_names(types, scheme)
    label2id = {n: i for i, n in enumerate(names)}
    (pc,) = W.encode_pieces(tok, [text])
    ids, lost = T.align_labels(pc.offsets, pc.word_ids, spans, label2id, scheme, all_pieces)
    assert lost == 0 and len(ids) == len(pc.ids)
    first = T.word_first_mask(pc.word_ids)
    if not all_pieces:  # only first pieces carry a label
        assert all((lab != T.IGNORE) == first[i] for i, lab in enumerate(ids))
    labels = [names[i] if i != T.IGNORE else None for i in ids]
    assert T.decode_pieces(labels, pc.offsets, pc.word_ids) == spans
    units = T.word_units(pc.offsets, pc.word_ids)
    assert T.spans_to_unit_tags(units, spans).count("O") == len(units) - sum(
        1 for a, b in units if any(s <= a < e for s, e, _ in spans)
    )


def test_a_span_inside_a_word_piece_is_counted_lost(tok):
    (pc,) = W.encode_pieces(tok, ["unaffordable"])
    label2id = {n: i for i, n in enumerate(T.label_names(["X"], "BIO"))}
    _, lost = T.align_labels(pc.offsets, pc.word_ids, [(3, 5, "X")], label2id)
    assert lost == 1


def test_bmes_file_tags_and_unit_tags_agree():
    tokens = list("中国银行在北京")
    tags = ["B-ORG", "M-ORG", "M-ORG", "E-ORG", "O", "B-LOC", "E-LOC"]
    spans, _ = T.tags_to_spans(tags, "BMES")
    text, units = T.join_tokens(tokens)
    char_spans = [(units[s][0], units[e - 1][1], t) for s, e, t in spans]
    assert [text[a:b] for a, b, _ in char_spans] == ["中国银行", "北京"]
    assert T.spans_to_unit_tags(units, char_spans) == ["B-ORG", "I-ORG", "I-ORG", "I-ORG", "O", "B-LOC", "I-LOC"]
