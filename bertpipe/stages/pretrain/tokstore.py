"""The token store: a split's packed pretraining examples, built once on disk and memory-mapped by every reader.

Segmenting, whole-word ids, tokenizing and packing a corpus is the slow part of starting pretraining (jieba and the
word union run in Python per character). Done in ``build_examples`` at every start, it was paid again on each resume
after a kill, on each rerun with other training params and on every torchrun rank, and the examples lived in RAM.
Here it runs once, in worker processes over corpus batches, into flat arrays on disk — the idea of Megatron's indexed
datasets: all tokens of all examples end to end (``ids``, ``words``), the example boundaries (``offsets``) and the
per-example fields (``n_first``, ``pair``). A reader maps the files and an example is two slices, so memory holds
what the batches touch (the page cache is shared between ranks) and nothing is built per example at startup.

The store lives at ``<paths.state>/tokstore/<key>/``; the key is a digest of everything the examples depend on: the
corpus (its prepare fingerprint, else its bytes), the tokenizer (its full JSON), the language, the packing and pair
params, the example limit, the code that builds examples (``codeid.module_code``: this module and every bertpipe
module it imports, the segmentation in ``bertpipe.lib.textseg`` among them) and the library versions. Training params
(steps, lr, masking, batch size, objective MLM or RTD) are not in it, so those runs share a store. A build writes
into a temp dir renamed into place when complete, under a file lock (``bertpipe.lib.keyedstore``): concurrent builders
(torchrun ranks, two stages) build it once, the others wait and read it; a killed build leaves a temp dir that the
next builder removes. Every process that opened a store holds a lease on it until it exits; the end of pretrain and ``bertpipe gc``
remove the stores that no stage output references and that are not among the few most recently used.

Only the tokenizing is parallel: packing is sequential by nature (segments run across documents, NSP draws its
random partners with one generator), cheap next to tokenizing, and runs in the parent on chunks cut exactly as
``build_examples`` cuts them, so the store holds the same examples as the in-memory builder (tests check this).
"""

from __future__ import annotations

import hashlib
import json
import os
import sys
import time
from collections import deque
from pathlib import Path
from typing import Callable, Iterator

import numpy as np

from bertpipe.core.codeid import lib_versions, module_code
from bertpipe.infra.errors import BertpipeError
from bertpipe.lib import keyedstore
from bertpipe.lib.corpusio import iter_text_batches, split_rows
from bertpipe.lib.mlm import data
from bertpipe.lib.mlm.data import Example

STORE_VERSION = "1"
# Files of a store: name -> dtype. Word indices fit int16 (max_seq_len <= 512); -1 marks special tokens.
ARRAYS = {"ids": np.int32, "words": np.int16, "offsets": np.int64, "n_first": np.int16, "pair": np.int8}
LIBS = ("tokenizers", "transformers", "jieba", "numpy")


# ---------------------------------------------------------------- reading


def _map(path: Path, dtype) -> np.ndarray:
    if path.stat().st_size == 0:  # mmap cannot map an empty file
        return np.zeros(0, dtype)
    return np.memmap(path, dtype=dtype, mode="r").view(np.ndarray)  # plain ndarray slices: no memmap overhead


class ExampleStore:
    """A built store, read-only: a sequence of ``Example`` views into memory-mapped arrays."""

    def __init__(self, path: Path):
        self.path = Path(path)
        try:
            self.meta = json.loads((self.path / "meta.json").read_text())
            for name, dtype in ARRAYS.items():
                setattr(self, name, _map(self.path / f"{name}.bin", dtype))
            n, tokens = int(self.meta["examples"]), int(self.meta["tokens"])
        except (OSError, ValueError, KeyError) as e:
            raise BertpipeError(f"{self.path}: not a complete token store ({type(e).__name__}: {e}); delete the "
                                f"directory and rerun to rebuild it") from None
        sizes = {"ids": tokens, "words": tokens, "offsets": n + 1, "n_first": n, "pair": n}
        bad = [k for k, v in sizes.items() if len(getattr(self, k)) != v]
        if bad or (n and int(self.offsets[-1]) != tokens):
            raise BertpipeError(f"{self.path}: token store files {bad or ['offsets']} do not match meta.json "
                                f"({n} examples, {tokens} tokens); delete the directory and rerun to rebuild it")
        changed = keyedstore.changed_files(self.path, self.meta.get("content"), [f"{k}.bin" for k in ARRAYS])
        if changed:
            raise BertpipeError(f"{self.path}: token store files {changed} differ from what was built (their sha256 "
                                f"is not the one in meta.json); delete the directory and rerun to rebuild it")
        self.lengths = np.diff(self.offsets)  # tokens per example, for batching and bucketing without a loop

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        i = int(i)
        if i < 0:
            i += len(self)
        if not 0 <= i < len(self):
            raise IndexError(i)
        a, b = self.offsets[i], self.offsets[i + 1]
        return Example(self.ids[a:b], self.words[a:b], int(self.n_first[i]), int(self.pair[i]))

    def __iter__(self) -> Iterator[Example]:
        return (self[i] for i in range(len(self)))

    @property
    def tokens(self) -> int:
        return int(self.offsets[-1]) if len(self.offsets) else 0

    @property
    def nbytes(self) -> int:
        return sum(f.stat().st_size for f in self.path.iterdir() if f.is_file())


# ---------------------------------------------------------------- the key


def key_parts(corpus: Path, split: str, tokenizer, language: str, p, limit: int, seed: int) -> dict:
    """What the examples depend on. Params that change nothing are normalised away (seed without a pair objective,
    cross_document with one), so such runs share a store."""
    pair = p.pair_objective
    tok_json = tokenizer.backend_tokenizer.to_str() if hasattr(tokenizer, "backend_tokenizer") else repr(tokenizer)
    return {
        "version": STORE_VERSION,
        "corpus": keyedstore.corpus_digest(corpus, split),
        "split": split,
        "tokenizer": hashlib.sha256(tok_json.encode()).hexdigest(),
        "special": [tokenizer.cls_token_id, tokenizer.sep_token_id],
        "language": language,
        "packing": {"max_seq_len": p.max_seq_len, "pair_objective": pair,
                    "cross_document": bool(p.cross_document and pair == "none"), "limit": int(limit),
                    "seed": int(seed) if pair != "none" else None, "doc_chunk": data.DOC_CHUNK},
        "code": module_code((__name__,)),
        "libs": lib_versions(LIBS),
    }


# ---------------------------------------------------------------- tokenizing in workers

_WORKER: dict = {}


class _Encoded:
    """The parts of a transformers ``BatchEncoding`` that ``textseg.tokenize_with_words`` reads. The columns are
    built once: the caller indexes them once per text."""

    def __init__(self, encodings):
        self._encs = encodings
        self._cols = {"input_ids": [e.ids for e in encodings], "offset_mapping": [e.offsets for e in encodings]}

    def __getitem__(self, key: str):
        return self._cols[key]

    def word_ids(self, b: int):
        return self._encs[b].word_ids


class BackendTokenizer:
    """A transformers fast tokenizer's call, as ``tokenize_with_words`` makes it, on its Rust backend alone
    (``tokenizers.Tokenizer``, which pickles small). A worker unpickling the transformers tokenizer imports
    transformers, ~1 CPU-s per worker before its first document; this costs none, and skipping the BatchEncoding
    wrapper saves ~20% of the tokenizing CPU (0.44 vs 0.57 CPU-s per 512 law articles). The call is the one
    transformers makes (``encode_batch`` without truncation or padding), so the ids, offsets and words are the
    same."""

    def __init__(self, backend):
        backend.no_truncation()  # a backend copied after a truncating call keeps that setting; a plain call has none
        backend.no_padding()
        self.backend_tokenizer = backend

    def __call__(self, texts, add_special_tokens: bool = False, return_offsets_mapping: bool = True,
                 verbose: bool = False) -> _Encoded:
        return _Encoded(self.backend_tokenizer.encode_batch(list(texts), add_special_tokens=add_special_tokens))


def _init_worker(backend, language: str) -> None:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")  # one process per core already
    _WORKER.update(tokenizer=BackendTokenizer(backend), language=language)


def _flat(docs) -> tuple[np.ndarray, ...]:
    """Tokenized documents as four flat arrays: cheap to send between processes (no per-sentence objects)."""
    sents = [s for d in docs for s in d]
    if not sents:
        z = np.zeros(0, np.int32)
        return z, z, z, np.asarray([len(d) for d in docs], np.int32)
    return (np.concatenate([s[0] for s in sents]), np.concatenate([s[1] for s in sents]),
            np.asarray([len(s[0]) for s in sents], np.int32), np.asarray([len(d) for d in docs], np.int32))


def _unflat(ids, words, sent_lens, doc_sents) -> list:
    cuts = np.cumsum(sent_lens)[:-1]
    pairs = list(zip(np.split(ids, cuts), np.split(words, cuts))) if len(sent_lens) else []
    out, k = [], 0
    for n in doc_sents.tolist():
        out.append(pairs[k : k + n])
        k += n
    return out


def _work(docs: list[str]):
    return _flat(data._sentences(docs, _WORKER["tokenizer"], _WORKER["language"]))


def tokenized_chunks(corpus: Path, split: str, tokenizer, language: str, workers: int) -> Iterator[tuple[int, list]]:
    """(documents read, tokenized documents) per chunk of ``data.DOC_CHUNK`` documents, in corpus order. With
    ``workers`` > 1 the chunks are tokenized in that many processes, at most two chunks per worker in flight, so
    memory stays bounded however large the corpus."""
    chunks = data.doc_chunks(iter_text_batches(corpus, split))
    backend = tokenizer.backend_tokenizer if hasattr(tokenizer, "backend_tokenizer") else tokenizer
    if workers <= 1:  # the workers' code in this process, on a copy (its settings are changed)
        from tokenizers import Tokenizer

        fast = BackendTokenizer(Tokenizer.from_str(backend.to_str()))
        for c in chunks:
            yield len(c), data._sentences(c, fast, language)
        return
    import multiprocessing as mp
    from concurrent.futures import ProcessPoolExecutor

    # spawn, not fork: the parent holds torch's thread pools (a forked child can deadlock on their locks)
    pool = ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn"), initializer=_init_worker,
                               initargs=(backend, language))
    pending: deque = deque()
    try:
        for c in chunks:
            pending.append((len(c), pool.submit(_work, c)))
            if len(pending) >= 2 * workers:
                n, fut = pending.popleft()
                yield n, _unflat(*fut.result())
        while pending:
            n, fut = pending.popleft()
            yield n, _unflat(*fut.result())
    finally:  # also when the consumer stops early (an example limit reached)
        pool.shutdown(wait=True, cancel_futures=True)


# ---------------------------------------------------------------- building


class _Writer:
    """Appends examples chunk by chunk to the store's flat files (the build holds one chunk's examples at a time)."""

    def __init__(self, d: Path):
        self.dir = d
        self.files = {name: open(d / f"{name}.bin", "wb") for name in ARRAYS}
        self.digests = {name: hashlib.sha256() for name in ARRAYS}  # of the bytes as written: no second read
        self._write("offsets", np.zeros(1, np.int64).tobytes())
        self.n, self.tokens = 0, 0

    def _write(self, name: str, data: bytes) -> None:
        self.files[name].write(data)
        self.digests[name].update(data)

    def add(self, examples: list[Example]) -> None:
        if not examples:
            return
        lens = np.fromiter((len(e) for e in examples), np.int64, len(examples))
        cols = {
            "ids": np.concatenate([e.ids for e in examples]),
            "words": np.concatenate([e.words for e in examples]),
            "offsets": self.tokens + np.cumsum(lens),
            "n_first": np.fromiter((e.n_first for e in examples), np.int64, len(examples)),
            "pair": np.fromiter((e.pair_label for e in examples), np.int64, len(examples)),
        }
        for name, arr in cols.items():
            self._write(name, arr.astype(ARRAYS[name]).tobytes())
        self.n += len(examples)
        self.tokens += int(lens.sum())

    def close(self) -> dict:
        """Closes the files; returns their content record for meta.json (``keyedstore.content_record``)."""
        for f in self.files.values():
            f.flush()
            os.fsync(f.fileno())
            f.close()
        return keyedstore.content_record(self.dir, {f"{k}.bin": h.hexdigest() for k, h in self.digests.items()})


def _progress(total_docs: int, desc: str):
    from tqdm.auto import tqdm

    return tqdm(total=total_docs, desc=desc, unit="doc", file=sys.stderr, dynamic_ncols=True, mininterval=2.0)


def _build(tmp: Path, corpus: Path, split: str, tokenizer, language: str, p, limit: int, seed: int,
           workers: int) -> dict:
    started, cpu0 = time.perf_counter(), time.process_time()
    w = _Writer(tmp)
    bar = _progress(split_rows(corpus, split), f"token store {split}")
    docs = 0

    def chunks():
        nonlocal docs
        for n, toks in tokenized_chunks(corpus, split, tokenizer, language, workers):
            docs += n
            bar.update(n)
            bar.set_postfix(tok_s=f"{w.tokens / max(time.perf_counter() - started, 1e-9):,.0f}", refresh=False)
            yield toks

    try:
        for got in data.pack(chunks(), tokenizer, p, limit, seed):
            w.add(got)
    finally:
        bar.close()
        content = w.close()
    wall = time.perf_counter() - started
    return {"examples": w.n, "tokens": w.tokens, "documents": docs, "workers": workers, "content": content,
            "build_s": round(wall, 3), "parent_cpu_s": round(time.process_time() - cpu0, 3),
            "tokens_per_s": round(w.tokens / max(wall, 1e-9), 1), "created": time.time()}


def default_workers() -> int:
    """1 in a daemonic process; else BERTPIPE_DATA_WORKERS if set; under torchrun every usable core (the other
    ranks wait for the store); else the torch threads this process was given (a flow running stages side by side
    gives each its share of the cores)."""
    import multiprocessing as mp

    if mp.current_process().daemon:  # e.g. a dask worker process: daemonic processes may not start children
        return 1
    env = os.environ.get("BERTPIPE_DATA_WORKERS", "").strip()
    if env:
        return max(1, int(env))
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    import torch

    return max(1, torch.get_num_threads())


def open_or_build(corpus: Path | str, split: str, tokenizer, language: str, p, limit: int, seed: int,
                  state: Path | str, workers: int | None = None,
                  log: Callable[[str], None] = lambda m: print(m, file=sys.stderr, flush=True),
                  ) -> tuple[ExampleStore, dict]:
    """The split's examples as a store, built unless one with the same key exists; plus a record for the manifest
    (``built``: whether this call built it; key, size, examples, tokens, the build's time)."""
    corpus = Path(corpus)
    parts = key_parts(corpus, split, tokenizer, language, p, limit, seed)
    key = keyedstore.store_key(parts)

    def build(tmp: Path) -> dict:
        n_workers = workers or default_workers()
        log(f"token store {split}: building {key} from {corpus} ({n_workers} worker(s))")
        return {"parts": parts, **_build(tmp, corpus, split, tokenizer, language, p, limit, seed, n_workers)}

    final, built = keyedstore.open_or_build(keyedstore.root_of(state), key, build, log)
    store = ExampleStore(final)
    m = store.meta
    record = {"key": key, "built": built, "path": str(final), "bytes": store.nbytes, "examples": len(store),
              "tokens": store.tokens, "build_s": m["build_s"], "workers": m["workers"]}
    took = f" in {m['build_s']:.1f}s ({m['tokens_per_s']:,.0f} tokens/s)" if built else ""
    log(f"token store {split}: {'built' if built else 'reused'} {key}{took}: {len(store)} examples, "
        f"{store.tokens} tokens, {store.nbytes / 1e6:.1f} MB")
    return store, record
