"""Domain word mining: segment the corpus with jieba, score candidates, find the characters the base vocab lacks."""

from __future__ import annotations

import math
import re
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Sequence

from bertpipe.infra.errors import BertpipeError
from bertpipe.lib import model_families
from bertpipe.stages.vocab import count

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


def make_segmenter(glossary: Sequence[GlossaryTerm]):
    """A private jieba.Tokenizer with the glossary terms added (kept per glossary for the process)."""
    return count.make_segmenter(tuple((t.word, t.freq, t.pos) for t in glossary))


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
    undercount: int = 0  # the counts were pruned: a frequency may be low by at most this (count.Tally.prune)
    seconds: float = 0.0


def _unk_setup(tokenizer, min_freq: int) -> tuple[str | None, int | None]:
    """How [UNK] characters are found for ``tokenizer`` (count.WORDPIECE, count.PIECES or None) and its unk id."""
    if min_freq <= 0 or tokenizer.unk_token_id is None:  # byte-level BPE: every character has its bytes
        return None, None
    prefix = getattr(tokenizer.backend_tokenizer.model, "continuing_subword_prefix", None)
    if prefix is None or model_families.tokenizer_kind(tokenizer) != model_families.WORDPIECE:
        return count.PIECES, tokenizer.unk_token_id
    return count.WORDPIECE, tokenizer.unk_token_id


def _unk_entries(missing: Counter, tokenizer, mode: str | None, min_freq: int) -> list[tuple[str, int]]:
    """WordPiece: the vocab entries "x" and "##x" (whichever are missing) of each [UNK] character seen at least
    ``min_freq`` times; SentencePiece and others: the characters themselves (each becomes an added token, so the
    text around it keeps its pieces). Most frequent first."""
    ranked = [(ch, n) for ch, n in sorted(missing.items(), key=lambda x: (-x[1], x[0])) if n >= min_freq]
    if mode != count.WORDPIECE:
        return ranked
    vocab = tokenizer.get_vocab()
    prefix = tokenizer.backend_tokenizer.model.continuing_subword_prefix
    return [(f, n) for ch, n in ranked for f in (ch, prefix + ch) if f not in vocab]


def unk_forms(texts: Sequence[str], tokenizer, min_freq: int) -> list[tuple[str, int]]:
    """Vocab entries for the characters that make a word [UNK] in ``texts``, with the character's frequency, most
    frequent first (see _unk_entries)."""
    mode, unk_id = _unk_setup(tokenizer, min_freq)
    missing = count.unk_char_counts(list(texts), tokenizer.backend_tokenizer, mode, unk_id)
    return _unk_entries(missing, tokenizer, mode, min_freq)


def mine_batches(
    batches: Iterable[Sequence[str]],
    tokenizer,
    language: str,
    params,
    glossary: Sequence[GlossaryTerm] = (),
    **kw,
) -> MiningResult:
    """Rank domain words of the texts in ``batches`` (the train split, streamed) that the base ``tokenizer`` splits
    into 2..max_len pieces. ``kw`` goes to count.tally (workers, chunk_chars, total_chars/total_bytes, max_words)."""
    started = time.time()
    settings = count_settings(tokenizer, language, params, glossary)
    t = count.tally(batches, settings, max_chars=params.max_chars, **kw)
    return rank_tally(t, tokenizer, params, glossary, started)


def _glossary_keys(tokenizer, glossary: Sequence[GlossaryTerm]) -> set[str]:
    """Glossary terms as counted: ASCII words lower-cased when the base's normaliser lower-cases (see count)."""
    norm = tokenizer.backend_tokenizer.normalizer
    lower = bool(norm is not None and norm.normalize_str("A") == "a")
    return {t.word.lower() if lower and t.word.isascii() else t.word for t in glossary}


def count_settings(tokenizer, language: str, params, glossary: Sequence[GlossaryTerm] = ()) -> count.Settings:
    """What the counting workers need, derived from the transformers tokenizer and the vocab params."""
    norm = tokenizer.backend_tokenizer.normalizer
    unk_mode, unk_id = _unk_setup(tokenizer, params.unk_char_min_freq)
    return count.Settings(
        backend=tokenizer.backend_tokenizer,
        language=language,
        hmm=params.hmm,
        lower=bool(norm is not None and norm.normalize_str("A") == "a"),
        sentencepiece=model_families.tokenizer_kind(tokenizer) == model_families.SENTENCEPIECE,
        stop=(STOPWORDS_ZH if language == "zh" else STOPWORDS_EN) if params.stopwords else frozenset(),
        glossary=tuple((t.word, t.freq, t.pos) for t in glossary),
        glossary_keys=frozenset(_glossary_keys(tokenizer, glossary)),
        rank=not (params.top_k == 0 and not glossary),  # else only the [UNK] characters are wanted
        unk_mode=unk_mode,
        unk_id=unk_id,
    )


def rank_tally(t: count.Tally, tokenizer, params, glossary: Sequence[GlossaryTerm] = (),
               started: float | None = None) -> MiningResult:
    """The mining result of a tally (count.tally): candidates filtered, scored and ranked, [UNK] forms."""
    started = time.time() if started is None else started
    glossary_words = _glossary_keys(tokenizer, glossary)
    unk_mode, _ = _unk_setup(tokenizer, params.unk_char_min_freq)
    forms = _unk_entries(t.unk, tokenizer, unk_mode, params.unk_char_min_freq)
    if params.top_k == 0 and not glossary:
        return MiningResult([], forms, t.n_texts, t.n_chars, seconds=time.time() - started)
    counts, aligned, cost, piece_counts = t.words, t.aligned, t.cost, t.pieces
    n_pieces = max(1, sum(piece_counts.values()))
    pool = [w for w, n in counts.items() if n >= params.min_freq or w in glossary_words]
    for w in glossary_words:
        if w not in counts:
            pool.append(w)
    encoded = model_families.word_piece_ids(tokenizer, pool)  # as the words occur in text (no lone ▁ of their own)
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
    return MiningResult(
        candidates=chosen,
        unk_forms=forms,
        n_texts=t.n_texts,
        n_chars=t.n_chars,
        n_words=t.n_words,
        n_candidates=n_candidates,
        glossary_in_base=sorted(in_base),
        glossary_freq={w: counts.get(w, 0) for w in glossary_words},
        undercount=t.undercount,
        seconds=time.time() - started,
    )
