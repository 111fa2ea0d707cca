"""Waiting for an MLflow sqlite store another process holds locked, instead of failing after sqlite's 5 s default.

A project's ``.bertpipe/mlflow.db`` is shared by every bertpipe process (two flows, a `models` command, an `mlflow
ui`, a DB browser a person left open in a transaction). pysqlite gives up on a lock after 5 s and MLflow surfaces
that as an ``OperationalError: database is locked`` traceback. Here every sqlite connection SQLAlchemy opens in this
process waits up to ``BUSY_TIMEOUT_S`` for a lock (``PRAGMA busy_timeout``), and opening the store says once that it
is waiting when the lock is already held; past the timeout the CLI prints one error line (``tracking.unreachable_line``).
"""

from __future__ import annotations

import sqlite3
import sys
import time
from pathlib import Path
from urllib.parse import unquote

BUSY_TIMEOUT_S = 120
_INSTALLED = False


def install_busy_timeout() -> None:
    """``PRAGMA busy_timeout`` on every plain sqlite3 connection SQLAlchemy opens from now on, in any engine."""
    global _INSTALLED
    if _INSTALLED:
        return
    from sqlalchemy import event
    from sqlalchemy.engine import Engine

    @event.listens_for(Engine, "connect")
    def _busy_timeout(dbapi_conn, _record):  # noqa: ANN001 (SQLAlchemy's listener signature)
        if isinstance(dbapi_conn, sqlite3.Connection):  # not Prefect's aiosqlite: it has its own timeouts
            dbapi_conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_S * 1000}")

    _INSTALLED = True


def db_path(uri: str) -> Path | None:
    if not uri.startswith("sqlite:///"):
        return None
    return Path(unquote(uri[len("sqlite:///"):].split("?", 1)[0]))


def _locked(db: Path) -> bool:
    con = sqlite3.connect(str(db), timeout=0, isolation_level=None)
    try:
        con.execute("BEGIN IMMEDIATE")  # fails at once while another connection holds a write (or exclusive) lock
        con.execute("ROLLBACK")
        return False
    except sqlite3.OperationalError as e:
        if "locked" in str(e) or "busy" in str(e):
            return True
        raise
    finally:
        con.close()


def wait_until_unlocked(uri: str, log=None) -> None:
    """Return once the store at ``uri`` can be written; while another process holds it, say so once and wait (up to
    ``BUSY_TIMEOUT_S``; then return and let the write that follows fail with its one-line error)."""
    db = db_path(uri)
    if db is None or not db.is_file():
        return
    try:
        if not _locked(db):
            return
    except sqlite3.Error:
        return  # not a database we can probe: MLflow will say what is wrong with it
    say = log or (lambda m: print(m, file=sys.stderr, flush=True))
    say(f"[tracking] {db} is locked by another process; waiting up to {BUSY_TIMEOUT_S} s for it")
    t0 = time.monotonic()
    while time.monotonic() - t0 < BUSY_TIMEOUT_S:
        time.sleep(0.5)
        try:
            if not _locked(db):
                say(f"[tracking] {db} is free again after {time.monotonic() - t0:.0f} s; continuing")
                return
        except sqlite3.Error:
            return
