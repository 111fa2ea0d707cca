"""prepare's scratch: the cleaned documents of one corpus as numbered parquet batches, and compact per-document arrays.

Workers write one batch file each (``batch-NNNNN.parquet``, the documents that survived cleaning and task exclusion,
in corpus order), so the corpus-wide steps address a document by its integer position in that order and read only
the columns and rows they need. Per-document arrays (exact keys, LSH band keys, lengths) are saved per batch and
joined into one memory-mapped ``.npy`` each, so none of them lives as Python objects.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable, Iterator, Sequence

import numpy as np


def batch_path(root: Path, k: int) -> Path:
    return root / f"batch-{k:05d}.parquet"


def string_array(values: Sequence[str | None]):
    """A pyarrow string array built from its buffers. ``pa.array(list)`` would import pandas on first use (pyarrow
    checks for pandas objects), ~50 MB more in every worker process."""
    import pyarrow as pa

    valid = np.fromiter((v is not None for v in values), dtype=bool, count=len(values))
    data = [v.encode("utf-8") if v is not None else b"" for v in values]
    offsets = np.zeros(len(values) + 1, dtype=np.int64)
    np.cumsum(np.fromiter((len(b) for b in data), dtype=np.int64, count=len(data)), out=offsets[1:])
    bitmap = None if valid.all() else pa.py_buffer(np.packbits(valid, bitorder="little").tobytes())
    return pa.Array.from_buffers(pa.large_string(), len(values),
                                 [bitmap, pa.py_buffer(offsets.tobytes()), pa.py_buffer(b"".join(data))],
                                 null_count=int((~valid).sum())).cast(pa.string())


def write_batch(path: Path, rows: list[dict], columns: Sequence[str]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.Table.from_arrays([string_array([r.get(c) for r in rows]) for c in columns], names=list(columns))
    tmp = path.with_suffix(".tmp")
    pq.write_table(table, tmp)
    tmp.replace(path)


class Store:
    """The batches of one corpus, in order, with ``sizes[k]`` documents each."""

    def __init__(self, root: Path):
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self.sizes: list[int] = []
        self._arrays: dict[str, list[Path]] = {}

    # ---------------------------------------------------------------- building
    def add(self, k: int, n: int, arrays: dict[str, np.ndarray]) -> None:
        """Batch ``k`` (added in order) holds ``n`` documents; ``arrays``: per-document arrays, documents on the
        last axis."""
        assert k == len(self.sizes)
        self.sizes.append(n)
        for name, a in arrays.items():
            p = self.root / f"{name}-{k:05d}.npy"
            np.save(p, a)
            self._arrays.setdefault(name, []).append(p)

    def join(self, name: str) -> np.ndarray:
        """One array of every batch's ``name`` arrays, documents on the last axis, memory-mapped from disk."""
        parts = self._arrays.get(name, [])
        joined = self.root / f"{name}.npy"
        if not parts and joined.is_file():
            return np.load(joined, mmap_mode="r")
        if not parts:
            return np.zeros((0,))
        widths = []
        for p in parts:  # shapes and dtype from the headers (mapping a file touches none of its pages)
            a = np.load(p, mmap_mode="r")
            widths.append(a.shape[-1])
            lead, dtype = a.shape[:-1], a.dtype
            del a
        # Written row by row through a file, not filled through a map of the whole: every page of a map that is
        # touched counts in this process's RSS until it is unmapped, which at 1 GB put the LSH band keys twice
        # (parts and whole, ~270 MB) into prepare's parent (docs/scale.md).
        header = {"descr": np.lib.format.dtype_to_descr(dtype), "fortran_order": False, "shape": (*lead, sum(widths))}
        with open(joined, "wb") as fh:
            np.lib.format.write_array_header_1_0(fh, header)
            for idx in np.ndindex(*lead):
                for p in parts:
                    a = np.load(p, mmap_mode="r")
                    fh.write(np.ascontiguousarray(a[idx]).tobytes())
                    del a
        for p in parts:
            p.unlink()
        self._arrays[name] = []
        return np.load(joined, mmap_mode="r")

    def row(self, name: str, i: int) -> np.ndarray:
        """Row ``i`` of the joined array ``name``, copied out of a map that is closed again, so that its pages leave
        this process's RSS (a map held open keeps every page read through it)."""
        m = np.load(self.root / f"{name}.npy", mmap_mode="r")
        try:
            return np.array(m[i])
        finally:
            del m

    # ---------------------------------------------------------------- reading
    @property
    def total(self) -> int:
        return sum(self.sizes)

    def starts(self) -> np.ndarray:
        out = np.zeros(len(self.sizes) + 1, dtype=np.int64)
        np.cumsum(self.sizes, out=out[1:])
        return out

    def tables(self, columns: Sequence[str] | None = None) -> Iterator[tuple[int, "object"]]:
        """(first document index, pyarrow table) of every batch, in order."""
        import pyarrow.parquet as pq

        starts = self.starts()
        for k in range(len(self.sizes)):
            yield int(starts[k]), pq.read_table(batch_path(self.root, k), columns=list(columns) if columns else None)

    def column(self, name: str):
        """One column of every document, as a pyarrow ChunkedArray (compact: Arrow buffers, not Python strings)."""
        import pyarrow as pa

        return pa.chunked_array([t.column(name) for _, t in self.tables([name])], type=pa.string())

    def fetch(self, rows: Iterable[int], columns: Sequence[str]) -> dict[int, dict]:
        """{document index: {column: value}} for ``rows`` (only the batches that hold them are read)."""
        import pyarrow.parquet as pq

        want = np.unique(np.fromiter(rows, dtype=np.int64))
        out: dict[int, dict] = {}
        if not len(want):
            return out
        starts = self.starts()
        which = np.searchsorted(starts, want, side="right") - 1
        for k in np.unique(which).tolist():
            idx = want[which == k]
            t = pq.read_table(batch_path(self.root, k), columns=list(columns)).take(idx - starts[k])
            cols = {c: t.column(c).to_pylist() for c in columns}
            for j, i in enumerate(idx.tolist()):
                out[i] = {c: cols[c][j] for c in columns}
        return out
