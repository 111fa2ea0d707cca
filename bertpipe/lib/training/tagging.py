"""Tag schemes (BIO, IOB1, BIOES, BMES), their repair, and the mapping between character spans and word pieces.

Everything NER-shaped inside bertpipe is a list of character spans ``(start, end, type)`` over the original text;
tags exist only at the edges: when reading tagged files, when labelling word pieces for training, and when scoring
with seqeval on the source tokens.
"""

from __future__ import annotations

import unicodedata
from itertools import accumulate
from typing import Sequence

IGNORE = -100  # label of pieces the loss skips (special tokens, non-first pieces of a word)


class TagError(ValueError):
    def __init__(self, index: int, message: str):
        super().__init__(message)
        self.index, self.message = index, message


def _split(tag: str, index: int) -> tuple[str, str]:
    if tag == "O":
        return "O", ""
    if len(tag) > 2 and tag[1] in "-_" and tag[0] in "BIMESL":
        return tag[0], tag[2:]
    raise TagError(index, f"tag {tag!r} is neither O nor PREFIX-TYPE")


def tags_to_spans(tags: Sequence[str], scheme: str, repair: bool = True) -> tuple[list[tuple[int, int, str]], int]:
    """Token spans ``(start, end_exclusive, type)`` from tags; ``repair`` fixes invalid sequences and counts them.

    Repairs: an inside/end tag with no open entity of its type starts one; an entity still open at O, at a new begin
    or at the end of the sentence is closed. With ``repair=False`` the first such tag raises ``TagError``.
    """
    spans: list[tuple[int, int, str]] = []
    repaired = 0
    open_start, open_type = -1, ""
    inside = {"BIO": "I", "IOB1": "I", "BIOES": "I", "BMES": "M"}[scheme]
    single = {"BIOES": "S", "BMES": "S"}.get(scheme, "")
    end = {"BIOES": "E", "BMES": "E"}.get(scheme, "")

    def bad(i: int, msg: str) -> None:
        nonlocal repaired
        if not repair:
            raise TagError(i, f"invalid {scheme} sequence: {msg}")
        repaired += 1

    def close(i: int) -> None:
        nonlocal open_start, open_type
        if open_start >= 0:
            spans.append((open_start, i, open_type))
        open_start, open_type = -1, ""

    for i, tag in enumerate(tags):
        if tag == "O" and open_start < 0:  # the common case, kept cheap
            continue
        p, t = _split(tag, i)
        if p not in ("O", "B", inside, single or "B", end or inside):
            raise TagError(i, f"tag {tag!r}: prefix {p!r} is not part of the {scheme} scheme")
        if p == "O":
            if open_start >= 0 and end:
                bad(i, f"entity {open_type} at token {open_start} is not closed by {end}-{open_type}")
            close(i)
        elif p == "B":
            if open_start >= 0 and end:
                bad(i, f"entity {open_type} at token {open_start} is not closed by {end}-{open_type}")
            close(i)
            open_start, open_type = i, t
        elif single and p == single:
            if open_start >= 0:
                bad(i, f"entity {open_type} at token {open_start} is not closed by {end}-{open_type}")
            close(i)
            spans.append((i, i + 1, t))
        elif p == inside or (end and p == end):
            if open_start < 0 or open_type != t:
                if not (scheme == "IOB1" and p == "I"):  # IOB1 starts entities with I
                    bad(i, f"{tag!r} without an open {t} entity")
                close(i)
                open_start, open_type = i, t
            if end and p == end:
                close(i + 1)
    if open_start >= 0 and end:
        bad(len(tags) - 1, f"entity {open_type} at token {open_start} is not closed at the end of the sentence")
    close(len(tags))
    return spans, repaired


def label_names(types: Sequence[str], scheme: str) -> list[str]:
    """Model labels for entity ``types``: O first, then B-/I- (and E-/S- for BIOES) per type."""
    prefixes = "BI" if scheme == "BIO" else "BIES"
    return ["O"] + [f"{p}-{t}" for t in types for p in prefixes]


def _is_cjk(ch: str) -> bool:
    return "CJK" in unicodedata.name(ch, "") or unicodedata.east_asian_width(ch) in ("W", "F")


def join_tokens(tokens: Sequence[str], mode: str = "auto") -> tuple[str, list[tuple[int, int]]]:
    """The text of a tokenised sentence and each token's character range in it."""
    if mode == "none" or (mode == "auto" and all(len(t) == 1 for t in tokens)):
        ends = list(accumulate(len(t) for t in tokens))
        return "".join(tokens), [(e - len(t), e) for t, e in zip(tokens, ends)]
    parts, units, pos = [], [], 0
    for i, tok in enumerate(tokens):
        if i and mode != "none" and not (mode == "auto" and _is_cjk(parts[-1][-1]) and _is_cjk(tok[0])):
            parts.append(" ")
            pos += 1
        parts.append(tok)
        units.append((pos, pos + len(tok)))
        pos += len(tok)
    return "".join(parts), units


def spans_to_unit_tags(units: Sequence[tuple[int, int]], spans: Sequence[tuple[int, int, str]]) -> list[str]:
    """IOB2 tags over ``units`` (token character ranges): a unit starting inside a span belongs to it."""
    tags = ["O"] * len(units)
    for a, b, t in spans:
        first = True
        for i, (s, _e) in enumerate(units):
            if a <= s < b:
                tags[i] = f"{'B' if first else 'I'}-{t}"
                first = False
    return tags


def word_first_mask(word_ids: Sequence[int | None]) -> list[bool]:
    out, prev = [], None
    for w in word_ids:
        out.append(w is not None and w != prev)
        prev = w
    return out


def align_labels(
    offsets: Sequence[tuple[int, int]],
    word_ids: Sequence[int | None],
    spans: Sequence[tuple[int, int, str]],
    label2id: dict[str, int],
    scheme: str = "BIO",
    label_all_pieces: bool = False,
) -> tuple[list[int], int]:
    """Label ids for word pieces from character spans, and how many spans no labelled piece starts inside.

    Pieces with ``word_ids`` None (special tokens) and, unless ``label_all_pieces``, the non-first pieces of a word
    get ``IGNORE``.
    """
    first = word_first_mask(word_ids)
    labelled = [
        i
        for i, w in enumerate(word_ids)
        if w is not None and (first[i] or label_all_pieces) and offsets[i][1] > offsets[i][0]
    ]
    labels = [IGNORE] * len(offsets)
    for i in labelled:
        labels[i] = label2id["O"]
    lost = 0
    for a, b, t in spans:
        inside = [i for i in labelled if a <= offsets[i][0] < b]
        if not inside:
            lost += 1
            continue
        for k, i in enumerate(inside):
            if scheme == "BIOES" and len(inside) == 1:
                p = "S"
            elif k == 0:
                p = "B"
            elif scheme == "BIOES" and k == len(inside) - 1:
                p = "E"
            else:
                p = "I"
            labels[i] = label2id[f"{p}-{t}"]
    return labels, lost


def decode_pieces(
    labels: Sequence[str | None], offsets: Sequence[tuple[int, int]], word_ids: Sequence[int | None]
) -> list[tuple[int, int, str]]:
    """Character spans from per-piece predicted labels (None where a piece was not scored).

    The scheme is read from the labels (BIO or BIOES, invalid sequences repaired the usual way); an entity ends at
    the end of the last piece of the word holding its last labelled piece, so first-piece labelling covers whole words.
    """
    word_end: dict[int, int] = {}
    for i, w in enumerate(word_ids):
        if w is not None:
            word_end[w] = max(word_end.get(w, 0), offsets[i][1])
    idx = [i for i, lab in enumerate(labels) if lab is not None and word_ids[i] is not None]
    tags = [labels[i] for i in idx]
    scheme = "BIOES" if any(t[:2] in ("E-", "S-") for t in tags) else "BIO"
    tok_spans, _ = tags_to_spans(tags, scheme, repair=True)
    out = []
    for s, e, t in tok_spans:
        first, last = idx[s], idx[e - 1]
        out.append((offsets[first][0], word_end[word_ids[last]], t))
    return out


def word_units(offsets: Sequence[tuple[int, int]], word_ids: Sequence[int | None]) -> list[tuple[int, int]]:
    """Character ranges of the tokenizer's words: the units seqeval scores on when the data had no tokens."""
    units: dict[int, list[int]] = {}
    for (s, e), w in zip(offsets, word_ids):
        if w is not None and e > s:
            u = units.setdefault(w, [s, e])
            u[0], u[1] = min(u[0], s), max(u[1], e)
    return [tuple(units[w]) for w in sorted(units)]  # type: ignore[misc]
