"""The fair-MLM windows of the domain test split: which text each window holds and which words in it are masked,
built once into a keyed store and read by later runs.

Choosing them reads the whole test split, samples ``mlm_max_texts`` texts by hash and segments each window with
jieba: the test split's share of the tokenizing, the same for every evaluate run and every register gate score
(challenger, champion, base) on the same corpus. The windows go into a store beside the pretrain token stores
(``<paths.state>/tokstore/<key>/``, the same build-once, lease and collect code, ``bertpipe.lib.keyedstore``), keyed by
everything they depend on: the corpus (its prepare fingerprint, else its test bytes), the sample size and seed, the
window length (set by the compared models' positions), the mask fraction, jieba's version and the code that chooses
them: this module and every bertpipe module it imports (``codeid.module_code``, the rule a stage's code follows), so
an edit to the segmentation in ``bertpipe.lib.textseg`` makes a new store. The models' own tokenizers are not in the
key: each model tokenizes the windows itself when it scores them (``fair_mlm.score_windows``).
"""

from __future__ import annotations

import hashlib
import json
import random
import time
from pathlib import Path
from typing import Callable, Sequence

from bertpipe.core.codeid import lib_versions, module_code
from bertpipe.infra.errors import BertpipeError
from bertpipe.lib import keyedstore
from bertpipe.lib.textseg import jieba_spans

VERSION = "2"
SPLIT = "test"  # never the valid split that pretraining early-stopped on

Window = tuple[str, list[tuple[int, int]]]  # (text, chosen character spans [start, end))


def _key(seed: int, text: str) -> bytes:
    return hashlib.sha256(f"{seed}\x1f{text}".encode()).digest()


def test_texts(corpus: Path, limit: int, seed: int = 0) -> list[str]:
    """The non-empty texts of a prepared corpus's test split, in file order; with ``limit`` (0: all) a sample of that
    many chosen by text and seed, spread over the whole split rather than its first documents."""
    from bertpipe.lib.corpusio import read_texts

    texts = read_texts(corpus, SPLIT)
    if not texts:  # a NaN score would slip through comparisons; say what is missing instead
        raise BertpipeError(f"{corpus}/test: no text to score the encoders on")
    if not limit or len(texts) <= limit:
        return texts
    keep = set(sorted(range(len(texts)), key=lambda i: (_key(seed, texts[i]), i))[:limit])
    return [t for i, t in enumerate(texts) if i in keep]


def choose_windows(texts: Sequence[str], max_chars: int, mask_frac: float, seed: int) -> list[Window]:
    """Each text's first ``max_chars`` characters (ending on a word boundary) and the words to mask in it, drawn with
    a RNG seeded by ``(seed, window text)``."""
    out: list[Window] = []
    for text in texts:
        spans = jieba_spans(text[:max_chars])
        if len(text) > max_chars and len(spans) > 1:
            spans = spans[:-1]  # the last word may be cut by the window
        if not spans:
            continue
        window = text[: spans[-1][1]]
        words = [(a, b) for a, b in spans if any(ch.isalnum() for ch in window[a:b])]
        if not words:
            continue
        k = max(1, round(mask_frac * len(words)))
        out.append((window, sorted(random.Random(_key(seed, window)).sample(words, k))))
    return out


def key_parts(corpus: Path, p, max_chars: int) -> dict:
    return {"kind": "fair_mlm_windows", "version": VERSION, "corpus": keyedstore.corpus_digest(corpus, SPLIT),
            "split": SPLIT, "max_texts": int(p.mlm_max_texts), "seed": int(p.mlm_seed), "max_chars": int(max_chars),
            "mask_prob": float(p.mlm_mask_prob), "code": module_code((__name__,)), "libs": lib_versions(("jieba",))}


def open_windows(corpus: Path | str, p, max_chars: int, state: Path | str,
                 log: Callable[[str], None] = lambda m: None) -> tuple[list[Window], dict]:
    """(windows, record): the test split's windows for ``max_chars`` characters, exactly what
    ``choose_windows(test_texts(corpus, ...), max_chars, ...)`` returns, built unless a store with the same key
    exists. ``record`` (for the manifest): key, built, path, texts sampled, windows."""
    corpus = Path(corpus)
    parts = key_parts(corpus, p, max_chars)
    key = keyedstore.store_key(parts)

    def build(tmp: Path) -> dict:
        t = time.perf_counter()
        texts = test_texts(corpus, p.mlm_max_texts, p.mlm_seed)
        windows = choose_windows(texts, max_chars, p.mlm_mask_prob, p.mlm_seed)
        with open(tmp / "windows.jsonl", "w", encoding="utf-8") as f:
            for text, spans in windows:
                f.write(json.dumps([text, spans], ensure_ascii=False) + "\n")
        return {"parts": parts, "texts": len(texts), "windows": len(windows),
                "build_s": round(time.perf_counter() - t, 3), "created": time.time()}

    path, built = keyedstore.open_or_build(keyedstore.root_of(state), key, build, log)
    try:
        meta = json.loads((path / "meta.json").read_text())
        with open(path / "windows.jsonl", encoding="utf-8") as f:
            windows = [(text, [(int(a), int(b)) for a, b in spans]) for text, spans in map(json.loads, f)]
        if len(windows) != meta["windows"]:
            raise ValueError(f"{len(windows)} windows, meta.json says {meta['windows']}")
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise BertpipeError(f"{path}: not a complete window store ({type(e).__name__}: {e}); delete the directory "
                            "and rerun to rebuild it") from None
    finally:
        keyedstore.release(path)  # read whole into memory: nothing of it is used from disk any more
    log(f"fair MLM windows: {'built' if built else 'reused'} {key} ({len(windows)} windows of {meta['texts']} "
        f"test texts)")
    return windows, {"key": key, "built": built, "path": str(path), "texts": meta["texts"], "windows": len(windows)}
