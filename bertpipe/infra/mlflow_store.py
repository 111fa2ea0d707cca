"""The embedded MLflow sqlite store: created whole or not at all, and pointing at its own project's artifacts.

MLflow creates a new sqlite store in place: dozens of DDL statements and schema migrations, each committed on its
own (sqlite runs DDL outside MLflow's transaction), the alembic version stamped last. A process killed in between
leaves a store MLflow can neither use nor finish (``table trace_info already exists``, ``duplicate column name``).
So bertpipe creates it in a temp file beside the store and renames it into place once it is at MLflow's schema
head; a store found short of the head (one an interrupted creation left before this existed) is rebuilt when it
holds nothing, and refused with one error line when it holds runs or models.

Copying or moving a project copies its store, whose experiments, runs and model versions hold absolute
``file://`` URIs of the artifact directory beside it: the copy would log into, and read from, the original. On its
first open in a process the project's own store has those URIs that name another project's ``mlartifacts`` rewritten
to its own (``relocate``).
"""

from __future__ import annotations

import ast
import os
import re
import sqlite3
import sys
from pathlib import Path

from bertpipe.infra.errors import BertpipeError

ARTIFACTS_DIR = "mlartifacts"
# The columns MLflow keeps artifact URIs in: (table, column).
_URI_COLUMNS = (("experiments", "artifact_location"), ("runs", "artifact_uri"), ("logged_models", "artifact_location"),
                ("model_versions", "source"), ("model_versions", "storage_location"))
# Tables whose rows are a user's work: a store holding any is never rebuilt.
_DATA_TABLES = ("runs", "registered_models", "model_versions", "logged_models")
_HEAD: list[str] = []


def schema_head() -> str:
    """The alembic revision this MLflow's stores are at once created: read from the text of MLflow's migration
    scripts (``scripts_head``), through alembic only where that text does not say. Every process that opens the
    store asks; alembic imports all ~70 scripts to answer (0.5–1.6 CPU-s a process, measured), the text takes ms."""
    if not _HEAD:
        head = scripts_head(_migrations_dir())
        if head is None:
            from mlflow.store.db.utils import _get_latest_schema_revision

            head = _get_latest_schema_revision()
        _HEAD.append(head)
    return _HEAD[0]


def _migrations_dir() -> Path | None:
    import importlib.util

    spec = importlib.util.find_spec("mlflow")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0]) / "store" / "db_migrations" / "versions"


_REVISION = re.compile(r"^revision\s*(?::[^=]*)?=\s*(.+?)\s*$", re.M)
_DOWN = re.compile(r"^down_revision\s*(?::[^=]*)?=\s*(.+?)\s*$", re.M)


def scripts_head(versions: Path | None) -> str | None:
    """The one revision of the alembic scripts in ``versions`` that no script names as its ``down_revision``; None
    where a script's revision lines are not plain literals or there is not exactly one head (alembic then decides)."""
    if versions is None or not versions.is_dir():
        return None
    revisions, parents = set(), set()
    for script in versions.glob("*.py"):
        if script.name == "__init__.py":
            continue
        text = script.read_text(encoding="utf-8", errors="replace")
        rev, down = _REVISION.findall(text), _DOWN.findall(text)
        if len(rev) != 1 or len(down) != 1:
            return None
        try:
            rev_value, down_value = ast.literal_eval(rev[0]), ast.literal_eval(down[0])
        except (ValueError, SyntaxError):
            return None
        if not isinstance(rev_value, str):
            return None
        revisions.add(rev_value)
        down_values = down_value if isinstance(down_value, (tuple, list)) else (down_value,)
        parents.update(d for d in down_values if d is not None)
    heads = revisions - parents
    return heads.pop() if len(heads) == 1 and parents <= revisions else None


def _inspect(db: Path) -> tuple[str | None, int]:
    """(alembic revision or None, rows of user data) of the store at ``db``."""
    con = sqlite3.connect(str(db), timeout=30)
    try:
        tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        version = None
        if "alembic_version" in tables:
            row = con.execute("SELECT version_num FROM alembic_version").fetchone()
            version = row[0] if row else None
        rows = sum(con.execute(f"SELECT COUNT(*) FROM {t}").fetchone()[0] for t in _DATA_TABLES if t in tables)
        return version, rows
    finally:
        con.close()


def _create(db: Path) -> None:
    """A new store at ``db``: built in a temp file beside it, renamed into place when complete."""
    import sqlalchemy
    from mlflow.store.db.utils import _initialize_tables

    for left in db.parent.glob(f".{db.name}.creating-*"):  # an interrupted creation's temp file (we hold the lock)
        left.unlink(missing_ok=True)
    tmp = db.with_name(f".{db.name}.creating-{os.getpid()}")
    tmp.unlink(missing_ok=True)
    engine = sqlalchemy.create_engine(f"sqlite:///{tmp}")
    try:
        _initialize_tables(engine)
    finally:
        engine.dispose()
    version, _ = _inspect(tmp)
    if version != schema_head():
        tmp.unlink(missing_ok=True)
        raise BertpipeError(f"{db}: MLflow created a store at schema {version}, not {schema_head()}")
    with open(tmp, "rb") as fh:
        os.fsync(fh.fileno())
    for suffix in ("-journal", "-wal", "-shm"):  # an old store's: sqlite would apply a hot journal to the new file
        db.with_name(db.name + suffix).unlink(missing_ok=True)
    os.replace(tmp, db)


def ensure(db: Path) -> None:
    """Make ``db`` a complete store (the caller holds the store's creation lock): create it when absent or empty,
    rebuild it when an interrupted creation left it short of the schema head with nothing in it."""
    db.parent.mkdir(parents=True, exist_ok=True)
    if not db.exists() or db.stat().st_size == 0:
        _create(db)
        return
    try:
        version, rows = _inspect(db)
    except sqlite3.DatabaseError as e:
        raise BertpipeError(f"{db}: not a readable MLflow sqlite store ({e})") from None
    if version == schema_head():
        return
    if rows:
        raise BertpipeError(
            f"{db}: the MLflow store is at schema {version or '(none)'}, this MLflow expects {schema_head()}, and it "
            f"holds {rows} run/model row(s); back it up, then run `mlflow db upgrade sqlite:///{db}`")
    print(f"[tracking] {db}: an interrupted creation left this store incomplete (schema {version or '(none)'}) "
          "and it holds nothing; creating it again", file=sys.stderr, flush=True)
    _create(db)


def require(db: Path, key: str) -> None:
    """For commands that only read the registry: one error line when the store at ``db`` does not exist (opening
    it would create one)."""
    if not db.is_file():
        raise BertpipeError(f"{key}: no MLflow store at {db} (nothing was tracked or registered there; run "
                            "`bertpipe run` or `bertpipe register` first, or point tracking.uri at the store)")


def relocate(db: Path, artifacts: Path) -> list[str]:
    """Rewrite the artifact URIs in the store at ``db`` that name another project's ``mlartifacts`` directory (the
    project was copied or moved) to ``artifacts``; returns the roots rewritten."""
    here = artifacts.resolve().as_uri()
    con = sqlite3.connect(str(db), timeout=120)
    try:
        tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if "experiments" not in tables:
            return []
        roots = sorted({loc for (loc,) in con.execute("SELECT artifact_location FROM experiments")
                        if loc and loc.startswith("file://") and loc.endswith("/" + ARTIFACTS_DIR) and loc != here})
        if not roots:
            return []
        with con:
            for old in roots:
                for table, col in _URI_COLUMNS:
                    if table not in tables:
                        continue
                    con.execute(f"UPDATE {table} SET {col} = ? || substr({col}, ?) "
                                f"WHERE {col} = ? OR substr({col}, 1, ?) = ?",
                                (here, len(old) + 1, old, len(old) + 1, old + "/"))
        return roots
    finally:
        con.close()
