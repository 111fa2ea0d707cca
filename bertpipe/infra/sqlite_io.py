"""Read-only SQLite for every input database (prepare sources, finetune tasks, `data new-laws`).

The path becomes a ``file:`` URI through ``Path.resolve().as_uri()``, which percent-escapes ``#``, ``?`` and ``%``:
pasted into a URI raw, ``data#1/laws.db`` names a different file, and without ``mode=ro`` sqlite creates it.
Every sqlite error (not a database, truncated, missing table) becomes one line naming the file.
"""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path
from typing import Iterator

from bertpipe.infra.errors import BertpipeError


def ro_uri(path: Path | str) -> str:
    return Path(path).resolve().as_uri() + "?mode=ro"


def connect_ro(path: Path | str) -> sqlite3.Connection:
    """Open an existing database read-only; a missing file or one that is not SQLite is a BertpipeError."""
    path = Path(path)
    if not path.is_file():
        raise BertpipeError(f"{path}: SQLite database not found")
    try:
        con = sqlite3.connect(ro_uri(path), uri=True)
    except sqlite3.Error as e:
        raise BertpipeError(f"{path}: cannot open as SQLite ({e})") from None
    try:
        con.execute("SELECT count(*) FROM sqlite_master").fetchone()  # reads the header: "file is not a database"
    except sqlite3.Error as e:
        con.close()
        raise BertpipeError(f"{path}: not a readable SQLite database ({e})") from None
    return con


@contextlib.contextmanager
def reading(path: Path | str, what: str = "query failed", hint: str = "") -> Iterator[sqlite3.Connection]:
    """``connect_ro`` for a ``with`` block: sqlite errors inside it (a truncated file shows up only when a query
    reaches the missing pages: "database disk image is malformed") become one line naming the file."""
    con = connect_ro(path)
    try:
        yield con
    except sqlite3.Error as e:
        raise BertpipeError(f"{path}: {what} ({e})" + (f"; {hint}" if hint else "")) from None
    finally:
        con.close()
