"""The fair-MLM windows of the domain test split, built once into a keyed store and read by later runs.

``fair_mlm.choose_windows`` reads the whole test split, samples ``mlm_max_texts`` texts by hash and segments each
window with jieba: the test split's share of the tokenizing, redone by every evaluate run and by every register
gate score (challenger, champion, base) on the same corpus. Here the windows go into a store beside the pretrain
token stores (``<paths.state>/tokstore/<key>/``, the same build-once, lease and collect code,
``bertpipe.keyedstore``), keyed by everything they depend on: the corpus (its prepare fingerprint, else its test
bytes), the sample size and seed, the window length (set by the compared models' positions), the mask fraction, the
code that chooses them and jieba's version. The models' own tokenizers are not in the key: each model tokenizes the
windows itself when it scores them (a fast tokenizer over a few thousand windows; the model's forward pass is the
cost there).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Callable

from bertpipe import keyedstore
from bertpipe.codeid import lib_versions
from bertpipe.errors import BertpipeError
from bertpipe.pretrain.tokstore import code_digest, corpus_digest, store_key

VERSION = "1"
CODE = ("evaluate/fair_mlm.py", "evaluate/windows.py", "vocab/words.py", "corpusio.py")
SPLIT = "test"  # never the valid split that pretraining early-stopped on


def key_parts(corpus: Path, p, max_chars: int) -> dict:
    return {"kind": "fair_mlm_windows", "version": VERSION, "corpus": corpus_digest(corpus, SPLIT), "split": SPLIT,
            "max_texts": int(p.mlm_max_texts), "seed": int(p.mlm_seed), "max_chars": int(max_chars),
            "mask_prob": float(p.mlm_mask_prob), "code": code_digest(CODE), "libs": lib_versions(("jieba",))}


def open_windows(corpus: Path | str, p, max_chars: int, state: Path | str,
                 log: Callable[[str], None] = lambda m: None) -> tuple[list, dict]:
    """(windows, record): the test split's windows for ``max_chars`` characters, exactly what
    ``choose_windows(test_texts(corpus, ...), max_chars, ...)`` returns, built unless a store with the same key
    exists. ``record`` (for the manifest): key, built, path, texts sampled, windows."""
    from bertpipe.evaluate.fair_mlm import choose_windows, test_texts

    corpus = Path(corpus)
    parts = key_parts(corpus, p, max_chars)
    key = store_key(parts)

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
