"""One corpus through ingest -> clean -> task exclusion -> exact dedup -> near dedup -> split, streamed.

Memory stays bounded by a few batches plus compact per-document arrays, whatever the corpus size:

1. ingest reads the sources incrementally and cuts the documents into batches of about ``BATCH_BYTES`` of text;
   a pool of workers (``shard.run_batches``) cleans each batch, removes task dev/test matches, writes the survivors
   to a scratch parquet batch (``store``) and returns their exact keys, LSH band keys and lengths as numpy arrays;
2. exact duplicates: a sort of the (N, 16) key array; near duplicates: per LSH band, a sort of the memory-mapped band
   keys gives the buckets, candidates are verified against the true n-gram Jaccard (texts read back for the
   candidates only) and union-find over integer ids (scipy's connected components) gives the clusters, the shape of
   datatrove's signature -> buckets -> cluster -> filter stages;
3. the split works on integer codes of groups and clusters (``split.assign_split_codes``);
4. the final write streams the scratch batches into ``<out>/<corpus>/<split>/part-NNNNN.parquet``.

Only documents in duplicate clusters are ever read back as rows (to rank them and to preview the cluster).
"""

from __future__ import annotations

import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
from tqdm import tqdm

from bertpipe.infra.errors import BertpipeError
from bertpipe.lib.cleaning.clean import Cleaner
from bertpipe.lib.cleaning.dedup import components, keep_rank, lsh_candidates, lsh_params, pair_jaccard
from bertpipe.lib.cleaning.exclude import EvalTexts, merge_excluded
from bertpipe.lib.cleaning.params import DedupParams
from bertpipe.stages.prepare.ingest import Ingest, source_files
from bertpipe.stages.prepare.params import CorpusParams, PrepareParams
from bertpipe.stages.prepare.shard import (BatchJob, keep_out_sketch, merge_counts, process_batch, run_batches,
                                          shard_count)
from bertpipe.stages.prepare.split import assign_split_codes
from bertpipe.stages.prepare.store import Store, batch_path
from bertpipe.stages.prepare.write import ids_hash, write_splits

BASE_COLUMNS = ("id", "text", "group", "source", "cluster")
BATCH_BYTES = 4 << 20  # UTF-8 text per batch: amortises a worker round trip; a worker peaks ~140 MB at this size
BATCH_DOCS = 50_000


@dataclass
class CorpusResult:
    name: str
    out: Path  # <out>/<name>/<split>/part-*.parquet
    splits: list[str]  # split names in output order
    stats: dict = field(default_factory=dict)
    clusters: list[dict] = field(default_factory=list)  # duplicate clusters found (exact and near)
    lengths: dict[str, np.ndarray] = field(default_factory=dict)  # characters per kept document, per split

    def read_docs(self) -> list[dict]:
        """Every kept document with its ``split`` (reads the output back; for tests and small corpora)."""
        import pyarrow.parquet as pq

        rows = []
        for sp in self.splits:
            for f in sorted((self.out / sp).glob("part-*.parquet")):
                rows += [r | {"split": sp} for r in pq.read_table(f).to_pylist()]
        return rows


def _preview(text: str, n: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 1] + "…"


def _extra_columns(cp: CorpusParams) -> list[str]:
    """The sources' meta fields and constants, in source order (the output's columns after the base ones)."""
    extra: list[str] = []
    for src in cp.sources:
        for k in (*src.meta_fields, *src.constants):
            if k not in BASE_COLUMNS and k not in extra:
                extra.append(k)
    return extra


def _source_bytes(cp: CorpusParams, resolve, name: str) -> int:
    total = 0
    for i, src in enumerate(cp.sources):
        for f in source_files(src, resolve, f"prepare.{name}.sources[{i}]"):
            total += f.stat().st_size
    return total


def _batches(ingest: Ingest, cp: CorpusParams, name: str, counters: dict, bar, batch_bytes: int,
             id_hashes: list[np.ndarray]) -> Iterator[list[dict]]:
    batch: list[dict] = []
    size = 0
    for doc in ingest.documents(cp.sources, name, cp.max_docs):
        doc.pop("_loc")
        n = len(doc["text"].encode("utf-8"))
        counters["ingested"] += 1
        counters["sources"][doc["source"]] += 1
        counters["chars_in"] += len(doc["text"])
        counters["bytes_in"] += n
        bar.update(n / 1e6)
        batch.append(doc)
        size += n
        if size >= batch_bytes or len(batch) >= BATCH_DOCS:
            id_hashes.append(ids_hash([d["id"] for d in batch]))
            yield batch
            batch, size = [], 0
    if batch:
        id_hashes.append(ids_hash([d["id"] for d in batch]))
        yield batch


def _repeated_id(ingest_factory, cp: CorpusParams, name: str, id_hashes: np.ndarray) -> None:
    """A document id that repeats is an error naming both places (found by hash; the error path re-reads)."""
    order = np.argsort(id_hashes, kind="stable")
    dup = np.flatnonzero(id_hashes[order][1:] == id_hashes[order][:-1])
    if not len(dup):
        return
    target = set(id_hashes[order][dup].tolist())
    seen: dict[str, str] = {}
    for doc in ingest_factory().documents(cp.sources, name, cp.max_docs):
        if int(ids_hash([doc["id"]])[0]) not in target:
            continue
        if doc["id"] in seen:
            raise BertpipeError(f"{doc['_loc']}: document id {doc['id']!r} repeats {seen[doc['id']]}; "
                                "give each source a distinct `name` or a unique `id_field`")
        seen[doc["id"]] = doc["_loc"]


@dataclass
class _Read:
    """What reading a corpus leaves beside its batches in the store: the reader (its counts), the cleaner (what each
    filter removed), the ingest counters and the task exclusion's counts."""

    ingest: Ingest
    cleaner: Cleaner
    counters: dict
    excluded: dict
    after_clean: int


@dataclass
class _Found:
    """The duplicates found so far: each document's cluster (the index of its kept member), which documents stay,
    and the clusters as (first member, record)."""

    rep: np.ndarray
    alive: np.ndarray
    clusters: list[tuple[int, dict]] = field(default_factory=list)


def prepare_corpus(
    name: str, cp: CorpusParams, p: PrepareParams, resolve: Callable[[str], Path], with_test: bool = True,
    keep_out: EvalTexts | None = None, shards: int | str = 1, out: Path | None = None, scratch: Path | None = None,
    batch_bytes: int | None = None,
) -> CorpusResult:
    """Writes ``out/<name>/<split>/part-*.parquet``; ``scratch``: where the batches go (removed by the caller).
    ``keep_out``: finetune tasks' dev/test texts; documents matching them are removed right after cleaning.
    ``shards``: how many workers do the per-document work; the result is the same for any number."""
    import tempfile

    if out is None:
        out = Path(tempfile.mkdtemp(prefix="prepare-"))
    timings: dict[str, float] = {}
    store = Store(scratch if scratch is not None else out / f".scratch-{name}")
    columns = ("id", "text", "group", "source", *_extra_columns(cp))
    read = _read(name, cp, p, resolve, keep_out or EvalTexts(), store, columns, shard_count(shards),
                 batch_bytes or BATCH_BYTES, timings)
    n = store.total
    found = _Found(np.arange(n, dtype=np.int64), np.ones(n, dtype=bool))
    rank_cols = list(dict.fromkeys(["id", "group", *sorted({"status", *(f.lstrip("-") for f in p.dedup.keep_order)}
                                                           & set(columns))]))
    t = time.perf_counter()
    exact_removed = _exact(store, name, p, rank_cols, found)
    timings["exact_s"] = time.perf_counter() - t
    t = time.perf_counter()
    near_stats = _near(store, name, p, rank_cols, found)
    timings["near_s"] = time.perf_counter() - t
    names, kept, split_stats, lengths = _split_and_write(store, out, name, columns, p, with_test, found, timings)
    found.clusters.sort(key=lambda c: (c[1]["kind"] != "exact", c[0]))
    stats = _stats(read, found, exact_removed, near_stats, kept, names, split_stats, timings)
    return CorpusResult(name, out / name, names, stats, [c for _, c in found.clusters], lengths)


def _read(name: str, cp: CorpusParams, p: PrepareParams, resolve: Callable[[str], Path], keep_out: EvalTexts,
          store: Store, columns: tuple[str, ...], workers: int, batch_bytes: int, timings: dict) -> _Read:
    """Ingest, clean, keep out the tasks' texts and key every batch of the corpus (``workers`` processes) into
    ``store``; ``timings`` gets the phase's wall and CPU seconds. A corpus that reads empty, repeats an id or loses
    every document is a one-line error."""
    t, cpu0, batch_cpu = time.perf_counter(), time.process_time(), 0.0
    ev_sketch = keep_out_sketch(keep_out, p)
    ingest, cleaner = Ingest(resolve), Cleaner(p.clean)
    counters = {"ingested": 0, "sources": defaultdict(int), "chars_in": 0, "bytes_in": 0, "batches": 0}
    excluded: dict = {}
    id_hashes: list[np.ndarray] = []
    # MB of text read against the sources' size on disk: MB/s and an ETA (approximate for compressed sources)
    bar = tqdm(desc=f"prepare {name}", total=round(_source_bytes(cp, resolve, name) / 1e6, 1), unit="MB",
               bar_format="{desc}: {n:.1f}/{total:.1f} MB [{elapsed}<{remaining}, {rate_fmt}]", file=sys.stderr,
               mininterval=2.0, leave=False)

    def jobs():
        for k, docs in enumerate(_batches(ingest, cp, name, counters, bar, batch_bytes, id_hashes)):
            counters["batches"] += 1
            yield BatchJob(k, docs, p, keep_out if keep_out.texts else None, ev_sketch, batch_path(store.root, k),
                           columns)

    for r in run_batches(process_batch, jobs(), workers):
        batch_cpu += r.cpu_s
        merge_counts(cleaner, r)
        excluded = merge_excluded(excluded, r.excluded)
        arrays = {"exact": r.exact.T, "lens": r.lens}
        if r.near is not None:
            arrays["keys"] = r.near.keys
            if r.near.sig is not None:
                arrays["sig"] = r.near.sig.T
        store.add(r.index, r.kept, arrays)
    bar.close()
    timings["ingest_clean_s"] = time.perf_counter() - t
    # CPU seconds of that phase: this process's (reading, parsing, shipping batches, merging; with one worker the
    # batches' work too) and the batches' work alone, wherever it ran. On n free cores the phase takes at least
    # max(parent, (parent - in-process batches + batches) / n): bench/bench_prepare_stream.py prints that bound.
    timings["ingest_clean_cpu_s"] = time.process_time() - cpu0
    timings["batch_cpu_s"] = batch_cpu
    timings["batches"], timings["shards"] = counters["batches"], workers  # shards: the workers
    after_clean = _check_read(name, cp, resolve, counters["ingested"], cleaner, store, id_hashes)
    if not excluded:
        excluded = {"docs": 0, "by_task": {t_: dict.fromkeys(("exact", "contains", "near"), 0)
                                            for t_ in keep_out.tasks}, "examples": []}
    return _Read(ingest, cleaner, counters, excluded, after_clean)


def _check_read(name: str, cp: CorpusParams, resolve: Callable[[str], Path], ingested: int, cleaner: Cleaner,
                store: Store, id_hashes: list[np.ndarray]) -> int:
    """The documents left after cleaning; an error when none was read, an id repeats, or none is left."""
    if ingested == 0:
        paths = ", ".join(s.path for s in cp.sources)
        raise BertpipeError(f"prepare.{name}.sources: no documents found in {paths}")
    _repeated_id(lambda: Ingest(resolve), cp, name, np.concatenate(id_hashes))
    after_clean = ingested - sum(cleaner.removed.values())
    if after_clean == 0:
        removed = ", ".join(f"{k}={v}" for k, v in cleaner.stats()["removed"].items() if v)
        raise BertpipeError(f"prepare.{name}: no document left after cleaning ({removed}); loosen prepare.clean")
    if store.total == 0:
        raise BertpipeError(f"prepare.{name}: every document matched a finetune task's dev/test text")
    return after_clean


def _exact(store: Store, name: str, p: PrepareParams, rank_cols: list[str], found: _Found) -> int:
    """Exact duplicates, by a sort of the (N, 16) keys: each cluster's kept member stays, the rest go. The number
    removed."""
    if not p.dedup.exact:
        return 0
    n = len(found.alive)
    keys = np.ascontiguousarray(store.join("exact").T).view(np.dtype((np.void, 16))).ravel()
    order = np.argsort(keys, kind="stable")
    sk = keys[order]
    brk = np.flatnonzero(sk[1:] != sk[:-1]) + 1
    starts, ends = np.concatenate([[0], brk]), np.concatenate([brk, [n]])
    big = (ends - starts) > 1
    multi = [order[a:b] for a, b in zip(starts[big].tolist(), ends[big].tolist())]
    for members, rec in _rank_clusters(store, name, "exact", multi, rank_cols, p):
        found.alive[members[1:]] = False
        found.clusters.append((int(min(members)), rec))
    return int((~found.alive).sum())


def _near(store: Store, name: str, p: PrepareParams, rank_cols: list[str], found: _Found) -> dict:
    """Near duplicates among the documents left: band buckets -> verified pairs -> components; each cluster joins
    its kept member, and with ``near_action: drop`` the rest go. The phase's counts."""
    d = p.dedup
    survivors = np.flatnonzero(found.alive)
    if not d.near or len(survivors) < 2:
        return {"candidates": 0, "pairs": 0, "clusters": 0, "removed": 0, "in_clusters": 0}
    bands, rows = lsh_params(d.threshold, d.num_perm, d.recall_weight)
    cand, sim = _candidates(store, survivors, bands, d)
    keep = sim >= d.threshold
    pairs, sims = cand[keep], sim[keep]
    labels = components(len(survivors), pairs)
    pair_label = labels[pairs[:, 0]] if len(pairs) else np.zeros(0, dtype=np.int64)
    sizes = np.bincount(labels)
    in_cluster = np.flatnonzero(sizes[labels] > 1)
    order = in_cluster[np.argsort(labels[in_cluster], kind="stable")]
    groups = np.split(order, np.flatnonzero(np.diff(labels[order])) + 1) if len(order) else []
    by = np.argsort(pair_label, kind="stable")
    cut = np.flatnonzero(np.diff(pair_label[by])) + 1
    sims_of = {int(pair_label[c[0]]): sims[c] for c in np.split(by, cut)} if len(by) else {}
    removed = 0
    for members, rec in _rank_clusters(store, name, "near", [survivors[g] for g in groups], rank_cols, p,
                                       sims=[sims_of.get(int(labels[g[0]])) for g in groups]):
        found.rep[members] = members[0]
        if d.near_action == "drop":
            found.alive[members[1:]] = False
            removed += len(members) - 1
        found.clusters.append((int(min(members)), rec))
    return {"candidates": int(len(cand)), "pairs": int(len(pairs)), "clusters": len(groups),
            "in_clusters": int(len(in_cluster)), "removed": removed, "bands": bands, "rows": rows}


def _candidates(store: Store, survivors: np.ndarray, bands: int, d: DedupParams) -> tuple[np.ndarray, np.ndarray]:
    """(candidate pairs of survivor indices sharing an LSH band, their similarity): the true n-gram Jaccard of the
    texts when ``d.verify``, else the MinHash agreement."""
    store.join("keys")  # (bands, N): read back one band at a time, not held mapped through the near phase
    cand = lsh_candidates(store.row("keys", b)[survivors] for b in range(bands))
    lens = store.join("lens")[survivors]
    if len(cand):
        cand = cand[(lens[cand[:, 0]] > 0) & (lens[cand[:, 1]] > 0)]
    if d.verify:
        involved = np.unique(cand)
        got = store.fetch(survivors[involved].tolist(), ["text"])
        texts = [got[int(i)]["text"] for i in survivors[involved]]
        return cand, _verified(texts, np.searchsorted(involved, cand), d.ngram)
    sig = store.join("sig")
    a, b = survivors[cand[:, 0]], survivors[cand[:, 1]]
    return cand, (sig[:, a] == sig[:, b]).mean(axis=0) if len(cand) else np.zeros(0)


def _split_and_write(store: Store, out: Path, name: str, columns: tuple[str, ...], p: PrepareParams,
                     with_test: bool, found: _Found, timings: dict) -> tuple[list[str], np.ndarray, dict, dict]:
    """Split the kept documents over integer codes of groups and clusters, stream them into
    ``out/<name>/<split>/``: (split names, kept document indices, per-split counts, per-split lengths)."""
    t = time.perf_counter()
    s = p.split
    fractions = {"train": 1.0 - s.valid - (s.test if with_test else 0.0), "valid": s.valid}
    if with_test:
        fractions["test"] = s.test
    names = [k for k in fractions if fractions[k] > 0]
    kept = np.flatnonzero(found.alive)
    split_idx, gcodes = _split(store, kept, found.rep, fractions, s)
    timings["split_s"] = time.perf_counter() - t
    t = time.perf_counter()
    n, rep = len(found.alive), found.rep
    all_lens = store.join("lens")
    doc_split = np.full(n, -1, dtype=np.int8)
    doc_split[kept] = split_idx
    rep_ids = {int(i): v["id"] for i, v in store.fetch(np.unique(rep[rep != np.arange(n)]).tolist(), ["id"]).items()}
    write_splits(store, out / name, names, doc_split, rep, rep_ids, (*BASE_COLUMNS, *columns[4:]), name)
    timings["write_s"] = time.perf_counter() - t
    split_stats, lengths = {}, {}
    for k, sp in enumerate(names):
        rows_k = kept[split_idx == k]
        lengths[sp] = np.asarray(all_lens[rows_k])
        split_stats[sp] = {"docs": int(len(rows_k)), "chars": int(lengths[sp].sum()),
                           "groups": int(len(np.unique(gcodes[split_idx == k])))}
    return names, kept, split_stats, lengths


def _stats(read: _Read, found: _Found, exact_removed: int, near_stats: dict, kept: np.ndarray, names: list[str],
           split_stats: dict, timings: dict) -> dict:
    """The corpus's stats.json entry: what was read, cleaned, excluded, deduplicated and split, and the timings."""
    stats = {
        "sources": dict(read.counters["sources"]),
        "ingested": read.counters["ingested"],
        "bad_records_skipped": read.ingest.counts.get("bad_records", 0),
        "chars_in": read.counters["chars_in"],
        "utf8_bytes_in": read.counters["bytes_in"],
        "clean": read.cleaner.stats(),
        "after_clean": read.after_clean,
        "excluded": read.excluded,
        "exact": {"removed": exact_removed, "clusters": sum(c["kind"] == "exact" for _, c in found.clusters)},
        "near": near_stats,
        "kept": int(len(kept)),
        "chars_out": sum(split_stats[sp]["chars"] for sp in names),
        "splits": split_stats,
        "timings": {k: round(v, 3) for k, v in timings.items()},
    }
    if read.ingest.counts.get("gb18030_lines"):
        stats["gb18030_lines"] = read.ingest.counts["gb18030_lines"]
    return stats


VERIFY_PAIRS = 4096  # candidate pairs checked at a time against the true Jaccard


def _verified(texts: list[str], pairs: np.ndarray, ngram: int) -> np.ndarray:
    """``pair_jaccard`` of ``pairs``, ``VERIFY_PAIRS`` at a time: the n-gram hashes and sets (~16 bytes a character)
    then stay bounded however many candidates a corpus has, instead of growing with its duplicates (docs/scale.md).
    Chunked here, not in ``dedup``: the tasks stage uses that module too, and its code digest stays put."""
    out = np.zeros(len(pairs))
    for lo in range(0, len(pairs), VERIFY_PAIRS):
        out[lo : lo + VERIFY_PAIRS] = pair_jaccard(texts, pairs[lo : lo + VERIFY_PAIRS], ngram)
    return out


def _split(store: Store, kept: np.ndarray, rep: np.ndarray, fractions: dict, s) -> tuple[np.ndarray, np.ndarray]:
    """(split index, group code) of each kept document. Groups are dictionary-encoded in Arrow and ranked by an
    Arrow sort (UTF-8 byte order is code point order, Python's string order)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    groups = store.column("group").take(pa.array(kept))
    enc = groups.combine_chunks().dictionary_encode() if len(kept) else pa.array([], pa.string()).dictionary_encode()
    gcodes = enc.indices.to_numpy(zero_copy_only=False).astype(np.int64)
    values = enc.dictionary
    order = pc.sort_indices(values).to_numpy()
    rank = np.empty(len(values), dtype=np.int64)
    rank[order] = np.arange(len(values))
    _, ccodes = np.unique(rep[kept], return_inverse=True)
    idx = assign_split_codes(gcodes, rank, lambda r: values[int(order[r])].as_py(), ccodes.ravel(), fractions,
                             s.seed, s.method)
    return idx, gcodes


def _rank_clusters(store: Store, corpus: str, kind: str, groups: list[np.ndarray], cols: list[str], p: PrepareParams,
                   sims: list | None = None) -> Iterator[tuple[np.ndarray, dict]]:
    """Each cluster's members best first (``keep_rank`` on their fields, read back for cluster members only) and
    its ``dedup_clusters.jsonl`` record."""
    d = p.dedup
    chunk = 20_000  # members read back per round, so a corpus of duplicates is not read back at once
    for lo in range(0, len(groups), chunk):
        part = groups[lo : lo + chunk]
        meta = store.fetch(np.concatenate(part).tolist() if part else [], cols)
        ranked_all = []
        for g in part:
            g = np.sort(g)
            docs = [meta[int(i)] for i in g]
            ranked_all.append(g[keep_rank(docs, d.prefer_status, d.keep_order)])
        heads = [int(r[k]) for r in ranked_all for k in (0, 1)]
        texts = store.fetch(heads, ["text"])
        for j, ranked in enumerate(ranked_all):
            docs = [meta[int(i)] for i in ranked]
            rec = {
                "corpus": corpus, "kind": kind, "cluster": docs[0]["id"], "size": len(ranked), "kept": docs[0]["id"],
                "members": [x["id"] for x in docs], "groups": sorted({x["group"] for x in docs})[:20],
                "preview": _preview(texts[int(ranked[0])]["text"], p.preview_chars),
            }
            if kind == "near":  # an exact duplicate's other members read the same
                rec["preview_other"] = _preview(texts[int(ranked[1])]["text"], p.preview_chars)
            s = sims[lo + j] if sims is not None else None
            if s is not None and len(s):
                rec["similarity_min"] = round(float(s.min()), 4)
                rec["similarity_max"] = round(float(s.max()), 4)
            yield ranked, rec
