"""prepare's final write: the scratch batches, streamed into ``<corpus>/<split>/part-NNNNN.parquet``.

Rows keep corpus order within a split; a part file is closed after ``PART_ROWS`` rows or ``PART_BYTES`` of text, so
every reader downstream (``bertpipe.lib.corpusio``) can stream the split part by part.
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path
from typing import Sequence

import numpy as np
from tqdm import tqdm

PART_ROWS = 200_000
PART_BYTES = 128 << 20


def ids_hash(ids: Sequence[str]) -> np.ndarray:
    """64-bit hashes of document ids: repeated ids are found by sorting these, not by a set of strings."""
    return np.fromiter((int.from_bytes(hashlib.blake2b(i.encode("utf-8"), digest_size=8).digest(), "little")
                        for i in ids), dtype=np.uint64, count=len(ids))


class _Parts:
    def __init__(self, folder: Path, schema):
        self.folder, self.schema = folder, schema
        self.writer = None
        self.k = self.rows = self.bytes = 0

    def write(self, table) -> None:
        import pyarrow.parquet as pq

        if not table.num_rows:
            return
        if self.writer is None:
            self.folder.mkdir(parents=True, exist_ok=True)
            self.writer = pq.ParquetWriter(self.folder / f"part-{self.k:05d}.parquet", self.schema)
        self.writer.write_table(table)
        self.rows += table.num_rows
        self.bytes += table.column("text").nbytes
        if self.rows >= PART_ROWS or self.bytes >= PART_BYTES:
            self.close()

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None
            self.k += 1
            self.rows = self.bytes = 0


def write_splits(store, out: Path, names: list[str], doc_split: np.ndarray, rep: np.ndarray, rep_ids: dict[int, str],
                 columns: Sequence[str], corpus: str) -> None:
    """``doc_split[i]``: index into ``names`` of document i's split, -1 when it was removed as a duplicate;
    ``rep[i]``: its cluster's kept member, whose id ``rep_ids`` holds where it is not i itself."""
    import pyarrow as pa

    schema = pa.schema([(c, pa.string()) for c in columns])
    parts = [_Parts(out / sp, schema) for sp in names]
    bar = tqdm(desc=f"prepare {corpus}: write", total=len(doc_split), unit="doc", file=sys.stderr, mininterval=2.0,
               leave=False)
    try:
        for start, table in store.tables():
            m = table.num_rows
            sp = doc_split[start : start + m]
            r = rep[start : start + m]
            cluster = table.column("id").to_pylist()
            for j in np.flatnonzero(r != np.arange(start, start + m)).tolist():
                cluster[j] = rep_ids[int(r[j])]
            table = table.append_column("cluster", pa.array(cluster, pa.string()))
            table = table.select(list(columns))
            for k, part in enumerate(parts):
                mask = sp == k
                if mask.any():
                    part.write(table.filter(pa.array(mask)))
            bar.update(m)
    finally:
        for part in parts:
            part.close()
        bar.close()
