"""prepare's per-document work, one batch of documents at a time, on a pool of workers.

A batch is cleaned, its documents matching finetune tasks' dev/test texts are removed, its survivors are written to
the scratch store (``store.batch_path``) and the worker returns only compact arrays: each survivor's exact-duplicate
key, LSH band keys (and MinHash signatures when candidates are not verified) and length. Everything here is a
function of one document, so the corpus-wide steps (exact groups, LSH buckets, components, splits) in
``bertpipe.stages.prepare.corpus`` see the same arrays for any batch size, worker count or executor.

Where batches run is the caller's choice: ``use_executor`` installs anything with the ``concurrent.futures.Executor``
``submit`` interface (the Prefect flow passes its Dask cluster's, ``client.get_executor()``); without one, a local
process pool of ``flow.prepare_shards`` workers (auto: the machine's cores) starts once a second batch exists.
At most ``workers + 1`` batches are in flight, so the process that ingests never holds more than that.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
from collections import Counter, deque
from concurrent.futures import Executor, ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator

import numpy as np

from bertpipe.lib.cleaning.clean import Cleaner
from bertpipe.lib.cleaning.dedup import Sketch, exact_key, normal_form, sketch
from bertpipe.lib.cleaning.exclude import EvalTexts, exclude
from bertpipe.stages.prepare.params import PrepareParams
from bertpipe.stages.prepare.store import write_batch

_EXECUTOR: contextvars.ContextVar[tuple[Executor, int] | None] = contextvars.ContextVar("prepare_executor",
                                                                                         default=None)


@contextlib.contextmanager
def use_executor(executor: Executor | None, workers: int = 1) -> Iterator[None]:
    """Run prepare's batches on ``executor`` (``workers``: how many it runs at once)."""
    token = _EXECUTOR.set((executor, max(1, workers)) if executor is not None else None)
    try:
        yield
    finally:
        _EXECUTOR.reset(token)


def shard_count(setting: int | str) -> int:
    """``flow.prepare_shards``: how many workers; auto = the installed executor's workers, else the machine's
    cores."""
    if setting != "auto":
        return int(setting)
    installed = _EXECUTOR.get()
    return installed[1] if installed else max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                                              else (os.cpu_count() or 1))


def run_batches(fn: Callable, jobs: Iterable, workers: int) -> Iterator:
    """``fn(job)`` for each job, results in job order, at most ``workers + 1`` in flight: on the installed executor,
    a local process pool (started at the second job), or in this process when ``workers`` is 1."""
    it = iter(jobs)
    first = next(it, None)
    if first is None:
        return
    second = next(it, None)
    if second is None or workers <= 1:
        yield fn(first)
        if second is not None:
            yield fn(second)
            for job in it:
                yield fn(job)
        return
    installed = _EXECUTOR.get()
    with contextlib.ExitStack() as stack:
        if installed is not None:
            pool = installed[0]
        else:
            import multiprocessing

            # spawn: the caller may hold threads (torch, Prefect) that a forked child would inherit half-locked.
            pool = stack.enter_context(ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")))
        window: deque = deque()
        for job in (first, second):
            window.append(pool.submit(fn, job))
        for job in it:
            if len(window) > workers:
                yield window.popleft().result()
            window.append(pool.submit(fn, job))
        while window:
            yield window.popleft().result()


@dataclass
class BatchJob:
    index: int  # batch number: the scratch file it writes
    docs: list[dict]  # ingested documents (id, text, group, source, meta), in corpus order
    p: PrepareParams
    keep_out: EvalTexts | None  # finetune tasks' dev/test texts (None: nothing to exclude)
    keep_out_sketch: Sketch | None  # their sketch, computed once by the caller
    out: Path  # the scratch file
    columns: tuple[str, ...]  # the scratch file's columns


@dataclass
class BatchResult:
    index: int
    kept: int  # documents written
    removed: Counter
    removed_chars: Counter
    masked: Counter
    excluded: dict  # exclude()'s stats for this batch
    exact: np.ndarray  # (kept, 16) uint8 exact-duplicate keys
    near: Sketch | None  # of the kept texts
    lens: np.ndarray  # (kept,) characters
    cpu_s: float = 0.0  # CPU seconds of this batch's work where it ran (the parallel share of prepare)


def _sketch(texts: list[str], p: PrepareParams) -> Sketch:
    d = p.dedup
    return sketch(texts, d.ngram, d.num_perm, d.threshold, d.seed, d.verify, d.batch_ngrams, d.recall_weight)


def keep_out_sketch(ev: EvalTexts, p: PrepareParams) -> Sketch | None:
    return _sketch(ev.texts, p) if ev.texts else None


def process_batch(job: BatchJob) -> BatchResult:
    import time

    cpu0 = time.process_time()
    p = job.p
    cleaner = Cleaner(p.clean)
    docs = []
    for doc in job.docs:
        text = cleaner(doc["text"])
        if text is not None:
            docs.append({**doc, "text": text})
    excluded: dict = {}
    if job.keep_out is not None and job.keep_out.texts:
        forms = [normal_form(d["text"]) for d in docs]
        own = _sketch(forms, p) if forms else None
        docs, excluded = exclude(docs, job.keep_out, p, sketched=own, keep_out_sketch=job.keep_out_sketch)
    texts = [d["text"] for d in docs]
    write_batch(job.out, docs, job.columns)
    keys = np.frombuffer(b"".join(exact_key(t) for t in texts), dtype=np.uint8).reshape(len(texts), 16)
    return BatchResult(
        job.index, len(docs), cleaner.removed, cleaner.removed_chars, cleaner.masked, excluded, keys,
        _sketch(texts, p) if p.dedup.near else None,
        np.fromiter((len(t) for t in texts), dtype=np.int64, count=len(texts)), time.process_time() - cpu0,
    )


def merge_counts(cleaner: Cleaner, r: BatchResult) -> None:
    """A batch's filter counts into ``cleaner``, in batch order (Counter.update keeps zero counts and the first-seen
    key order, so the stats read as from one pass)."""
    cleaner.removed.update(r.removed)
    cleaner.removed_chars.update(r.removed_chars)
    cleaner.masked.update(r.masked)
