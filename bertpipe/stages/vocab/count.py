"""The counting pass of vocab mining, in parallel: jieba's words, the base tokenizer's pieces and [UNK] characters.

The train split streams in chunks of about ``CHUNK_CHARS`` characters to a pool of worker processes (one per core
of the stage's budget); each returns a :class:`Tally` of its chunk, which the parent adds to the running total in
submission order. Every count is a sum over texts, so the total is exactly what one process counting everything
gets, for any number of workers and any chunking.

Why exact counters merged in the parent, not a sketch (count-min, space-saving): the parent's memory is bounded by
the *distinct* candidate words, not by the corpus, and only word forms (CJK words for zh, alphabetic words for en,
stopwords out) are kept — the function words and single characters that make up most tokens are a total only. On a
Chinese corpus distinct words grow slowly with its size (Heaps' law); if they pass ``MAX_WORDS`` anyway, the rarest are
pruned the way lossy counting does (Manku & Motwani): every word counted at most ``t`` is dropped and ``t`` is added
to :attr:`Tally.undercount`, a bound on how much any kept frequency may be low. Candidates need ``min_freq`` (10-20)
and the ranking keeps the top 1-2k by frequency, far above such a floor, so ranked words are the same; the report
states the bound when it is not 0.

Workers import neither torch nor transformers: they get the tokenizer's Rust backend (``tokenizers.Tokenizer``,
picklable), whose ``encode_batch`` is what the transformers tokenizer calls.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import sys
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Iterable, Iterator, Sequence

CHUNK_CHARS = 400_000  # ~3 s of jieba per task: a fine-grained progress bar, little pickling per character
MAX_WORDS = 2_000_000  # distinct candidate words kept in the parent (~0.5 GB of Counters) before pruning
WORDPIECE, PIECES = "wordpiece", "pieces"  # how [UNK] characters are found (see mining.unk_forms)


@dataclass
class Settings:
    """What a worker needs to count a chunk; everything the parent derived from the transformers tokenizer."""

    backend: object  # tokenizers.Tokenizer
    language: str
    hmm: bool
    lower: bool  # ASCII words are keyed lower-cased (the base normaliser lower-cases)
    sentencepiece: bool
    stop: frozenset
    glossary: tuple  # (word, freq, pos) added to the private jieba dictionary
    glossary_keys: frozenset  # counted whatever their form
    rank: bool  # count words (False: only the [UNK] characters are wanted)
    unk_mode: str | None  # WORDPIECE, PIECES or None (no [UNK] characters wanted)
    unk_id: int | None


@dataclass
class Tally:
    words: Counter = field(default_factory=Counter)  # occurrences of each candidate word form
    aligned: Counter = field(default_factory=Counter)  # ... where the base has token boundaries at both edges
    cost: Counter = field(default_factory=Counter)  # SentencePiece: occurrences followed by text (a ▁ more)
    pieces: Counter = field(default_factory=Counter)  # base-token frequencies (the PMI denominators)
    unk: Counter = field(default_factory=Counter)  # characters that come out as [UNK]
    n_texts: int = 0
    n_chars: int = 0
    n_words: int = 0  # jieba words seen, whitespace excluded, of any form
    undercount: int = 0  # pruning: a kept word's count may be low by at most this

    def add(self, other: "Tally") -> None:
        for name in ("words", "aligned", "cost", "pieces", "unk"):
            getattr(self, name).update(getattr(other, name))
        self.n_texts += other.n_texts
        self.n_chars += other.n_chars
        self.n_words += other.n_words
        self.undercount += other.undercount

    def prune(self, max_words: int, keep: frozenset = frozenset()) -> None:
        """Drop the rarest words until at most half of ``max_words`` remain (lossy counting's step)."""
        if len(self.words) <= max_words:
            return
        hist = Counter(self.words.values())
        target, dropped, t = len(self.words) - max_words // 2, 0, 0
        for value in sorted(hist):
            dropped += hist[value]
            t = value
            if dropped >= target:
                break
        for w in [w for w, n in self.words.items() if n <= t and w not in keep]:
            del self.words[w]
            self.aligned.pop(w, None)
            self.cost.pop(w, None)
        self.undercount += t


_SEGMENTERS: dict[tuple, object] = {}


def make_segmenter(glossary: Sequence[tuple]):
    """A private jieba.Tokenizer with the glossary's (word, freq, pos) added, so mining never touches jieba's global
    dictionary. Kept per glossary for the process: loading jieba's dictionary costs about a second each time."""
    import jieba

    key = tuple(glossary)
    seg = _SEGMENTERS.get(key)
    if seg is None:
        jieba.setLogLevel(logging.WARNING)
        seg = jieba.Tokenizer()
        seg.initialize()
        for word, freq, pos in glossary:
            seg.add_word(word, freq, pos)
        if len(_SEGMENTERS) > 8:
            _SEGMENTERS.clear()
        _SEGMENTERS[key] = seg
    return seg


def is_cjk_char(ch: str) -> bool:
    """BERT's definition of a CJK character (the ranges its normaliser puts spaces around)."""
    cp = ord(ch)
    return (
        0x4E00 <= cp <= 0x9FFF
        or 0x3400 <= cp <= 0x4DBF
        or 0x20000 <= cp <= 0x2A6DF
        or 0x2A700 <= cp <= 0x2B73F
        or 0x2B740 <= cp <= 0x2B81F
        or 0x2B820 <= cp <= 0x2CEAF
        or 0xF900 <= cp <= 0xFAFF
        or 0x2F800 <= cp <= 0x2FA1F
    )


def is_cjk_word(w: str) -> bool:
    return bool(w) and all(is_cjk_char(c) for c in w)


def is_word_form(word: str, language: str) -> bool:
    if language == "zh":
        return is_cjk_word(word)
    return word.isascii() and word.isalpha()  # numbers and punctuation never qualify


def unk_char_counts(texts: Sequence[str], backend, mode: str | None, unk_id: int | None) -> Counter:
    """The characters of ``texts`` the base maps to [UNK] (WordPiece: a character whose form at its place, ``x`` or
    ``##x``, is missing; SentencePiece and other models: the characters an <unk> piece covers), with frequencies."""
    missing: Counter = Counter()
    if mode is None:
        return missing
    if mode == PIECES:
        for i in range(0, len(texts), 256):
            chunk = list(texts[i : i + 256])
            for text, enc in zip(chunk, backend.encode_batch(chunk, add_special_tokens=False)):
                for t, (a, b) in zip(enc.ids, enc.offsets):
                    if t == unk_id:
                        missing.update(c for c in text[a:b] if not c.isspace())
        return missing
    model = backend.model
    vocab = backend.get_vocab(with_added_tokens=True)
    prefix = model.continuing_subword_prefix
    max_chars = getattr(model, "max_input_chars_per_word", 100)
    normalize = backend.normalizer.normalize_str if backend.normalizer is not None else (lambda x: x)
    # Only texts holding a character without both vocab forms can produce [UNK]: find those characters first.
    chars: set[str] = set()
    for text in texts:
        chars.update(text)
    suspect = {
        c for c in chars if any(f not in vocab for n in normalize(c) if not n.isspace() for f in (n, prefix + n))
    }
    for text in texts:
        if suspect.isdisjoint(text):
            continue
        norm = normalize(text)
        words = backend.pre_tokenizer.pre_tokenize_str(norm) if backend.pre_tokenizer is not None else [(norm, None)]
        for w, _ in words:
            if len(w) > max_chars:
                continue
            for j, ch in enumerate(w):
                if (ch if j == 0 else prefix + ch) not in vocab:
                    missing[ch] += 1
    return missing


def count_chunk(texts: Sequence[str], s: Settings) -> Tally:
    """One chunk's tally: the base's token boundaries of each text and its piece frequencies, then jieba's words,
    each noting whether the base's tokens already start and end at its edges."""
    out = Tally(n_texts=len(texts), n_chars=sum(len(t) for t in texts))
    out.unk = unk_char_counts(texts, s.backend, s.unk_mode, s.unk_id)
    if not s.rank:
        return out
    seg = make_segmenter(s.glossary)
    words, aligned, cost = out.words, out.aligned, out.cost
    for i in range(0, len(texts), 256):
        chunk = list(texts[i : i + 256])
        for text, enc in zip(chunk, s.backend.encode_batch(chunk, add_special_tokens=False)):
            offsets = enc.offsets
            out.pieces.update(enc.ids)
            starts = {a for a, b in offsets if b > a}
            ends = {b for a, b in offsets if b > a}
            pos = 0
            for w in seg.cut(text, HMM=s.hmm):
                end = pos + len(w)
                if not w.isspace():
                    out.n_words += 1
                    # ASCII words are matched after normalisation (lower-cased); anything with other scripts is
                    # matched on the raw text (see extend.added_token), so it keeps its case.
                    k = w.lower() if s.lower and w.isascii() else w
                    if (is_word_form(k, s.language) and k not in s.stop) or k in s.glossary_keys:
                        words[k] += 1
                        if pos in starts and end in ends:
                            aligned[k] += 1
                        if s.sentencepiece and end < len(text) and not text[end].isspace():
                            cost[k] += 1
                pos = end
    return out


_WORKER: Settings | None = None


def _init_worker(settings: Settings) -> None:
    global _WORKER
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # one core per worker: the pool is the parallelism
    _WORKER = settings


def _count_in_worker(texts: list[str]) -> Tally:
    return count_chunk(texts, _WORKER)


def workers_budget() -> int:
    """Worker processes for mining: the stage's thread budget (``OMP_NUM_THREADS``, which the flow sets for a stage
    that runs beside others), else the cores this process may use. 1 in a daemonic process (a Dask worker's), which
    may not start children."""
    if multiprocessing.current_process().daemon:
        return 1
    env = os.environ.get("OMP_NUM_THREADS", "")
    if env.isdigit() and int(env) > 0:
        return int(env)
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


def chunks(batches: Iterable[Sequence[str]], max_chars: int, chunk_chars: int) -> Iterator[list[str]]:
    """The texts of ``batches`` regrouped into lists of about ``chunk_chars`` characters, stopping once
    ``max_chars`` (> 0) have been taken: a text is taken while fewer than ``max_chars`` precede it."""
    buf: list[str] = []
    size = total = 0
    for batch in batches:
        for t in batch:
            if max_chars and total >= max_chars:
                if buf:
                    yield buf
                return
            buf.append(t)
            size += len(t)
            total += len(t)
            if size >= chunk_chars:
                yield buf
                buf, size = [], 0
    if buf:
        yield buf


def tally(
    batches: Iterable[Sequence[str]],
    settings: Settings,
    *,
    max_chars: int = 0,
    workers: int | None = None,
    chunk_chars: int = CHUNK_CHARS,
    total_chars: int | None = None,
    total_bytes: int | None = None,
    max_words: int = MAX_WORDS,
) -> Tally:
    """The tally of every text of ``batches`` (up to ``max_chars``), counted on ``workers`` processes (None: the
    budget). For the progress bar's ETA: ``total_chars``, the characters to come, or ``total_bytes``, their UTF-8
    size (e.g. from the parquet footers), converted at the first chunk's bytes per character."""
    from tqdm import tqdm

    workers = 1 if multiprocessing.current_process().daemon else (workers or workers_budget())
    total = Tally()
    if max_chars and total_chars:
        total_chars = min(total_chars, max_chars)
    bar = tqdm(total=total_chars, desc="vocab: jieba", unit="char", unit_scale=True, file=sys.stderr,
               mininterval=2.0)

    def add(part: Tally) -> None:
        total.add(part)
        total.prune(max_words, settings.glossary_keys)
        bar.update(part.n_chars)

    stream = chunks(batches, max_chars, chunk_chars)
    first = next(stream, None)
    second = next(stream, None) if first is not None else None
    if total_chars is None and total_bytes and first:
        n_bytes = sum(len(t.encode("utf-8")) for t in first)
        estimate = int(total_bytes * sum(len(t) for t in first) / max(1, n_bytes))
        bar.total = min(estimate, max_chars) if max_chars else estimate
        bar.refresh()
    try:
        if second is None or workers <= 1:  # one chunk, or one core: a pool would only add its start-up
            for part in (first, second) if first is not None else ():
                if part is not None:
                    add(count_chunk(part, settings))
            for part in stream:
                add(count_chunk(part, settings))
            return total
        from concurrent.futures import ProcessPoolExecutor

        # spawn: the caller may hold threads (torch, Prefect) that a forked child would inherit half-locked.
        ctx = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(workers, mp_context=ctx, initializer=_init_worker, initargs=(settings,)) as pool:
            pending: deque = deque()
            for part in _prepend((first, second), stream):
                pending.append(pool.submit(_count_in_worker, part))
                # At most two chunks per worker in flight: the stream is read as fast as it is counted, no faster.
                while len(pending) >= 2 * workers:
                    add(pending.popleft().result())
            while pending:
                add(pending.popleft().result())
        return total
    finally:
        bar.close()


def _prepend(head: Sequence, rest: Iterator) -> Iterator:
    yield from head
    yield from rest
