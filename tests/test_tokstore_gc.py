"""Old token stores are collected: unreferenced ones beyond the most recent few go; referenced, recent, leased
(read by a live process) and foreign entries stay; a killed build's temp dir goes, a running build's stays."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from bertpipe.lib import keyedstore

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}

# Opens (building if needed) the store of key argv[2] under argv[1]; the build and the lease then wait for a line
# on stdin when argv[3] says so, so the test can look while a process holds the lock.
OPEN = r"""
import sys
from pathlib import Path
from bertpipe.lib import keyedstore
root, key, hold = Path(sys.argv[1]), sys.argv[2], sys.argv[3]

def build(tmp):
    (tmp / "ids.bin").write_bytes(b"\0" * 1000)
    if hold == "build":
        print("building", flush=True)
        sys.stdin.readline()
    return {"parts": {"test": key}}

keyedstore.open_or_build(root, key, build, log=lambda m: None)
if hold == "lease":
    print("leased", flush=True)
    sys.stdin.readline()
"""


def _key(i: int) -> str:
    return f"{i:024x}"


def _open(root: Path, key: str, hold: str = "none"):
    proc = subprocess.Popen([sys.executable, "-c", OPEN, str(root), key, hold], env=ENV, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    if hold == "none":
        assert proc.wait(timeout=120) == 0
    else:
        assert proc.stdout.readline().strip() in ("leased", "building")
    return proc


def _release(proc) -> None:
    proc.stdin.write("\n")
    proc.stdin.close()
    assert proc.wait(timeout=120) == 0


def test_collect_keeps_referenced_recent_and_foreign_entries(tmp_path):
    root = tmp_path / "state" / "tokstore"
    for i in range(1, 6):  # built (and their leases released) by processes that have exited
        _open(root, _key(i))
        os.utime(root / _key(i) / "meta.json", (1e9 + i, 1e9 + i))  # last used: 5 most recently, 1 least
    work = tmp_path / "work" / "pretrain"
    work.mkdir(parents=True)  # a stage output that uses store 2
    (work / "manifest.json").write_text(json.dumps({"counts": {"token_store": {"train": {"key": _key(2)}}}}))
    (root / "notes").mkdir()  # not ours: any name that is not a key
    (root / "notes" / "a.txt").write_text("mine")
    (root / _key(7)).mkdir()  # a key's name but no meta.json naming it: not written by bertpipe
    (root / _key(7) / "data").write_text("mine too")
    (root / f"{_key(8)}.tmp-deadbeef").mkdir()  # a build killed before it finished
    (root / f"{_key(8)}.lock").touch()
    (root / f"{_key(2)}.tmp-gc0a1b2c").mkdir()  # a collect killed mid-removal, the store built again since

    res = keyedstore.collect(root, keyedstore.referenced(tmp_path / "work"), recent=1, log=lambda m: None)

    assert sorted(res["removed"]) == [_key(1), _key(3), _key(4)]
    assert res["kept"] == [_key(2), _key(5)] and res["in_use"] == [] and res["bytes"] >= 3 * 1000
    assert sorted(p.name for p in root.iterdir()) == sorted(
        [_key(2), f"{_key(2)}.lock", _key(5), f"{_key(5)}.lock", _key(7), "notes"])
    assert (root / "notes" / "a.txt").read_text() == "mine" and (root / _key(7) / "data").is_file()
    # a collected store is built again on its next use
    _open(root, _key(1))
    assert json.loads((root / _key(1) / "meta.json").read_text())["key"] == _key(1)


def test_a_store_read_or_built_by_a_live_process_is_not_removed(tmp_path):
    root = tmp_path / "tokstore"
    reader = _open(root, _key(1), "lease")
    builder = _open(root, _key(2), "build")
    try:
        res = keyedstore.collect(root, recent=0, log=lambda m: None)
        assert res["removed"] == [] and res["in_use"] == [_key(1)]
        assert (root / _key(1) / "meta.json").is_file()
        assert len(list(root.glob(f"{_key(2)}.tmp-*"))) == 1  # the running build's temp dir
    finally:
        _release(reader)
        _release(builder)
    assert (root / _key(2) / "meta.json").is_file()  # the build completed untouched
    res = keyedstore.collect(root, recent=0, log=lambda m: None)
    assert sorted(res["removed"]) == [_key(1), _key(2)] and list(root.iterdir()) == []


def test_gc_command_keeps_what_the_outputs_reference(tmp_path):
    state = tmp_path / "state"
    for i in (1, 2, 3):
        _open(state / "tokstore", _key(i))
        os.utime(state / "tokstore" / _key(i) / "meta.json", (1e9 + i, 1e9 + i))
    (tmp_path / "work" / "evaluate").mkdir(parents=True)
    (tmp_path / "work" / "evaluate" / "manifest.json").write_text(
        json.dumps({"counts": {"window_store": {"test": {"key": _key(1)}}}}))
    params = {"paths": {"work": str(tmp_path / "work"), "state": str(state), "raw": str(tmp_path)}}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    t = time.time()
    out = subprocess.run([sys.executable, "-m", "bertpipe", "gc", "--params", str(tmp_path / "params.yaml"),
                          "--keep-recent", "1", "--json"], env=ENV, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    res = json.loads(out.stdout)
    assert res["removed"] == [_key(2)] and res["kept"] == [_key(1), _key(3)], (res, time.time() - t)
    assert sorted(p.name for p in (state / "tokstore").iterdir() if not p.name.endswith(".lock")) == [_key(1), _key(3)]


def test_this_process_keeps_its_stores_until_it_releases_them(tmp_path):
    root = tmp_path / "tokstore"
    path, built = keyedstore.open_or_build(root, _key(1), lambda tmp: {"parts": {}}, log=lambda m: None)
    assert built and keyedstore.open_or_build(root, _key(1), lambda tmp: {}, log=lambda m: None) == (path, False)
    assert keyedstore.collect(root, recent=0, log=lambda m: None)["removed"] == [] and path.is_dir()
    keyedstore.release(path)
    assert keyedstore.collect(root, recent=0, log=lambda m: None)["removed"] == [_key(1)] and not path.exists()


@pytest.mark.timeout(60)  # the bug this guards against is a process waiting on its own lease forever
def test_a_store_deleted_by_hand_while_leased_is_built_again(tmp_path):
    import shutil

    root = tmp_path / "tokstore"
    path, _ = keyedstore.open_or_build(root, _key(1), lambda tmp: {}, log=lambda m: None)
    shutil.rmtree(path)
    again, built = keyedstore.open_or_build(root, _key(1), lambda tmp: {}, log=lambda m: None)
    assert built and again == path and (path / "meta.json").is_file()
    keyedstore.release(path)


@pytest.mark.timeout(60)  # the bug this guards against is a wait that never ends
def test_a_wait_to_build_ends_when_another_process_completes_the_store_and_leases_it(tmp_path):
    """The race of builders side by side: this one found no store, another built it first and went on reading it
    (a lease: a shared lock held for its lifetime). The wait for the exclusive lock must end on the complete store,
    not on a lock the other process holds until it exits."""
    import fcntl
    import threading

    root = tmp_path / "tokstore"
    root.mkdir()
    other = os.open(root / f"{_key(1)}.lock", os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(other, fcntl.LOCK_SH)  # the other process's lease, taken as it finished its build
    waiting, result = threading.Event(), []

    def log(m):
        if m.startswith("waiting"):
            waiting.set()

    t = threading.Thread(target=lambda: result.append(
        keyedstore.open_or_build(root, _key(1), lambda tmp: {"parts": {"built": "here"}}, log=log)), daemon=True)
    t.start()
    assert waiting.wait(20), "open_or_build did not wait for the lock the other process holds"
    done = root / f"{_key(1)}.tmp-other"  # the other builder's store, complete and renamed into place
    done.mkdir()
    (done / "meta.json").write_text(json.dumps({"key": _key(1), "parts": {"built": "there"}}))
    os.rename(done, root / _key(1))
    t.join(20)
    assert not t.is_alive(), "open_or_build still waits for a lock held by a lease"
    assert result == [(root / _key(1), False)]
    assert json.loads((root / _key(1) / "meta.json").read_text())["parts"] == {"built": "there"}
    keyedstore.release(root / _key(1))
    os.close(other)
