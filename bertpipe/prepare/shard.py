"""prepare's per-document work in shards: cleaning, the exact-duplicate key and MinHash sketches (LSH band keys).

Everything here is a function of one document's text, so a corpus cut into contiguous shards gives, concatenated in
shard order, exactly what one pass over it gives; the corpus-wide steps (task-text exclusion, exact groups, LSH
buckets over the merged band keys, verification, components, splits) stay in the caller. Output is therefore
identical for any shard count and any executor.

Where shards run is the caller's choice, not the library's: ``use_executor`` installs anything with the
``concurrent.futures.Executor.map`` interface (the Prefect flow passes its Dask cluster's, ``client.get_executor()``);
without one, ``flow.prepare_shards`` > 1 runs them in a local process pool (the CLI).
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from collections import Counter
from concurrent.futures import Executor, ProcessPoolExecutor
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

from bertpipe.prepare.clean import Cleaner
from bertpipe.prepare.dedup import Sketch, exact_key, normal_form, sketch
from bertpipe.prepare.params import CleanParams, DedupParams

_EXECUTOR: contextvars.ContextVar[tuple[Executor, int] | None] = contextvars.ContextVar("prepare_executor",
                                                                                         default=None)


@contextlib.contextmanager
def use_executor(executor: Executor | None, workers: int = 1) -> Iterator[None]:
    """Run prepare's shards on ``executor`` (``workers``: how many it runs at once, the default shard count)."""
    token = _EXECUTOR.set((executor, max(1, workers)) if executor is not None else None)
    try:
        yield
    finally:
        _EXECUTOR.reset(token)


def shard_count(setting: int | str) -> int:
    """``flow.prepare_shards``: a number, or auto = the installed executor's workers (1 without one)."""
    if setting != "auto":
        return int(setting)
    installed = _EXECUTOR.get()
    return installed[1] if installed else 1


def run_shards(fn: Callable, jobs: Sequence) -> list:
    """``[fn(job) for job in jobs]``, on the installed executor, a local process pool or in this process."""
    installed = _EXECUTOR.get()
    if installed is not None and len(jobs) > 1:
        return list(installed[0].map(fn, jobs))
    if len(jobs) > 1:
        import multiprocessing

        # spawn: the caller may hold threads (torch, Prefect) that a forked child would inherit half-locked.
        with ProcessPoolExecutor(len(jobs), mp_context=multiprocessing.get_context("spawn")) as pool:
            return list(pool.map(fn, jobs))
    return [fn(job) for job in jobs]


@dataclass
class ShardJob:
    texts: list[str]  # raw texts, in corpus order
    clean: CleanParams
    dedup: DedupParams
    near: bool  # sketch the cleaned texts (near-duplicate detection)
    exclude: bool  # sketch their normal forms (near matches of finetune tasks' dev/test texts)


@dataclass
class ShardResult:
    texts: list[str | None]  # cleaned text, None where a filter removed the document
    removed: Counter
    removed_chars: Counter
    masked: Counter
    exact: list[bytes]  # exact-duplicate key of each kept text
    near: Sketch | None  # of the kept texts
    exclude: Sketch | None  # of the kept texts' normal forms


def _sketch(texts: list[str], d: DedupParams) -> Sketch:
    return sketch(texts, d.ngram, d.num_perm, d.threshold, d.seed, d.verify, d.batch_ngrams, d.recall_weight)


def process_shard(job: ShardJob) -> ShardResult:
    cleaner = Cleaner(job.clean)
    texts = [cleaner(t) for t in job.texts]
    kept = [t for t in texts if t is not None]
    forms = [normal_form(t) for t in kept]
    return ShardResult(
        texts, cleaner.removed, cleaner.removed_chars, cleaner.masked,
        [exact_key(t) for t in kept],
        _sketch(kept, job.dedup) if job.near else None,
        _sketch(forms, job.dedup) if job.exclude else None,
    )


def shard_jobs(texts: list[str], shards: int, **settings) -> list[ShardJob]:
    """Contiguous shards of about equal size (fewer when there are fewer texts)."""
    size = max(1, math.ceil(len(texts) / max(1, shards)))
    return [ShardJob(texts[i : i + size], **settings) for i in range(0, len(texts), size)] or [
        ShardJob([], **settings)]


def merge_counts(cleaner: Cleaner, results: Sequence[ShardResult]) -> None:
    """The shards' filter counts into ``cleaner``, in shard order (Counter.update keeps zero counts and the
    first-seen key order, so the stats read as from one pass)."""
    for r in results:
        cleaner.removed.update(r.removed)
        cleaner.removed_chars.update(r.removed_chars)
        cleaner.masked.update(r.masked)
