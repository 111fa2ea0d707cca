"""Pretraining examples: documents -> sentences -> word-aligned token ids -> packed segments -> length-bucketed batches.

Without a pair objective, sentences are packed greedily into segments of up to ``max_seq_len`` tokens (RoBERTa's
FULL-SENTENCES: a segment may run on into the next document after a [SEP]). With NSP or SOP, a segment is
``[CLS] A [SEP] B [SEP]`` built inside one document as in BERT's create_pretraining_data, except that a chunk stops
before the sentence that would overflow it, so no text is truncated away (only a random NSP partner is cut to fit).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Iterable, Iterator, Sequence

import numpy as np

from bertpipe.infra.errors import BertpipeError
from bertpipe.lib.corpusio import read_texts  # noqa: F401 (the one corpus reader; callers use data.read_texts)
from bertpipe.lib.textseg import split_sentences, tokenize_with_words

DOC_CHUNK = 512  # documents tokenized per call: bounded memory, and max_train_examples stops early


@dataclass
class Example:
    ids: np.ndarray  # int32, with [CLS]/[SEP]
    words: np.ndarray  # int32 word index per token (unique within the example), -1 for special tokens
    n_first: int  # tokens of "[CLS] A [SEP]"; the rest has token_type 1
    pair_label: int = -100  # NSP: 0 IsNext, 1 random; SOP: 0 in order, 1 swapped; -100 without a pair objective

    def __len__(self) -> int:
        return len(self.ids)


# ---------------------------------------------------------------- reading and tokenizing


def _sentences(docs: list[str], tokenizer, language: str) -> list[list[tuple[np.ndarray, np.ndarray]]]:
    """Documents -> sentences -> (token ids, word index) per sentence; a pure function of each document, so it
    runs in worker processes (``bertpipe.stages.pretrain.tokstore``). Documents without a token are dropped."""
    per_doc = [split_sentences(d) for d in docs]
    flat = [s for sents in per_doc for s in sents]
    encoded = tokenize_with_words(flat, tokenizer, language) if flat else []
    out, k = [], 0
    for sents in per_doc:
        doc = []
        for ids, words in encoded[k : k + len(sents)]:
            if ids:
                doc.append((np.asarray(ids, np.int32), _renumber(words)))
        k += len(sents)
        if doc:
            out.append(doc)
    return out


def _renumber(words: Sequence[int]) -> np.ndarray:
    """Word indices 0..n-1 in order of appearance: a new word starts wherever the index changes."""
    w = np.asarray(words, np.int64)
    if len(w) == 0:
        return w.astype(np.int32)
    starts = np.ones(len(w), bool)
    starts[1:] = w[1:] != w[:-1]
    return (np.cumsum(starts) - 1).astype(np.int32)


def _split_long(ids: np.ndarray, words: np.ndarray, limit: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Cut a sentence longer than ``limit`` into pieces, at a word boundary when one is in the second half."""
    while len(ids) > limit:
        cut = limit
        while cut > limit // 2 and words[cut] == words[cut - 1]:
            cut -= 1
        if cut <= limit // 2:
            cut = limit
        yield ids[:cut], words[:cut]
        ids, words = ids[cut:], words[cut:] - words[cut]
    if len(ids):
        yield ids, words


# ---------------------------------------------------------------- packing


class Packer:
    """Turns documents (lists of tokenized sentences) into examples; fed document chunk by chunk."""

    def __init__(self, tokenizer, max_seq_len: int, pair_objective: str, cross_document: bool, seed: int):
        self.cls, self.sep = tokenizer.cls_token_id, tokenizer.sep_token_id
        if self.cls is None or self.sep is None:
            raise BertpipeError("tokenizer: expected a BERT-style tokenizer with [CLS] and [SEP] tokens")
        self.max_len = max_seq_len
        self.pair = pair_objective
        self.cross = cross_document and pair_objective == "none"
        self.rng = random.Random(seed)
        self.examples: list[Example] = []
        self._cur: list[tuple[np.ndarray, np.ndarray]] = []
        self._cur_len = 0
        self._docs: list[list[tuple[np.ndarray, np.ndarray]]] = []  # recent documents: NSP's random partners

    # -- single segments
    def _flush(self) -> None:
        while self._cur and self._cur[-1][1][0] < 0:  # no trailing document separator
            self._cur_len -= len(self._cur.pop()[0])
        if self._cur:
            ids, words = _concat(self._cur)
            self.examples.append(_single(self.cls, self.sep, ids, words))
        self._cur, self._cur_len = [], 0

    def _feed_single(self, doc) -> None:
        target = self.max_len - 2
        if self._cur and (not self.cross or self._cur_len + 1 >= target):
            self._flush()
        elif self._cur:
            self._cur.append((np.asarray([self.sep], np.int32), np.asarray([-1], np.int32)))
            self._cur_len += 1
        for sent in doc:
            for ids, words in _split_long(*sent, target):
                if self._cur_len + len(ids) > target:
                    self._flush()
                self._cur.append((ids, words))
                self._cur_len += len(ids)

    # -- pairs
    def _random_span(self, avoid: int, budget: int) -> list[tuple[np.ndarray, np.ndarray]]:
        choices = [i for i in range(len(self._docs)) if i != avoid] or [avoid]
        doc = self._docs[self.rng.choice(choices)]
        start = self.rng.randrange(len(doc))
        out, n = [], 0
        for ids, words in doc[start:]:
            if n >= budget:
                break
            out.append((ids[: budget - n], words[: budget - n]))
            n += len(out[-1][0])
        return out

    def _emit_pair(self, chunk, doc_index: int) -> int:
        """Emit one example from ``chunk``; returns how many trailing sentences were not used (NSP puts them back)."""
        target = self.max_len - 3
        halved = len(chunk) == 1
        if halved:  # one long sentence: halve it at a word boundary, so it can still be a true pair
            chunk = _halve(*chunk[0])
            if chunk is None:
                return 0
        a_end = self.rng.randint(1, len(chunk) - 1)
        a, b, unused, label = chunk[:a_end], chunk[a_end:], 0, 0
        if self.pair == "nsp":
            if self.rng.random() < 0.5:
                unused = 0 if halved else len(b)  # whole sentences go back for the next pair; half of one cannot
                a_len = sum(len(s[0]) for s in a)
                b, label = self._random_span(doc_index, max(target - a_len, 1)), 1
        elif self.rng.random() < 0.5:  # sop
            a, b, label = b, a, 1
        a_ids, a_words = _concat(a)
        b_ids, b_words = _concat(b)
        while len(a_ids) + len(b_ids) > target:  # longest-first truncation
            if len(a_ids) >= len(b_ids):
                a_ids, a_words = a_ids[:-1], a_words[:-1]
            else:
                b_ids, b_words = b_ids[:-1], b_words[:-1]
        if len(a_ids) and len(b_ids):
            self.examples.append(_pair(self.cls, self.sep, a_ids, a_words, b_ids, b_words, label))
        return unused

    def _feed_pair(self, doc, doc_index: int) -> None:
        target = self.max_len - 3
        sents = [p for s in doc for p in _split_long(*s, max(target - 1, 1))]
        chunk, n, i = [], 0, 0
        while i < len(sents):
            s = sents[i]
            if chunk and n + len(s[0]) > target:
                i -= self._emit_pair(chunk, doc_index)
                chunk, n = [], 0
                continue
            chunk.append(s)
            n += len(s[0])
            i += 1
        if chunk:
            self._emit_pair(chunk, doc_index)

    def feed(self, docs) -> None:
        if self.pair == "none":
            for doc in docs:
                self._feed_single(doc)
            return
        self._docs = (self._docs + list(docs))[-4 * DOC_CHUNK :]
        base = len(self._docs) - len(docs)
        for j, doc in enumerate(docs):
            self._feed_pair(doc, base + j)

    def drain(self) -> list[Example]:
        """The examples emitted since the last drain (so a streaming build holds only the current chunk's)."""
        out, self.examples = self.examples, []
        return out

    def finish(self) -> list[Example]:
        if self.pair == "none":
            self._flush()
        return self.drain()


def _halve(ids: np.ndarray, words: np.ndarray):
    """Split one sentence in two near its middle, at a word boundary where there is one; None if under 2 tokens."""
    if len(ids) < 2:
        return None
    starts = np.flatnonzero(np.diff(words) != 0) + 1
    mid = int(starts[np.argmin(np.abs(starts - len(ids) / 2))]) if len(starts) else len(ids) // 2
    return [(ids[:mid], words[:mid]), (ids[mid:], words[mid:] - words[mid])]


def _concat(parts) -> tuple[np.ndarray, np.ndarray]:
    """Concatenate sentences, shifting each one's word indices so they stay unique (separators stay -1)."""
    ids, words, offset = [], [], 0
    for i, w in parts:
        ids.append(i)
        words.append(np.where(w >= 0, w + offset, -1))
        if (w >= 0).any():
            offset += int(w.max()) + 1
    if not ids:
        return np.zeros(0, np.int32), np.zeros(0, np.int32)
    return np.concatenate(ids).astype(np.int32), np.concatenate(words).astype(np.int32)


def _single(cls: int, sep: int, ids, words) -> Example:
    return Example(
        np.concatenate([[cls], ids, [sep]]).astype(np.int32),
        np.concatenate([[-1], words, [-1]]).astype(np.int32),
        len(ids) + 2,
    )


def _pair(cls: int, sep: int, a_ids, a_words, b_ids, b_words, label: int) -> Example:
    shift = int(a_words.max()) + 1 if len(a_words) and a_words.max() >= 0 else 0
    b_words = np.where(b_words >= 0, b_words + shift, -1)
    return Example(
        np.concatenate([[cls], a_ids, [sep], b_ids, [sep]]).astype(np.int32),
        np.concatenate([[-1], a_words, [-1], b_words, [-1]]).astype(np.int32),
        len(a_ids) + 2,
        label,
    )


def doc_chunks(batches: Iterable[list[str]], size: int = DOC_CHUNK) -> Iterator[list[str]]:
    """Re-cut a stream of text batches into chunks of ``size`` documents, the way ``build_examples`` cuts a list:
    NSP draws its random partners from the chunks' recent documents, so equal chunks mean equal examples."""
    buf: list[str] = []
    for batch in batches:
        buf.extend(batch)
        while len(buf) >= size:
            yield buf[:size]
            buf = buf[size:]
    if buf:
        yield buf


def pack(tokenized: Iterable[list], tokenizer, p, limit: int = 0, seed: int = 0) -> Iterator[list[Example]]:
    """Pack tokenized document chunks (``_sentences`` of each chunk, in order) into examples, yielded chunk by
    chunk; stop once ``limit`` examples exist (0: use every document)."""
    packer = Packer(tokenizer, p.max_seq_len, p.pair_objective, p.cross_document, seed)
    total = 0
    for docs in tokenized:
        packer.feed(docs)
        got = packer.drain()
        yield got[: limit - total] if limit else got
        total += len(got)
        if limit and total > limit:  # as many as asked: the rest of the corpus is never tokenized
            return
    last = packer.finish()
    yield last[: max(limit - total, 0)] if limit else last


def build_examples(texts: list[str], tokenizer, language: str, p, limit: int = 0, seed: int = 0) -> list[Example]:
    """Pack ``texts`` (documents) into examples in memory (tests, benches; the stages use ``tokstore``)."""
    chunks = (_sentences(c, tokenizer, language) for c in doc_chunks([texts]))
    return [e for got in pack(chunks, tokenizer, p, limit, seed) for e in got]


# ---------------------------------------------------------------- batches


def epoch_batches(lengths: np.ndarray, batch_size: int, seed: int, epoch: int, bucket: bool) -> list[np.ndarray]:
    """The batches of one epoch, a pure function of (seed, epoch): shuffled, then (bucket) sorted by length within
    windows of 50 batches and the batches shuffled again, so each batch pads little yet the order stays random."""
    rng = np.random.default_rng([seed, epoch])
    order = rng.permutation(len(lengths))
    if bucket:
        window = batch_size * 50
        order = np.concatenate(
            [w[np.argsort(lengths[w], kind="stable")] for w in np.array_split(order, max(1, -(-len(order) // window)))]
        )
    batches = [order[i : i + batch_size] for i in range(0, len(order) - batch_size + 1, batch_size)]
    if bucket:
        batches = [batches[j] for j in rng.permutation(len(batches))]
    return batches


def collate(examples: Sequence[Example], pad_id: int) -> dict[str, "torch.Tensor"]:  # noqa: F821
    """Pad ``examples`` into one batch. When a row packs several documents, ``doc_ids`` numbers each token's
    document (1, 2, ...; 0 on padding) so attention stays inside it (``bertpipe.infra.attention``); a
    batch whose rows each hold one document has no ``doc_ids`` and runs with the plain padding mask."""
    import torch  # here, not at the top: the token store's tokenizer processes import this module without torch

    from bertpipe.infra.attention import document_ids

    n = max(len(e) for e in examples)
    b = len(examples)
    ids = np.full((b, n), pad_id, np.int64)
    words = np.full((b, n), -1, np.int64)
    types = np.zeros((b, n), np.int64)
    attn = np.zeros((b, n), np.int64)
    docs = np.zeros((b, n), np.int64)
    for i, e in enumerate(examples):
        k = len(e)
        ids[i, :k], words[i, :k], attn[i, :k] = e.ids, e.words, 1
        types[i, e.n_first : k] = 1
        docs[i, :k] = document_ids(e.words, k, e.n_first)
    out = {
        "input_ids": torch.from_numpy(ids),
        "word_ids": torch.from_numpy(words),
        "token_type_ids": torch.from_numpy(types),
        "attention_mask": torch.from_numpy(attn),
        "pair_labels": torch.tensor([e.pair_label for e in examples], dtype=torch.long),
    }
    if docs.max(initial=0) > 1:
        out["doc_ids"] = torch.from_numpy(docs)
    return out
