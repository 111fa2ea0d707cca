"""Text segmentation shared by every stage: sentences (Chinese first) and whole-word ids of tokenised text.

The one sentence splitter (pretraining segments) and the one whole-word tokenizer (vocab mining, pretraining,
the fair MLM comparison).

**Sentences** (Chinese first): what pretraining packs into segments.

**Whole words**, so pretraining can mask whole words rather than single pieces.

A token's word is the union of two groupings, both taken from character offsets in the original text:

- the tokenizer's own pre-tokenised words (``word_ids``): ``##`` continuation pieces, digit runs and an added
  multi-character token each stay with their word. For Chinese this is used with WordPiece only, which makes every
  CJK character a pre-token of its own: byte-level BPE and SentencePiece pre-tokenise at spaces, so a whole
  run of Chinese (a clause, often a sentence) would be one "word";
- for Chinese, jieba's segmentation: the characters of one jieba word share an index, a token that spans several
  jieba words (an added word, a BPE merge across words) unites them, and the pieces of one character (byte-level
  BPE splits a character into byte tokens) share it. jieba also cuts Latin runs out of mixed text ("BERT模型").

A token that covers only whitespace or nothing (SentencePiece's lone ``▁``, BPE's lone ``Ġ``) belongs to the word
after it, so it is masked with that word rather than as a word of its own.

Ids come from one ``tokenizer(texts, add_special_tokens=False)`` call, so they equal what training sees.
"""

from __future__ import annotations

import re
from typing import Sequence

# A sentence ends after a run of terminators (。！？；… and their half-width forms after NFKC), or after a period
# followed by whitespace (English), plus any closing quotes or brackets right after them; a newline always ends one.
_END = re.compile(r"(?:[。！？；!?;…]+|\.(?=\s|$))[”’\"'」』）)》】〕]*")


def split_sentences(text: str) -> list[str]:
    """``'他说：“好！”然后走了。'`` -> ``['他说：“好！”', '然后走了。']``; blank pieces are dropped."""
    out: list[str] = []
    for line in text.split("\n"):
        start = 0
        for m in _END.finditer(line):
            piece = line[start : m.end()].strip()
            if piece:
                out.append(piece)
            start = m.end()
        piece = line[start:].strip()
        if piece:
            out.append(piece)
    return out



_JIEBA = None


def _jieba():
    """jieba, imported and initialised once (its dictionary load takes ~1 s and logs to stderr)."""
    global _JIEBA
    if _JIEBA is None:
        import logging

        import jieba

        jieba.setLogLevel(logging.WARNING)
        jieba.initialize()
        _JIEBA = jieba
    return _JIEBA


def jieba_spans(text: str, hmm: bool = True) -> list[tuple[int, int]]:
    """Character spans ``[start, end)`` of jieba's words over ``text`` (whitespace included as its own words)."""
    spans = []
    pos = 0
    for w in _jieba().cut(text, HMM=hmm):
        spans.append((pos, pos + len(w)))
        pos += len(w)
    return spans


class _UnionFind:
    def __init__(self, n: int):
        self.parent = list(range(n))

    def find(self, i: int) -> int:
        while self.parent[i] != i:
            self.parent[i] = self.parent[self.parent[i]]
            i = self.parent[i]
        return i

    def union(self, a: int, b: int) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            # The smaller root wins so that a group's root is its first token.
            if ra < rb:
                self.parent[rb] = ra
            else:
                self.parent[ra] = rb


def _word_index(
    offsets: Sequence[tuple[int, int]], pre_words: Sequence[int | None] | None,
    spans: Sequence[tuple[int, int]] | None, text: str = "",
) -> list[int]:
    n = len(offsets)
    uf = _UnionFind(n)
    pre_words = pre_words or [None] * n
    for i, (s, e) in enumerate(offsets[:-1]):
        if e <= s or not text[s:e].strip():
            uf.union(i, i + 1)
    # Tokens from one pre-tokenised word (a word and its ## pieces, a digit run, an added token) stay together.
    last: dict[int, int] = {}
    for i, w in enumerate(pre_words):
        if w is None:
            continue
        if w in last:
            uf.union(last[w], i)
        last[w] = i
    if spans:
        # Map every character to its jieba word; a token joins every jieba word its characters touch.
        char_word: dict[int, int] = {}
        for k, (s, e) in enumerate(spans):
            for c in range(s, e):
                char_word[c] = k
        owner: dict[int, int] = {}
        for i, (s, e) in enumerate(offsets):
            for c in range(s, max(e, s + 1)):
                k = char_word.get(c)
                if k is None:
                    continue
                if k in owner:
                    uf.union(owner[k], i)
                else:
                    owner[k] = i
    out: list[int] = []
    renum: dict[int, int] = {}
    for i in range(n):
        r = uf.find(i)
        if r not in renum:
            renum[r] = len(renum)
        out.append(renum[r])
    return out


def tokenize_with_words(
    texts: Sequence[str], tokenizer, language: str = "zh", *, hmm: bool = True
) -> list[tuple[list[int], list[int]]]:
    """For each text: its token ids (no special tokens) and each token's whole-word index (0, 1, 2, ... in order).

    ``tokenizer`` must be a fast (tokenizers-backed) tokenizer: offsets tie tokens to characters. ``language`` "zh"
    adds jieba's segmentation (on top of the tokenizer's own words for WordPiece); "en" uses the tokenizer's
    pre-tokenised words (``##`` pieces, or the pieces between spaces for BPE and SentencePiece).
    """
    from bertpipe.lib.model_families import WORDPIECE, tokenizer_kind

    if language not in ("zh", "en"):
        raise ValueError(f"language must be 'zh' or 'en', got {language!r}")
    texts = list(texts)
    if not texts:
        return []
    enc = tokenizer(texts, add_special_tokens=False, return_offsets_mapping=True, verbose=False)
    own_words = language == "en" or tokenizer_kind(tokenizer) == WORDPIECE
    results = []
    for b, text in enumerate(texts):
        ids = list(enc["input_ids"][b])
        offsets = [tuple(o) for o in enc["offset_mapping"][b]]
        pre_words = enc.word_ids(b) if own_words else None
        spans = jieba_spans(text, hmm=hmm) if language == "zh" and text else None
        results.append((ids, _word_index(offsets, pre_words, spans, text)))
    return results
