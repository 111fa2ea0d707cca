"""Reading a prepared corpus — the one reader every stage uses.

A prepared corpus is ``work/prepare/<corpus>/<split>/part-NNNNN.parquet`` (shards written as prepare streams; columns
``id, text, group, source, cluster``) or, in the older layout, a single ``<split>.parquet``. Readers stream record
batches, so no stage needs the whole split in memory unless it asks for a list.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

from bertpipe.infra.errors import BertpipeError

SPLITS = ("train", "valid", "test")


def split_files(corpus: Path | str, split: str) -> list[Path]:
    """The parquet files of one split, in order: the shards of ``<split>/``, else ``<split>.parquet``."""
    corpus = Path(corpus)
    shard_dir = corpus / split
    if shard_dir.is_dir():
        files = sorted(p for p in shard_dir.glob("*.parquet") if p.is_file())
        if files:
            return files
    single = corpus / f"{split}.parquet"
    if single.is_file():
        return [single]
    raise BertpipeError(f"{corpus}/{split}: prepared corpus split missing (expected {split}/part-*.parquet or "
                        f"{split}.parquet with a 'text' column; run `bertpipe prepare`)")


def iter_text_batches(corpus: Path | str, split: str, batch_rows: int = 8192) -> Iterator[list[str]]:
    """The split's non-empty texts, in file order, as lists of at most ``batch_rows``."""
    import pyarrow.parquet as pq

    for path in split_files(corpus, split):
        try:
            pf = pq.ParquetFile(path)
            if "text" not in pf.schema_arrow.names:
                raise BertpipeError(f"{path}: expected a column 'text' (have {pf.schema_arrow.names})")
            batches = pf.iter_batches(batch_size=batch_rows, columns=["text"])
            for batch in batches:
                texts = [t for t in batch.column(0).to_pylist() if isinstance(t, str) and t.strip()]
                if texts:
                    yield texts
        except BertpipeError:
            raise
        except Exception as e:  # a truncated or foreign file: say which one
            raise BertpipeError(f"{path}: expected a parquet file with a 'text' column ({type(e).__name__})") from None


def read_texts(corpus: Path | str, split: str, limit: int = 0) -> list[str]:
    """The split's non-empty texts as one list (``limit`` > 0: the first that many)."""
    out: list[str] = []
    for texts in iter_text_batches(corpus, split):
        out.extend(texts)
        if limit and len(out) >= limit:
            return out[:limit]
    return out


def split_rows(corpus: Path | str, split: str) -> int:
    """Rows in the split, from the parquet footers (no data read)."""
    import pyarrow.parquet as pq

    return sum(pq.ParquetFile(p).metadata.num_rows for p in split_files(corpus, split))
