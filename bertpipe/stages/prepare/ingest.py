"""Ingest: raw sources (txt, jsonl, csv, parquet, a SQLite query; files, directories, globs) -> documents.

Every document is a dict with ``id``, ``text``, ``group``, ``source`` and the source's meta fields. Files are read
incrementally (text in chunks, parquet in record batches, SQLite through a cursor), so memory does not grow with a
file. Only regular files are opened, and text decoding follows ``bertpipe.stages.prepare.files``'s encoding policy
(UTF-8 or GB18030, one per file unless ``encoding: per-line``); anything else is an error naming the file, line and byte
offset.
"""

from __future__ import annotations

import csv
import datetime
import decimal
import glob as globlib
import io
import itertools
import json
import re
from pathlib import Path
from typing import Callable, Iterator

from bertpipe.infra.errors import BertpipeError
from bertpipe.infra.sqlite_io import reading
from bertpipe.stages.prepare.files import is_special, open_regular, regular_file, text_lines
from bertpipe.stages.prepare.params import SourceParams

SUFFIX_FORMATS = {
    ".txt": "txt",
    ".text": "txt",
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".json": "jsonl",
    ".csv": "csv",
    ".tsv": "csv",
    ".parquet": "parquet",
    ".db": "sqlite",
    ".sqlite": "sqlite",
    ".sqlite3": "sqlite",
}
_GLOB_CHARS = re.compile(r"[*?\[]")
# What a field may hold: its text is the document's text or id. A list, a mapping or bytes has no such text (its
# repr would enter the corpus).
_SCALARS = (str, int, float, datetime.date, datetime.time, decimal.Decimal)


def _kind_of(v) -> str:
    return {list: "a list", tuple: "a list", dict: "a mapping", bytes: "bytes", bytearray: "bytes"}.get(
        type(v), f"a {type(v).__name__}")


def is_glob(path: str) -> bool:
    return bool(_GLOB_CHARS.search(path))


def source_files(src: SourceParams, resolve: Callable[[str], Path], key: str) -> list[Path]:
    """The files a source names, sorted; a missing path or an empty match is an error naming the params key."""
    return [f for f, _ in source_members(src, resolve, key)]


def source_members(src: SourceParams, resolve: Callable[[str], Path], key: str) -> list[tuple[Path, str | None]]:
    """(file, its path under the source's directory or glob root) for every file a source names, sorted; the path
    is None for a source that names one file."""
    if is_glob(src.path):
        pattern = str(resolve(src.path))
        matches = [Path(p) for p in globlib.glob(pattern, recursive=True)]
        _no_special(matches, key)
        files = sorted(p for p in matches if p.is_file())
        if not files:
            raise BertpipeError(f"{key}.path: no file matches {pattern}")
        root = _glob_root(pattern)
        return [(f, f.relative_to(root).as_posix()) for f in files]
    p = resolve(src.path)
    if not p.exists():
        raise BertpipeError(f"{key}.path: {p} does not exist")
    if p.is_dir():
        matches = [f for f in p.rglob(src.glob) if not f.name.startswith(".")]
        _no_special(matches, key)
        files = sorted(f for f in matches if f.is_file())
        if not files:
            raise BertpipeError(f"{key}.path: directory {p} holds no file matching {src.glob!r}")
        return [(f, f.relative_to(p).as_posix()) for f in files]
    return [(regular_file(p, f"{key}.path"), None)]


def _glob_root(pattern: str) -> Path:
    """The directory a glob pattern starts from: its parts before the first one holding a wildcard."""
    parts = Path(pattern).parts
    n = next(i for i, part in enumerate(parts) if is_glob(part))
    return Path(*parts[:n]) if n else Path(".")


def id_prefix(src: SourceParams, path: Path, rel: str | None) -> str:
    """What a record id starts with (``<prefix>:<line or row>``), unique per file: the source's name (else the file
    stem) for a source naming one file; for a directory or glob, the name and the file's path under it
    (``my_corpus:sub/a.txt``), or without a name that path less its suffix (the stem, for a top-level file)."""
    if rel is None:
        return src.name or path.stem
    if src.name:
        return f"{src.name}:{rel}"
    return rel[: -len(path.suffix)] if path.suffix else rel


def _no_special(paths: list[Path], key: str) -> None:
    """A FIFO, socket or device among a source's matches is an error (reading one would hang or never end)."""
    for f in paths:
        if is_special(f):
            regular_file(f, f"{key}.path")  # raises, naming what it is


def file_format(src: SourceParams, path: Path) -> str:
    if src.format != "auto":
        return src.format
    fmt = SUFFIX_FORMATS.get(path.suffix.lower())
    if fmt is None:
        raise BertpipeError(
            f"{path}: cannot tell the format from the suffix {path.suffix!r}; set format to one of "
            "txt, jsonl, csv, parquet, sqlite"
        )
    return fmt


# ---------------------------------------------------------------- decoding


def decode(data: bytes, path: Path | str, encoding: str = "auto") -> str:
    """Bytes -> text with ``\\n`` line ends, under the encoding policy of ``bertpipe.stages.prepare.files``."""
    return "\n".join(text_lines(io.BytesIO(data), path, encoding))


# ---------------------------------------------------------------- POS-tagged text

_POS_TOKEN = re.compile(r"^\[?(.+?)/[A-Za-z]+\]?[A-Za-z]*$")


def strip_pos_tags(line: str) -> str:
    """``迈向/v  充满/v  [中央/n  电台/n]nt`` -> ``迈向充满中央电台``; Latin words keep a space between them."""
    out: list[str] = []
    for tok in line.split():
        m = _POS_TOKEN.match(tok)
        word = m.group(1) if m else tok
        if out and out[-1][-1:].isascii() and out[-1][-1:].isalnum() and word[:1].isascii() and word[:1].isalnum():
            out.append(" ")
        out.append(word)
    return "".join(out)


# ---------------------------------------------------------------- readers


class Ingest:
    """Reads the sources of one corpus; counts skipped malformed records per source."""

    def __init__(self, resolve: Callable[[str], Path]):
        self.resolve = resolve
        self.counts: dict[str, int] = {}

    def documents(self, sources: list[SourceParams], corpus: str, max_docs: int = 0) -> Iterator[dict]:
        """Documents of every source in order; ``max_docs`` > 0 caps the total, shared evenly by the sources."""
        quotas = [max_docs // len(sources) + (i < max_docs % len(sources)) for i in range(len(sources))]
        for i, src in enumerate(sources):
            key = f"prepare.{corpus}.sources[{i}]"
            left = quotas[i] if max_docs else -1
            for path, rel in source_members(src, self.resolve, key):
                name = src.name or path.stem
                prefix = id_prefix(src, path, rel)
                reader = getattr(self, f"_read_{file_format(src, path)}")
                for rec_id, loc, row in reader(src, path, prefix):
                    if left == 0:
                        break
                    doc = self._doc(src, name, prefix, path, rec_id, loc, row)
                    if doc is not None:
                        left -= 1
                        yield doc

    def _doc(self, src: SourceParams, name: str, prefix: str, path: Path, rec_id: str, loc: int,
             row: dict) -> dict | None:
        """The document of one record; None when a field holds no scalar and ``on_bad_record`` is skip."""
        for f in (src.text_field, src.id_field, src.group_field, *src.meta_fields):
            v = row.get(f) if f else None
            if v is not None and not isinstance(v, _SCALARS):
                self._bad(src, f"{path}:{loc}", f"field {f!r} holds {_kind_of(v)}; expected a string or a number")
                return None
        text = row.get(src.text_field)
        if text is not None and not isinstance(text, str):
            text = str(text)
        doc_id = f"{prefix}:{row[src.id_field]}" if src.id_field and row.get(src.id_field) is not None else rec_id
        group = row.get(src.group_field) if src.group_field else None
        doc = {
            "id": doc_id,
            "text": text or "",
            "group": str(group) if group not in (None, "") else doc_id,
            "source": name,
            "_loc": f"{path}:{loc}",
        }
        for f in src.meta_fields:
            v = row.get(f)
            doc[f] = None if v is None else str(v)
        doc.update(src.constants)
        return doc

    def _bad(self, src: SourceParams, where: str, what: str) -> None:
        if src.on_bad_record == "fail":
            raise BertpipeError(f"{where}: {what} (set on_bad_record: skip to skip such records)")
        self.counts["bad_records"] = self.counts.get("bad_records", 0) + 1

    def _read_txt(self, src: SourceParams, path: Path, prefix: str = "") -> Iterator[tuple[str, int, dict]]:
        extra = [f for f in (src.id_field, src.group_field, *src.meta_fields) if f and f != "_block"]
        if extra:
            raise BertpipeError(f"{path}: a txt source has no field {extra[0]!r} (only the text and '_block')")
        with open_regular(path) as fh:
            yield from self._txt_records(src, path, text_lines(fh, path, src.encoding, self.counts), prefix)

    def _txt_records(self, src: SourceParams, path: Path, lines: Iterator[str],
                     prefix: str = "") -> Iterator[tuple[str, int, dict]]:
        prefix = prefix or id_prefix(src, path, None)
        tf = src.text_field
        if src.txt_unit == "line":
            block = 1  # "_block": where the blank-line separated block of this line starts (e.g. one article)
            for n, line in enumerate(lines, 1):
                if src.strip_pos_tags:
                    line = strip_pos_tags(line)
                if line.strip():
                    yield f"{prefix}:{n}", n, {tf: line, "_block": f"{prefix}:{block}"}
                else:
                    block = n + 1
            return
        block: list[str] = []
        start = 1
        for n, line in enumerate(itertools.chain(lines, [""]), 1):
            if line.strip():
                if not block:
                    start = n
                block.append(strip_pos_tags(line) if src.strip_pos_tags else line)
            elif block:
                yield f"{prefix}:{start}", start, {tf: "\n".join(block)}
                block = []

    def _read_jsonl(self, src: SourceParams, path: Path, prefix: str = "") -> Iterator[tuple[str, int, dict]]:
        with open_regular(path) as fh:
            yield from self._jsonl_records(src, path, text_lines(fh, path, src.encoding, self.counts), prefix)

    def _jsonl_records(self, src: SourceParams, path: Path, lines: Iterator[str],
                       prefix: str = "") -> Iterator[tuple[str, int, dict]]:
        prefix = prefix or id_prefix(src, path, None)
        for n, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError as e:
                self._bad(src, f"{path}:{n}", f"expected one JSON object per line ({e.msg})")
                continue
            if not isinstance(row, dict) or not isinstance(row.get(src.text_field), str):
                self._bad(src, f"{path}:{n}", f"expected a JSON object with a string field {src.text_field!r}")
                continue
            yield f"{prefix}:{n}", n, row

    def _read_csv(self, src: SourceParams, path: Path, prefix: str = "") -> Iterator[tuple[str, int, dict]]:
        with open_regular(path) as fh:
            lines = (line + "\n" for line in text_lines(fh, path, src.encoding, self.counts))
            yield from self._csv_records(src, path, lines, prefix)

    def _csv_records(self, src: SourceParams, path: Path, lines: Iterator[str],
                     prefix: str = "") -> Iterator[tuple[str, int, dict]]:
        prefix = prefix or id_prefix(src, path, None)
        reader = csv.DictReader(lines, delimiter="\t" if path.suffix.lower() == ".tsv" else ",")
        self._check_columns(path, reader.fieldnames or [], src)
        width = len(reader.fieldnames or [])
        for row in reader:
            n = reader.line_num
            if None in row or sum(v is not None for v in row.values()) != width:
                self._bad(src, f"{path}:{n}", f"expected {width} comma-separated fields")
                continue
            yield f"{prefix}:{n}", n, row

    def _read_parquet(self, src: SourceParams, path: Path, prefix: str = "") -> Iterator[tuple[str, int, dict]]:
        import pyarrow.parquet as pq

        prefix = prefix or id_prefix(src, path, None)
        with open_regular(path) as fh:
            try:
                pf = pq.ParquetFile(fh)
                self._check_columns(path, pf.schema_arrow.names, src)
                n = 0
                for batch in pf.iter_batches(batch_size=4096):
                    for row in batch.to_pylist():
                        n += 1
                        yield f"{prefix}:{n}", n, row
            except BertpipeError:
                raise
            except Exception as e:  # pyarrow raises several types for a broken file
                raise BertpipeError(f"{path}: expected a Parquet file ({type(e).__name__}: {e})") from None

    def _read_sqlite(self, src: SourceParams, path: Path, prefix: str = "") -> Iterator[tuple[str, int, dict]]:
        sql = f"SELECT * FROM ({src.query}) WHERE {src.where}" if src.where.strip() else src.query
        prefix = prefix or id_prefix(src, path, None)
        regular_file(path)
        with reading(path, "the sqlite query failed", "check query/where") as con:
            cur = con.execute(sql)
            cols = [d[0] for d in cur.description or []]
            self._check_columns(path, cols, src)
            for n, values in enumerate(cur, 1):
                yield f"{prefix}:{n}", n, dict(zip(cols, values))

    @staticmethod
    def _check_columns(path: Path, have: list[str], src: SourceParams) -> None:
        need = [src.text_field, *(f for f in (src.id_field, src.group_field) if f), *src.meta_fields]
        missing = [c for c in need if c not in have]
        if missing:
            raise BertpipeError(f"{path}: no column {missing[0]!r} (have {', '.join(have) or 'none'})")
