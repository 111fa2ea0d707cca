"""One corpus through ingest -> clean -> exact dedup -> near dedup -> split, with the counts of every step."""

from __future__ import annotations

import sys
import time
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
from tqdm import tqdm

from bertpipe.errors import BertpipeError
from bertpipe.prepare.clean import Cleaner
from bertpipe.prepare.dedup import Sketch, components, keep_rank, near_duplicates
from bertpipe.prepare.exclude import EvalTexts, exclude
from bertpipe.prepare.ingest import Ingest
from bertpipe.prepare.params import CorpusParams, PrepareParams
from bertpipe.prepare.shard import merge_counts, process_shard, run_shards, shard_count, shard_jobs
from bertpipe.prepare.split import assign_splits


@dataclass
class CorpusResult:
    name: str
    docs: list[dict]  # kept documents, each with "cluster" and "split"
    splits: list[str]  # split names in output order
    stats: dict = field(default_factory=dict)
    clusters: list[dict] = field(default_factory=list)  # duplicate clusters found (exact and near)


def _preview(text: str, n: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 1] + "…"


def prepare_corpus(
    name: str, cp: CorpusParams, p: PrepareParams, resolve: Callable[[str], Path], with_test: bool = True,
    keep_out: EvalTexts | None = None, shards: int | str = 1,
) -> CorpusResult:
    """``keep_out``: finetune tasks' dev/test texts; documents matching them are removed right after cleaning.
    ``shards``: how many pieces the per-document work is cut into (``bertpipe.prepare.shard``); the result is the
    same for any number."""
    timings: dict[str, float] = {}
    t = time.perf_counter()
    ingest, cleaner = Ingest(resolve), Cleaner(p.clean)
    raw: list[dict] = []
    per_source: dict[str, int] = defaultdict(int)
    seen: dict[str, str] = {}
    ingested = chars_in = bytes_in = 0
    bar = tqdm(desc=f"prepare {name}: ingest", unit="doc", file=sys.stderr, mininterval=1.0, leave=False)
    for doc in ingest.documents(cp.sources, name, cp.max_docs):
        ingested += 1
        per_source[doc["source"]] += 1
        chars_in += len(doc["text"])
        bytes_in += len(doc["text"].encode("utf-8"))
        if doc["id"] in seen:
            raise BertpipeError(
                f"{doc.pop('_loc')}: document id {doc['id']!r} repeats {seen[doc['id']]}; "
                "give each source a distinct `name` or a unique `id_field`"
            )
        seen[doc["id"]] = doc.pop("_loc")
        bar.update()
        raw.append(doc)
    bar.close()
    timings["ingest_s"] = time.perf_counter() - t
    paths = ", ".join(s.path for s in cp.sources)
    if ingested == 0:
        raise BertpipeError(f"prepare.{name}.sources: no documents found in {paths}")

    # -------------------------------------------------- clean, exact keys, MinHash sketches: per shard
    t = time.perf_counter()
    keep_out = keep_out or EvalTexts()
    jobs = shard_jobs([doc["text"] for doc in raw], shard_count(shards), clean=p.clean, dedup=p.dedup,
                      near=p.dedup.near, exclude=bool(keep_out.texts))
    results = run_shards(process_shard, jobs)
    merge_counts(cleaner, results)
    docs: list[dict] = []
    for doc, text in zip(raw, (x for r in results for x in r.texts)):
        if text is not None:
            doc["text"] = text
            docs.append(doc)
    del raw
    exact_keys = [k for r in results for k in r.exact]
    near_sk = Sketch.concat([r.near for r in results]) if p.dedup.near else None
    excl_sk = Sketch.concat([r.exclude for r in results]) if keep_out.texts else None
    del results
    timings["clean_sketch_s"] = time.perf_counter() - t
    timings["shards"] = len(jobs)
    if not docs:
        removed = ", ".join(f"{k}={v}" for k, v in cleaner.stats()["removed"].items() if v)
        raise BertpipeError(f"prepare.{name}: no document left after cleaning ({removed}); loosen prepare.clean")
    row = {id(doc): i for i, doc in enumerate(docs)}  # a kept document's index into the shards' arrays

    # -------------------------------------------------- task dev/test texts (before anything else sees the docs)
    t = time.perf_counter()
    docs, excluded = exclude(docs, keep_out, p, sketched=excl_sk)
    timings["exclude_s"] = time.perf_counter() - t
    if not docs:
        raise BertpipeError(f"prepare.{name}: every document matched a finetune task's dev/test text")

    clusters: list[dict] = []
    d = p.dedup
    # -------------------------------------------------- exact
    t = time.perf_counter()
    exact_removed = 0
    if d.exact:
        by_key: dict[bytes, list[int]] = defaultdict(list)
        for i, doc in enumerate(docs):
            by_key[exact_keys[row[id(doc)]]].append(i)
        drop = np.zeros(len(docs), dtype=bool)
        for members in by_key.values():
            if len(members) < 2:
                continue
            ranked = [members[k] for k in keep_rank([docs[i] for i in members], d.prefer_status, d.keep_order)]
            drop[ranked[1:]] = True
            clusters.append(_cluster_record(name, "exact", [docs[i] for i in ranked], None, p.preview_chars))
        exact_removed = int(drop.sum())
        docs = [doc for doc, gone in zip(docs, drop) if not gone]
    timings["exact_s"] = time.perf_counter() - t

    # -------------------------------------------------- near
    t = time.perf_counter()
    for doc in docs:
        doc["cluster"] = doc["id"]
    near_stats: dict = {"candidates": 0, "pairs": 0, "clusters": 0, "removed": 0, "in_clusters": 0}
    if d.near and len(docs) > 1:
        nd = near_duplicates(
            [doc["text"] for doc in docs],
            d.ngram,
            d.num_perm,
            d.threshold,
            seed=d.seed,
            verify=d.verify,
            batch=d.batch_ngrams,
            recall_weight=d.recall_weight,
            sketched=near_sk.take([row[id(doc)] for doc in docs]),
        )
        labels = components(len(docs), nd.pairs)
        sims: dict[int, list[float]] = defaultdict(list)
        for (i, _), s in zip(nd.pairs.tolist(), nd.similarity.tolist()):
            sims[int(labels[i])].append(s)
        members: dict[int, list[int]] = defaultdict(list)
        for i, lab in enumerate(labels.tolist()):
            members[lab].append(i)
        drop = np.zeros(len(docs), dtype=bool)
        for lab, idx in members.items():
            if len(idx) < 2:
                continue
            ranked = [idx[k] for k in keep_rank([docs[i] for i in idx], d.prefer_status, d.keep_order)]
            for i in ranked:
                docs[i]["cluster"] = docs[ranked[0]]["id"]
            if d.near_action == "drop":
                drop[ranked[1:]] = True
            clusters.append(_cluster_record(name, "near", [docs[i] for i in ranked], sims[lab], p.preview_chars))
        near_stats = {
            "candidates": nd.candidates,
            "pairs": len(nd.pairs),
            "clusters": sum(len(v) > 1 for v in members.values()),
            "in_clusters": sum(len(v) for v in members.values() if len(v) > 1),
            "removed": int(drop.sum()),
            "bands": nd.bands,
            "rows": nd.rows,
        }
        docs = [doc for doc, gone in zip(docs, drop) if not gone]
    timings["near_s"] = time.perf_counter() - t

    # -------------------------------------------------- split
    t = time.perf_counter()
    s = p.split
    fractions = {"train": 1.0 - s.valid - (s.test if with_test else 0.0), "valid": s.valid}
    if with_test:
        fractions["test"] = s.test
    split = assign_splits(
        [doc["group"] for doc in docs], [doc["cluster"] for doc in docs], fractions, s.seed, s.method
    )
    for doc, sp in zip(docs, split):
        doc["split"] = sp
    names = [k for k in fractions if fractions[k] > 0]
    timings["split_s"] = time.perf_counter() - t
    split_stats = {}
    for sp in names:
        part = [doc for doc in docs if doc["split"] == sp]
        split_stats[sp] = {
            "docs": len(part),
            "chars": sum(len(x["text"]) for x in part),
            "groups": len({x["group"] for x in part}),
        }
    stats = {
        "sources": dict(per_source),
        "ingested": ingested,
        "bad_records_skipped": ingest.counts.get("bad_records", 0),
        "chars_in": chars_in,
        "utf8_bytes_in": bytes_in,
        "clean": cleaner.stats(),
        "after_clean": ingested - sum(cleaner.removed.values()),
        "excluded": excluded,
        "exact": {"removed": exact_removed, "clusters": sum(c["kind"] == "exact" for c in clusters)},
        "near": near_stats,
        "kept": len(docs),
        "chars_out": sum(split_stats[sp]["chars"] for sp in names),
        "splits": split_stats,
        "timings": {k: round(v, 3) for k, v in timings.items()},
    }
    return CorpusResult(name, docs, names, stats, clusters)


def _cluster_record(corpus: str, kind: str, ranked: list[dict], sims: list[float] | None, preview: int) -> dict:
    rec = {
        "corpus": corpus,
        "kind": kind,
        "cluster": ranked[0]["id"],
        "size": len(ranked),
        "kept": ranked[0]["id"],
        "members": [x["id"] for x in ranked],
        "groups": sorted({x["group"] for x in ranked})[:20],
        "preview": _preview(ranked[0]["text"], preview),
    }
    if kind == "near":  # an exact duplicate's other members read the same
        rec["preview_other"] = _preview(ranked[1]["text"], preview)
    if sims:
        rec["similarity_min"] = round(min(sims), 4)
        rec["similarity_max"] = round(max(sims), 4)
    return rec
