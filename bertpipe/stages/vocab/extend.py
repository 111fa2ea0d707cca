"""Tokenizer extension: a standard fast tokenizer that matches the new words, loadable with AutoTokenizer alone.

Mechanism (measured in bench/bench_vocab.py, see the stage report): domain words become *added tokens* of the
tokenizers library, which are matched in one Aho-Corasick pass (leftmost-longest) before normalisation and
pre-tokenisation, so BERT's habit of putting spaces around every CJK character cannot break them apart.

- Chinese words: ``normalized=False`` (matched on the raw text: the normaliser would space the characters out) and
  ``single_word=False`` (Chinese has no spaces). Each CJK character is its own pre-token in BERT, so cutting the
  text at a word's edges changes nothing else.
- Latin words: ``normalized=True`` (matched after lower-casing, like the vocab) and ``single_word=True`` (never
  inside a longer word), so the words around them keep their old pieces.
- Byte-level BPE (RoBERTa): Latin words also take the space before them (``lstrip``), which the base would have
  carried as the ``Ġ`` of the word's first piece; left outside, it would become a token of its own.
- SentencePiece (XLM-R, ALBERT): words as for WordPiece. transformers 5 rebuilds these tokenizers' pre-tokenizer
  (whitespace split, then Metaspace with prepend_scheme "always") on every load, so the text right after an added
  word starts with a ``▁`` piece of its own (measured: "根据法律规定，" -> "▁ 根据 法律规定 ▁ ，"); text holding no
  added word tokenises exactly as before.
- Characters the base vocab maps to [UNK] go into the WordPiece vocab itself ("x" and "##x"): a word containing
  them then splits into ordinary pieces instead of one [UNK], and no word that tokenised before can change, because
  every new entry contains a character the old vocab lacked.
"""

from __future__ import annotations

import json
import tempfile
import time
from pathlib import Path
from typing import Sequence

from tokenizers import AddedToken

from bertpipe.infra.errors import BertpipeError
from bertpipe.lib import model_families
from bertpipe.stages.vocab.count import is_cjk_word


def load_tokenizer(src: Path | str):
    """The base tokenizer from a save_pretrained dir or hub id; it must be a fast (tokenizers-backed) one."""
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(str(src))
    except Exception as e:  # transformers raises OSError/ValueError/KeyError/... for "not a tokenizer"
        raise BertpipeError(f"{src}: not a tokenizer (AutoTokenizer.from_pretrained failed: {type(e).__name__})") from None
    if not getattr(tok, "is_fast", False) or getattr(tok, "backend_tokenizer", None) is None:
        raise BertpipeError(f"{src}: expected a fast (tokenizers-backed) tokenizer, got {type(tok).__name__}")
    return tok


def added_token(word: str, kind: str = model_families.WORDPIECE) -> AddedToken:
    """Chinese (or any non-ASCII) words match the raw text, case-sensitive; ASCII words match normalised whole words
    (with byte-level BPE, together with the space before them)."""
    if is_cjk_word(word) or not word.isascii():
        return AddedToken(word, single_word=False, normalized=False, lstrip=False, rstrip=False, special=False)
    return AddedToken(word, single_word=True, normalized=True, lstrip=kind == model_families.BPE, rstrip=False,
                      special=False)


def unk_char_token(form: str) -> AddedToken:
    """An [UNK] character as an added token, matched on the normalised text (where unk_forms found it)."""
    return AddedToken(form, single_word=False, normalized=True, lstrip=False, rstrip=False, special=False)


def _appendable(base) -> bool:
    """True when new WordPiece entries can take the ids right after the base's: the base has no added tokens of its
    own past its vocab (a tokenizer this stage extended before does). The tokenizers library numbers added tokens
    from the model vocab's *size* when it loads, so an entry appended to the vocab behind earlier added words would
    shift every one of them by one (seen on a retrain: 300 ids of round one's words moved)."""
    model_ids = base.backend_tokenizer.get_vocab(with_added_tokens=False).values()
    return max(model_ids, default=-1) + 1 == len(base)


def extend_tokenizer(base, words: Sequence[str], vocab_forms: Sequence[str] = ()):
    """A copy of ``base`` with ``vocab_forms`` appended to its WordPiece vocab and ``words`` as added tokens.

    Returns the new tokenizer; new ids follow the base ones in the order given (vocab forms first), and every id of
    ``base`` keeps its number. When ``base`` already carries added words (a champion being extended again), the
    forms become added tokens instead ("x" only: matched on the normalised text, so a word holding the character
    splits around it rather than becoming [UNK]).
    """
    from transformers import AutoTokenizer

    existing = base.get_vocab()
    kind = model_families.tokenizer_kind(base)
    forms = [f for f in dict.fromkeys(vocab_forms) if f not in existing]
    extra_tokens: list[AddedToken] = []
    with tempfile.TemporaryDirectory(prefix="bertpipe-vocab-") as tmp:
        base.save_pretrained(tmp)
        tj = Path(tmp) / "tokenizer.json"
        data = json.loads(tj.read_text(encoding="utf-8"))
        model = data.get("model", {})
        if forms:
            if model.get("type") != "WordPiece":
                # No per-character [UNK] in BPE/Unigram vocabularies worth patching: treat the forms as words.
                words = list(words) + [f for f in forms if not f.startswith("##")]
                forms = []
            elif not _appendable(base):
                prefix = getattr(base.backend_tokenizer.model, "continuing_subword_prefix", None) or "##"
                chars = dict.fromkeys(f[len(prefix):] if f.startswith(prefix) else f for f in forms)
                extra_tokens = [unk_char_token(c) for c in chars if c and c not in existing]
                forms = []
            else:
                start = len(base)
                vocab = model["vocab"]
                for i, f in enumerate(forms):
                    vocab[f] = start + i
                tj.write_text(json.dumps(data, ensure_ascii=False), encoding="utf-8")
                vt = Path(tmp) / "vocab.txt"
                if vt.exists():  # keep a slow-tokenizer vocab consistent with the fast one
                    with open(vt, "a", encoding="utf-8") as fh:
                        fh.writelines(f + "\n" for f in forms)
        tok = AutoTokenizer.from_pretrained(tmp)
    if len(tok) != len(base) + len(forms):
        raise BertpipeError(f"extending the WordPiece vocab gave {len(tok)} ids, expected {len(base) + len(forms)}")
    if extra_tokens:
        tok.add_tokens(extra_tokens)
    have = tok.get_vocab()
    new = [w for w in dict.fromkeys(words) if w not in have]
    tok.add_tokens([added_token(w, kind) for w in new])
    return tok


def moved_ids(base, extended) -> list[str]:
    """Entries of ``base`` whose id differs in ``extended`` (must be none)."""
    ext = extended.get_vocab()
    return [t for t, i in base.get_vocab().items() if ext.get(t) != i]


def new_token_ids(base, extended) -> list[int]:
    return list(range(len(base), len(extended)))


def unk_counts(tok, texts: Sequence[str], batch: int = 256) -> tuple[int, int, int]:
    """(tokens, [UNK] tokens, characters covered by [UNK] tokens) over ``texts``.

    The characters count is what "unknown" means to a reader, and it cannot go up when a vocabulary only grows:
    per *token* it can, because added words shrink the token count while the same few characters stay unknown
    (a retrain on new laws measured 16 [UNK] tokens before and after extension, reported as 1.31e-4 -> 1.83e-4).
    """
    unk = tok.unk_token_id
    n_tok = n_unk = n_unk_chars = 0
    for i in range(0, len(texts), batch):
        enc = tok(list(texts[i : i + batch]), add_special_tokens=False, verbose=False, return_offsets_mapping=True)
        for ids, offsets in zip(enc["input_ids"], enc["offset_mapping"]):
            n_tok += len(ids)
            if unk is None:
                continue
            for t, (a, b) in zip(ids, offsets):
                if t == unk:
                    n_unk += 1
                    n_unk_chars += max(b - a, 1)
    return n_tok, n_unk, n_unk_chars


def tokenizer_stats(tok, texts: Sequence[str], repeats: int = 3, batch: int = 256) -> dict[str, float]:
    """Tokens per character, [UNK] share of the characters (and of the tokens), and throughput (characters/s,
    best of ``repeats``) over ``texts``."""
    texts = [t for t in texts if t]
    n_chars = sum(len(t) for t in texts)
    n_tok, n_unk, n_unk_chars = unk_counts(tok, texts, batch)
    speed = max((throughput(tok, texts, batch) for _ in range(repeats)), default=0.0)
    return {
        "chars": float(n_chars),
        "tokens": float(n_tok),
        "tokens_per_char": n_tok / max(n_chars, 1),
        "unk_tokens": float(n_unk),
        "unk_chars": float(n_unk_chars),
        # The headline [UNK] rate: unknown characters per character (see unk_counts for why not per token).
        "unk_rate": n_unk_chars / max(n_chars, 1),
        "unk_token_rate": n_unk / max(n_tok, 1),
        "chars_per_s": speed,
    }


def throughput(tok, texts: Sequence[str], batch: int = 256) -> float:
    """Characters per second of one tokenising pass over ``texts``."""
    t0 = time.perf_counter()
    for i in range(0, len(texts), batch):
        tok(list(texts[i : i + batch]), add_special_tokens=False, verbose=False)
    return sum(len(t) for t in texts) / max(time.perf_counter() - t0, 1e-9)


def compare_tokenizers(
    base, ext, texts: Sequence[str], repeats: int = 3, timing_chars: int = 200_000
) -> tuple[dict, dict]:
    """``tokenizer_stats`` of both over ``texts``; throughput timed on the first ``timing_chars`` characters in
    alternation (base, ext, base, ...) so that load from other processes hits both alike, best pass of each."""
    before = tokenizer_stats(base, texts, repeats=0)
    after = tokenizer_stats(ext, texts, repeats=0)
    sample, n = [], 0
    for t in texts:
        if n >= timing_chars:
            break
        sample.append(t)
        n += len(t)
    before["chars_per_s"] = after["chars_per_s"] = 0.0
    for _ in range(max(1, repeats)):
        before["chars_per_s"] = max(before["chars_per_s"], throughput(base, sample))
        after["chars_per_s"] = max(after["chars_per_s"], throughput(ext, sample))
    return before, after
