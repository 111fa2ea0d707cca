"""Tokenizer extension: a standard fast tokenizer that matches the new words, loadable with AutoTokenizer alone.

Mechanism (measured in bench/bench_vocab.py, see the stage report): domain words become *added tokens* of the
tokenizers library, which are matched in one Aho-Corasick pass (leftmost-longest) before normalisation and
pre-tokenisation, so BERT's habit of putting spaces around every CJK character cannot break them apart.

- Chinese words: ``normalized=False`` (matched on the raw text: the normaliser would space the characters out) and
  ``single_word=False`` (Chinese has no spaces). Each CJK character is its own pre-token in BERT, so cutting the
  text at a word's edges changes nothing else.
- Latin words: ``normalized=True`` (matched after lower-casing, like the vocab) and ``single_word=True`` (never
  inside a longer word), so the words around them keep their old pieces.
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

from bertpipe.errors import BertpipeError
from bertpipe.vocab.mining import is_cjk_word


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


def added_token(word: str) -> AddedToken:
    """Chinese (or any non-ASCII) words match the raw text, case-sensitive; ASCII words match normalised whole words."""
    if is_cjk_word(word) or not word.isascii():
        return AddedToken(word, single_word=False, normalized=False, lstrip=False, rstrip=False, special=False)
    return AddedToken(word, single_word=True, normalized=True, lstrip=False, rstrip=False, special=False)


def extend_tokenizer(base, words: Sequence[str], vocab_forms: Sequence[str] = ()):
    """A copy of ``base`` with ``vocab_forms`` appended to its WordPiece vocab and ``words`` as added tokens.

    Returns the new tokenizer; new ids follow the base ones in the order given (vocab forms first).
    """
    from transformers import AutoTokenizer

    existing = base.get_vocab()
    forms = [f for f in dict.fromkeys(vocab_forms) if f not in existing]
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
    if forms and len(tok) != len(base) + len(forms):
        raise BertpipeError(f"extending the WordPiece vocab gave {len(tok)} ids, expected {len(base) + len(forms)}")
    have = tok.get_vocab()
    new = [w for w in dict.fromkeys(words) if w not in have]
    tok.add_tokens([added_token(w) for w in new])
    return tok


def new_token_ids(base, extended) -> list[int]:
    return list(range(len(base), len(extended)))


def tokenizer_stats(tok, texts: Sequence[str], repeats: int = 3, batch: int = 256) -> dict[str, float]:
    """Tokens per character, [UNK] rate and throughput (characters/s, best of ``repeats``) over ``texts``."""
    texts = [t for t in texts if t]
    n_chars = sum(len(t) for t in texts)
    n_tok = n_unk = 0
    best = float("inf")
    unk = tok.unk_token_id
    for r in range(max(1, repeats)):
        t0 = time.perf_counter()
        out = []
        for i in range(0, len(texts), batch):
            out.extend(tok(texts[i : i + batch], add_special_tokens=False, verbose=False)["input_ids"])
        best = min(best, time.perf_counter() - t0)
        if r == 0:
            n_tok = sum(len(x) for x in out)
            n_unk = sum(x.count(unk) for x in out) if unk is not None else 0
    return {
        "chars": float(n_chars),
        "tokens": float(n_tok),
        "tokens_per_char": n_tok / max(n_chars, 1),
        "unk_rate": n_unk / max(n_tok, 1),
        "chars_per_s": n_chars / max(best, 1e-9),
    }


def compare_tokenizers(
    base, ext, texts: Sequence[str], repeats: int = 3, timing_chars: int = 200_000
) -> tuple[dict, dict]:
    """``tokenizer_stats`` of both over ``texts``; throughput timed on the first ``timing_chars`` characters in
    alternation (base, ext, base, ...) so that load from other processes hits both alike, best pass of each."""
    before = tokenizer_stats(base, texts, repeats=1)
    after = tokenizer_stats(ext, texts, repeats=1)
    sample, n = [], 0
    for t in texts:
        if n >= timing_chars:
            break
        sample.append(t)
        n += len(t)
    before["chars_per_s"] = after["chars_per_s"] = 0.0
    for _ in range(max(1, repeats)):
        before["chars_per_s"] = max(before["chars_per_s"], tokenizer_stats(base, sample, repeats=1)["chars_per_s"])
        after["chars_per_s"] = max(after["chars_per_s"], tokenizer_stats(ext, sample, repeats=1)["chars_per_s"])
    return before, after
