"""Domain word mining: segment the corpus with jieba, score candidates, find the characters the base vocab lacks."""

from __future__ import annotations

import logging
import math
import re
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

from tqdm import tqdm

from bertpipe import families
from bertpipe.errors import BertpipeError

# Multi-character function words that are frequent everywhere and carry no domain meaning.
STOPWORDS_ZH = frozenset(
    "我们 你们 他们 她们 它们 自己 这个 那个 这些 那些 这样 那样 这种 那种 什么 怎么 为什么 如何 因为 所以 但是 "
    "而且 并且 然后 如果 虽然 即使 还是 或是 已经 可能 一个 一些 没有 不是 就是 也是 还有 以及 之后 之前 时候 "
    "现在 非常 比较 一样 一下 一直 而是 只是 只有 其中 其他 这里 那里 哪里".split()
)
STOPWORDS_EN = frozenset(
    "the and that this with from have has had were was are been being which what when where who whom whose "
    "there their they them then than these those into onto upon about above below would could should shall "
    "will also only such other some any each more most very just because while however therefore".split()
)

# A candidate's occurrences where the base tokenizer already has token boundaries at the word's edges, at least.
ALIGNED_SHARE = 0.8

_POS = re.compile(r"^[A-Za-z]+$")


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


@dataclass
class GlossaryTerm:
    word: str
    freq: int | None
    pos: str | None
    source: str  # "file:line"


def read_glossary(path: Path) -> list[GlossaryTerm]:
    """Parse a jieba user dict ("term [freq] [pos]" per line). Blank lines are skipped; a file with no term fails."""
    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise BertpipeError(f"{path}: glossary file does not exist") from None
    except UnicodeDecodeError as e:
        raise BertpipeError(f"{path}: expected UTF-8 text ({e.reason} at byte {e.start})") from None
    terms = []
    for i, line in enumerate(lines, 1):
        fields = line.split()
        if not fields:
            continue
        where = f"{path}:{i}"
        word, freq, pos = fields[0], None, None
        rest = fields[1:]
        if len(rest) > 2:
            raise BertpipeError(f"{where}: expected 'term [freq] [pos]', got {len(fields)} fields")
        if rest and rest[0].isdigit():
            freq = int(rest.pop(0))
        if rest:
            if not _POS.match(rest[0]) or len(rest) > 1:
                raise BertpipeError(f"{where}: expected 'term [freq] [pos]' with an integer freq and a letters-only pos")
            pos = rest[0]
        terms.append(GlossaryTerm(word, freq, pos, where))
    if not terms:
        raise BertpipeError(f"{path}: glossary is empty (expected one 'term [freq] [pos]' per line)")
    return terms


_SEGMENTERS: dict[tuple, object] = {}


def make_segmenter(glossary: Sequence[GlossaryTerm]):
    """A private jieba.Tokenizer with the glossary terms added, so mining never touches jieba's global dictionary.

    Kept per glossary for the process: loading jieba's dictionary costs about a second each time.
    """
    import jieba

    key = tuple((t.word, t.freq, t.pos) for t in glossary)
    seg = _SEGMENTERS.get(key)
    if seg is None:
        jieba.setLogLevel(logging.WARNING)
        seg = jieba.Tokenizer()
        seg.initialize()
        for t in glossary:
            seg.add_word(t.word, t.freq, t.pos)
        if len(_SEGMENTERS) > 8:
            _SEGMENTERS.clear()
        _SEGMENTERS[key] = seg
    return seg


@dataclass
class Candidate:
    word: str  # the text added as a token (normalised form for English)
    freq: int
    pieces: list[int]  # base-tokenizer ids the word was split into
    pmi: float
    score: float
    glossary: bool = False


@dataclass
class MiningResult:
    candidates: list[Candidate]  # ranked, filtered, top_k applied, glossary terms included
    unk_forms: list[tuple[str, int]]  # vocab entries ("x" or "##x") for [UNK] characters, with their frequency
    n_texts: int = 0
    n_chars: int = 0
    n_words: int = 0  # jieba words seen (whitespace excluded)
    n_candidates: int = 0  # before top_k
    glossary_in_base: list[str] = field(default_factory=list)  # glossary terms already one token
    glossary_freq: dict[str, int] = field(default_factory=dict)  # jieba-word frequency of each glossary term
    seconds: float = 0.0


def _limit_chars(texts: Iterable[str], max_chars: int) -> list[str]:
    out, total = [], 0
    for t in texts:
        if max_chars and total >= max_chars:
            break
        out.append(t)
        total += len(t)
    return out


def _is_word_form(word: str, language: str) -> bool:
    if language == "zh":
        return is_cjk_word(word)
    return word.isascii() and word.isalpha()  # numbers and punctuation never qualify


def unk_forms(texts: Sequence[str], tokenizer, min_freq: int) -> list[tuple[str, int]]:
    """Vocab entries for the characters that make a word [UNK]: both "x" and "##x" (whichever are missing), with the
    character's frequency in ``texts``, most frequent first."""
    if min_freq <= 0:
        return []
    backend = tokenizer.backend_tokenizer
    model = backend.model
    vocab = tokenizer.get_vocab()
    prefix = getattr(model, "continuing_subword_prefix", None)
    max_chars = getattr(model, "max_input_chars_per_word", 100)
    if tokenizer.unk_token_id is None:  # byte-level BPE: every character has its bytes
        return []
    if prefix is None or families.tokenizer_kind(tokenizer) != families.WORDPIECE:
        return _unk_chars(texts, tokenizer, min_freq)
    normalize = backend.normalizer.normalize_str if backend.normalizer is not None else (lambda x: x)
    # Only texts holding a character without both vocab forms can produce [UNK]: find those characters first.
    chars: set[str] = set()
    for text in texts:
        chars.update(text)
    suspect = {
        c for c in chars if any(f not in vocab for n in normalize(c) if not n.isspace() for f in (n, prefix + n))
    }
    missing: Counter = Counter()
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
    out = []
    for ch, n in sorted(missing.items(), key=lambda x: (-x[1], x[0])):
        if n >= min_freq:
            out += [(f, n) for f in (ch, prefix + ch) if f not in vocab]
    return out


def _unk_chars(texts: Sequence[str], tokenizer, min_freq: int) -> list[tuple[str, int]]:
    """SentencePiece: the characters its <unk> covers in ``texts`` (each becomes an added token, so the text around
    it keeps its pieces), with their frequency, most frequent first."""
    unk = tokenizer.unk_token_id
    missing: Counter = Counter()
    for i in range(0, len(texts), 256):
        chunk = list(texts[i : i + 256])
        enc = tokenizer(chunk, add_special_tokens=False, return_offsets_mapping=True, verbose=False)
        for text, ids, offsets in zip(chunk, enc["input_ids"], enc["offset_mapping"]):
            for t, (a, b) in zip(ids, offsets):
                if t == unk:
                    missing.update(c for c in text[a:b] if not c.isspace())
    return [(ch, n) for ch, n in sorted(missing.items(), key=lambda x: (-x[1], x[0])) if n >= min_freq]


def mine(
    texts: Sequence[str],
    tokenizer,
    language: str,
    params,
    glossary: Sequence[GlossaryTerm] = (),
) -> MiningResult:
    """Rank domain words of ``texts`` (the train split) that the base ``tokenizer`` splits into 2..max_len pieces."""
    started = time.time()
    texts = _limit_chars(texts, params.max_chars)
    if params.top_k == 0 and not glossary:  # nothing to rank: only the [UNK] characters are wanted
        forms = unk_forms(texts, tokenizer, params.unk_char_min_freq)
        return MiningResult([], forms, len(texts), sum(len(t) for t in texts), seconds=time.time() - started)
    seg = make_segmenter(glossary)
    stop = (STOPWORDS_ZH if language == "zh" else STOPWORDS_EN) if params.stopwords else frozenset()
    backend = tokenizer.backend_tokenizer
    lower = bool(backend.normalizer is not None and backend.normalizer.normalize_str("A") == "a")

    def key(w: str) -> str:
        # ASCII words are matched after normalisation (lower-cased); anything with other scripts is matched on the
        # raw text (see extend.added_token), so it keeps its case.
        return w.lower() if lower and w.isascii() else w

    # One pass: the base's token boundaries of each text (and its piece frequencies, the denominator of each
    # candidate's PMI), then jieba's words, each noting whether the base's tokens already start and end at its edges.
    counts: Counter = Counter()
    aligned: Counter = Counter()  # occurrences where the base has token boundaries at both edges of the word
    cost: Counter = Counter()  # extra tokens the added word brings (SentencePiece: a ▁ before the text after it)
    piece_counts: Counter = Counter()
    sentencepiece = families.tokenizer_kind(tokenizer) == families.SENTENCEPIECE
    n_chars = 0
    batch = 256
    bar = tqdm(total=sum(len(t) for t in texts), desc="vocab: jieba", unit="char", unit_scale=True, file=sys.stderr)
    for i in range(0, len(texts), batch):
        chunk = list(texts[i : i + batch])
        enc = tokenizer(chunk, add_special_tokens=False, return_offsets_mapping=True, verbose=False)
        for text, ids, offsets in zip(chunk, enc["input_ids"], enc["offset_mapping"]):
            piece_counts.update(ids)
            starts = {a for a, b in offsets if b > a}
            ends = {b for a, b in offsets if b > a}
            pos = 0
            for w in seg.cut(text, HMM=params.hmm):
                end = pos + len(w)
                if not w.isspace():
                    k = key(w)
                    counts[k] += 1
                    if pos in starts and end in ends:
                        aligned[k] += 1
                    if sentencepiece and end < len(text) and not text[end].isspace():
                        cost[k] += 1
                pos = end
            n_chars += len(text)
            bar.update(len(text))
    bar.close()
    n_words = sum(counts.values())
    n_pieces = max(1, sum(piece_counts.values()))

    glossary_words = {key(t.word) for t in glossary}
    pool = [
        w
        for w, n in counts.items()
        if (n >= params.min_freq and _is_word_form(w, language) and w not in stop) or w in glossary_words
    ]
    for w in glossary_words:
        if w not in counts:
            pool.append(w)
    encoded = families.word_piece_ids(tokenizer, pool)  # as the words occur in text (no lone ▁ of their own)
    cands: list[Candidate] = []
    in_base: list[str] = []
    for w, pieces in zip(pool, encoded):
        is_gloss = w in glossary_words
        if len(pieces) <= 1:
            if is_gloss:
                in_base.append(w)
            continue
        if not is_gloss and len(pieces) > params.max_len:
            continue
        freq = counts.get(w, 0)
        pmi = (
            math.log(max(freq, 1) / n_pieces) - sum(math.log(max(piece_counts.get(p, 0), 1) / n_pieces) for p in pieces)
            if freq
            else 0.0
        )
        if not is_gloss and pmi < params.min_pmi:
            continue
        # Where the base's tokens straddle a word's edges (byte-level BPE and SentencePiece merge across jieba's
        # words), cutting the text at the word re-tokenises its neighbours; and a SentencePiece word costs a ▁ after
        # it. Words that would not save tokens on the train split are not added.
        saved = aligned[w] * (len(pieces) - 1) - cost[w]
        if not is_gloss and (aligned[w] < ALIGNED_SHARE * freq or saved <= 0):
            continue
        score = freq * pmi if params.score == "freq_pmi" else saved
        cands.append(Candidate(w, freq, list(pieces), pmi, score, is_gloss))
    n_candidates = len(cands)
    mined = sorted((c for c in cands if not c.glossary), key=lambda c: (-c.score, -c.freq, c.word))[: params.top_k]
    chosen = sorted([c for c in cands if c.glossary], key=lambda c: c.word) + mined
    forms = unk_forms(texts, tokenizer, params.unk_char_min_freq)
    return MiningResult(
        candidates=chosen,
        unk_forms=forms,
        n_texts=len(texts),
        n_chars=n_chars,
        n_words=n_words,
        n_candidates=n_candidates,
        glossary_in_base=sorted(in_base),
        glossary_freq={w: counts.get(w, 0) for w in glossary_words},
        seconds=time.time() - started,
    )
