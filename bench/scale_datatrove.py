"""datatrove's MinHash deduplication as bench/bench_scale.py's baseline: the same shingles and LSH bands x rows as
bertpipe's prepare, on the bench's jsonl corpus."""

from __future__ import annotations

import json
import time
from pathlib import Path


def datatrove_minhash(root: Path, bands: int, rows: int, ngram: int, workers: int) -> tuple[float, set[str], int]:
    """datatrove's four MinHash stages on data/corpus/*.jsonl with character ``ngram``-shingles; returns (seconds,
    removed ids, documents)."""
    import numpy as np
    from datatrove.executor import LocalPipelineExecutor
    from datatrove.pipeline.dedup import (MinhashConfig, MinhashDedupBuckets, MinhashDedupCluster,
                                          MinhashDedupFilter, MinhashDedupSignature)
    from datatrove.pipeline.readers import JsonlReader
    from datatrove.pipeline.writers import JsonlWriter

    class CharSignature(MinhashDedupSignature):
        """bertpipe's shingles: character n-grams of the text as it is (datatrove's default is word n-grams of a
        simplified text, and its zh word tokenizer needs spaCy)."""

        def get_shingles(self, text: str) -> np.ndarray:
            grams = [text[i : i + ngram] for i in range(max(1, len(text) - ngram + 1))]
            return np.fromiter((self._hash_func(g.encode("utf-8")) for g in grams), dtype=np.uint64).reshape((-1, 1))

    import datatrove.pipeline.dedup.minhash as dt_minhash

    dt_minhash.load_word_tokenizer = lambda language: None  # CharSignature needs no word tokenizer (nor spaCy)
    cfg = MinhashConfig(n_grams=ngram, num_buckets=bands, hashes_per_bucket=rows)
    base = root / "datatrove"
    tasks = max(1, workers)

    def reader():
        return JsonlReader(str(root / "data" / "corpus"), glob_pattern="*.jsonl", id_key="id")

    t0 = time.perf_counter()
    steps = [
        ([reader(), CharSignature(output_folder=str(base / "sigs"), config=cfg)], tasks),
        ([MinhashDedupBuckets(input_folder=str(base / "sigs"), output_folder=str(base / "buckets"), config=cfg)], bands),
        ([MinhashDedupCluster(input_folder=str(base / "buckets"), output_folder=str(base / "remove_ids"),
                              config=cfg)], 1),
        ([reader(), MinhashDedupFilter(input_folder=str(base / "remove_ids"),
                                       exclusion_writer=JsonlWriter(str(base / "removed"))),
          JsonlWriter(str(base / "kept"))], tasks),
    ]
    for i, (pipeline, n) in enumerate(steps):
        LocalPipelineExecutor(pipeline=pipeline, tasks=n, workers=min(n, workers),
                              logging_dir=str(base / f"logs{i}")).run()
    seconds = time.perf_counter() - t0
    import gzip

    removed: set[str] = set()
    docs = 0
    for f in (base / "removed").glob("*"):
        with gzip.open(f, "rt", encoding="utf-8") if f.suffix == ".gz" else open(f, encoding="utf-8") as fh:
            removed.update(json.loads(line)["id"] for line in fh)
    for f in (base / "kept").glob("*"):
        with gzip.open(f, "rt", encoding="utf-8") if f.suffix == ".gz" else open(f, encoding="utf-8") as fh:
            docs += sum(1 for _ in fh)
    return seconds, removed, docs + len(removed)
