"""Whole-word ids for tokenised text, so pretraining can mask whole words rather than single pieces.

A token's word is the union of two groupings, both taken from character offsets in the original text:

- the tokenizer's own pre-tokenised words (``word_ids``): ``##`` continuation pieces, digit runs and an added
  multi-character token each stay with their word;
- for Chinese, jieba's segmentation: the characters of one jieba word share an index, and an added token that spans
  several jieba words unites them.

Ids come from one ``tokenizer(texts, add_special_tokens=False)`` call, so they equal what training sees.
"""

from __future__ import annotations

from typing import Sequence

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
    offsets: Sequence[tuple[int, int]], pre_words: Sequence[int | None], spans: Sequence[tuple[int, int]] | None
) -> list[int]:
    n = len(offsets)
    uf = _UnionFind(n)
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
    adds jieba's segmentation on top of the tokenizer's own words; "en" uses the ``##`` continuation grouping only.
    """
    if language not in ("zh", "en"):
        raise ValueError(f"language must be 'zh' or 'en', got {language!r}")
    texts = list(texts)
    if not texts:
        return []
    enc = tokenizer(texts, add_special_tokens=False, return_offsets_mapping=True, verbose=False)
    results = []
    for b, text in enumerate(texts):
        ids = list(enc["input_ids"][b])
        offsets = [tuple(o) for o in enc["offset_mapping"][b]]
        pre_words = enc.word_ids(b)
        spans = jieba_spans(text, hmm=hmm) if language == "zh" and text else None
        results.append((ids, _word_index(offsets, pre_words, spans)))
    return results
