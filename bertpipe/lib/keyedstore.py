"""Keyed derived-data stores under ``<paths.state>/tokstore/<key>/``: built once, leased while read, collected.

The pretrain token store (``bertpipe.stages.pretrain.tokstore``) and the fair-MLM window store
(``bertpipe.lib.measures.windows``) are derived from a corpus and keyed by a digest of everything they depend on. This
module is what they share:

- ``open_or_build``: a store that exists is complete (``meta.json`` is written inside the temp dir before it is
  renamed into place). A builder holds ``<key>.lock`` exclusively, so concurrent builders (torchrun ranks, stages
  side by side) build once; the others wait and read it (a wait ends when the store is complete, not when the lock
  is free: the builder goes on to hold a lease). A killed build leaves ``<key>.tmp-*``, which the next builder
  (holding the lock) or ``collect`` removes.
- a lease: every process that opened a store keeps a shared lock on ``<key>.lock`` until it calls ``release`` or
  exits (the memory maps of the token store are read for a whole training run), so ``collect`` never removes a
  store in use.
- ``collect``: stores accumulate per key (each corpus, tokenizer, packing or window change makes one). It removes
  the stores neither kept by the caller (those the current outputs reference) nor among the ``recent`` most recently
  used, and only what this module wrote: directories named by a key holding a ``meta.json`` that names the same key,
  temp dirs of that shape, and lock files of that shape. Anything else in the directory is left alone.

A store's meta.json records its files' content (``content_record``: each file's sha256, and the stat stamp it had
when written), and a reader checks it (``changed_files``): a file whose stamp is unchanged was not written since
(any write, and any call that sets mtime back, sets ctime to the present), so the check costs a stat per file; only
a file with a new stamp (a copied or restored state dir, or a write) is read and hashed again. A store whose
content differs from what was built would feed wrong data under its key (ids out of range only fail steps later).

A lock file is removed only under its exclusive lock, so a process that opened it just before sees, once it holds
the lock, that the path is gone or is another file, and opens it again (``_lock``).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import sys
import time
import uuid
from pathlib import Path
from typing import Callable

KEY = re.compile(r"[0-9a-f]{24}")
_TMP = re.compile(r"([0-9a-f]{24})\.tmp-[0-9a-z]+")
_LOCK = re.compile(r"([0-9a-f]{24})\.lock")
FOLDER = "tokstore"  # under paths.state
KEEP_RECENT = 4  # stores kept beyond the referenced ones: a few recent experiments switch back without a rebuild
_POLL_S = 0.1  # how often a wait for a build checks whether the store is complete
_LEASES: dict[Path, int] = {}  # store dir -> fd holding its shared lock, for this process's lifetime

Log = Callable[[str], None]


def _stderr(m: str) -> None:
    print(m, file=sys.stderr, flush=True)


def root_of(state: Path | str) -> Path:
    return Path(state) / FOLDER


def store_key(parts: dict) -> str:
    """The key of a store derived from ``parts`` (JSON): what names its directory."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:24]


def corpus_digest(corpus: Path | str, split: str) -> str:
    """A corpus split's part of a key: the prepare stage's fingerprint when the corpus is its output (no bytes read),
    else the split files' bytes."""
    from bertpipe.lib.corpusio import split_files

    with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
        return "stage:" + str(json.loads((Path(corpus) / "manifest.json").read_text())["fingerprint"])
    h = hashlib.sha256()
    for f in split_files(corpus, split):
        h.update(f"{f.name}:{f.stat().st_size};".encode())
        with open(f, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                h.update(block)
    return h.hexdigest()


def _lock(path: Path, mode: int, log: Log | None, what: str, give_up: Callable[[], bool] | None = None) -> int | None:
    """An fd of the lock file ``path`` holding ``mode`` (LOCK_SH or LOCK_EX); with ``log`` None, None instead of
    waiting when another process holds it; with ``give_up``, None as soon as ``give_up()`` is true while waiting."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, mode | fcntl.LOCK_NB)
        except BlockingIOError:
            if log is None:
                os.close(fd)
                return None
            log(f"waiting for another process {what} {path.stem}")
            if not _wait(fd, mode, give_up):
                os.close(fd)
                return None
        try:
            same = os.fstat(fd).st_ino == os.stat(path).st_ino
        except FileNotFoundError:
            same = False
        if same:
            return fd
        os.close(fd)  # collected while we waited: lock the file now at that path


def _wait(fd: int, mode: int, give_up: Callable[[], bool] | None) -> bool:
    """Blocks until ``fd`` holds ``mode``: True; or, polling, until ``give_up()`` is true first: False."""
    if give_up is None:
        fcntl.flock(fd, mode)
        return True
    while not give_up():
        try:
            fcntl.flock(fd, mode | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            time.sleep(_POLL_S)
    return False


def open_or_build(root: Path, key: str, build: Callable[[Path], dict], log: Log = _stderr) -> tuple[Path, bool]:
    """``(root/key, built)``: the complete store, built by ``build(tmp_dir) -> meta`` (written as ``meta.json``,
    with ``key``) unless it exists. This process then holds a lease on it until ``release`` or its exit."""
    root.mkdir(parents=True, exist_ok=True)
    final, lock = root / key, root / f"{key}.lock"
    built = False
    while True:
        fd = _lock(lock, fcntl.LOCK_SH, log, "building")
        if (final / "meta.json").is_file():
            with contextlib.suppress(OSError):  # the last use orders collect's "recent"; a read-only state still reads
                os.utime(final / "meta.json")
            old = _LEASES.pop(final, None)
            _LEASES[final] = fd
            if old is not None:
                os.close(old)
            return final, built
        os.close(fd)
        release(final)  # a lease of ours on a store deleted by hand would block our own build
        # Waiting for the exclusive lock gives up once the store is complete: its builder, and any process that
        # read it since, then hold leases (shared locks) for their lifetime, which would keep this wait blocked.
        fd = _lock(lock, fcntl.LOCK_EX, log, "using or building", give_up=(final / "meta.json").is_file)
        if fd is None:
            continue
        try:
            if not (final / "meta.json").is_file():  # not built by another process while we waited
                for stale in root.glob(f"{key}.tmp-*"):  # a killed build: we hold the lock, so no one owns it
                    shutil.rmtree(stale, ignore_errors=True)
                tmp = root / f"{key}.tmp-{uuid.uuid4().hex[:8]}"
                tmp.mkdir()
                try:
                    meta = {"key": key, **build(tmp)}
                    (tmp / "meta.json").write_text(json.dumps(meta, indent=1) + "\n")
                    os.rename(tmp, final)
                except BaseException:
                    shutil.rmtree(tmp, ignore_errors=True)
                    raise
                built = True
        finally:
            os.close(fd)
        # then the lease, as any reader takes it (a collect in between makes the next round build it again)


def _stamp(path: Path) -> list[int]:
    st = path.stat()
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]


def content_record(d: Path, digests: dict[str, str]) -> dict:
    """{file name: {"sha256", "stamp"}} of files in ``d`` whose sha256 the builder computed as it wrote them."""
    return {name: {"sha256": digest, "stamp": _stamp(d / name)} for name, digest in digests.items()}


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def changed_files(d: Path, record: dict | None, names: list[str]) -> list[str]:
    """The files of ``names`` in ``d`` whose content is not what ``record`` (``content_record``) says: all of them
    when there is no record; a file whose stamp is unchanged is taken as recorded without reading it."""
    if not isinstance(record, dict):
        return list(names)
    bad = []
    for name in names:
        rec = record.get(name)
        if not isinstance(rec, dict):
            bad.append(name)
            continue
        try:
            if _stamp(d / name) != rec.get("stamp") and file_sha256(d / name) != rec.get("sha256"):
                bad.append(name)
        except OSError:
            bad.append(name)
    return bad


def release(path: Path | str) -> None:
    """Ends this process's lease on the store at ``path`` (once its reader is done: a long-lived process, such as a
    scheduled flow running stages in-process, would otherwise keep every store it ever read from collection)."""
    fd = _LEASES.pop(Path(path), None)
    if fd is not None:
        os.close(fd)


def _meta(d: Path) -> dict | None:
    try:
        m = json.loads((d / "meta.json").read_text())
    except (OSError, ValueError):
        return None
    return m if isinstance(m, dict) and m.get("key") == d.name else None


def stores(root: Path) -> list[tuple[Path, dict]]:
    """The complete stores under ``root``, most recently used first."""
    out = []
    if root.is_dir():
        for d in root.iterdir():
            if KEY.fullmatch(d.name) and d.is_dir() and not d.is_symlink() and (m := _meta(d)) is not None:
                out.append((d, m))
    return sorted(out, key=lambda dm: -(dm[0] / "meta.json").stat().st_mtime)


def _size(d: Path) -> int:
    return sum(f.stat().st_size for f in d.rglob("*") if f.is_file() and not f.is_symlink())


def collect(root: Path, keep: set[str] | frozenset = frozenset(), recent: int = KEEP_RECENT,
            log: Log = _stderr) -> dict:
    """Removes the stores under ``root`` that are neither in ``keep`` nor among the ``recent`` most recently used
    nor leased by a live process, the temp dirs of builds no one runs, and the lock files left by both.
    Returns ``{"removed": [keys], "in_use": [keys], "kept": [keys], "bytes": freed}``."""
    found = stores(root)
    keep = set(keep) | {d.name for d, _ in found[:max(recent, 0)]}
    res: dict = {"removed": [], "in_use": [], "kept": sorted(d.name for d, _ in found if d.name in keep), "bytes": 0}
    if not root.is_dir():
        return res
    for d, _ in found:
        if d.name in keep or d in _LEASES:
            continue
        lock = root / f"{d.name}.lock"
        fd = _lock(lock, fcntl.LOCK_EX, None, "")
        if fd is None:  # a process reads it (a lease) or rebuilds it
            res["in_use"].append(d.name)
            continue
        try:
            size = _size(d)
            gone = root / f"{d.name}.tmp-gc{uuid.uuid4().hex[:6]}"
            os.rename(d, gone)  # atomic: a store is there complete or not at all, even if this is killed mid-way
            shutil.rmtree(gone, ignore_errors=True)
            lock.unlink(missing_ok=True)
        finally:
            os.close(fd)
        res["removed"].append(d.name)
        res["bytes"] += size
    for f in sorted(root.iterdir(), key=lambda f: f.name.endswith(".lock")):  # temp dirs first, then lock files
        m = _TMP.fullmatch(f.name) or _LOCK.fullmatch(f.name)
        if not m or f.is_symlink() or (m.re is _TMP) != f.is_dir() or not f.exists():
            continue
        key = m.group(1)
        if m.re is _LOCK and (root / key).is_dir():  # a store's lock stays with it
            continue
        fd = _lock(root / f"{key}.lock", fcntl.LOCK_EX, None, "")
        if fd is None:  # a build in progress, or the store is read
            continue
        try:  # no one builds: a temp dir is a killed build's or a killed collect's
            if m.re is _TMP:
                shutil.rmtree(f, ignore_errors=True)
            if not (root / key).exists() and not any(root.glob(f"{key}.tmp-*")):
                (root / f"{key}.lock").unlink(missing_ok=True)
        finally:
            os.close(fd)
    if res["removed"]:
        log(f"token stores: removed {len(res['removed'])} unused ({res['bytes'] / 1e6:.1f} MB) from {root}; kept "
            f"{len(res['kept'])}" + (f", {len(res['in_use'])} in use by another process" if res["in_use"] else ""))
    return res


def referenced(work: Path) -> set[str]:
    """Store keys the stage outputs under ``work`` name in their manifests (``counts.token_store`` and
    ``counts.window_store``: ``{split or name: {"key": ...}}``)."""
    keys: set[str] = set()
    if not Path(work).is_dir():
        return keys
    for mf in Path(work).rglob("manifest.json"):
        try:
            counts = json.loads(mf.read_text()).get("counts") or {}
        except (OSError, ValueError, AttributeError):
            continue
        for name in ("token_store", "window_store"):
            recs = counts.get(name) if isinstance(counts, dict) else None
            for rec in (recs.values() if isinstance(recs, dict) else ()):
                if isinstance(rec, dict) and isinstance(rec.get("key"), str):
                    keys.add(rec["key"])
    return keys
