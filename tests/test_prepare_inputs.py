"""Corpus sources that would hang or corrupt prepare: a FIFO (named pipe) and a file of mixed encodings.

Both go through the real CLI in a subprocess (a hang shows as the subprocess timing out): one ``error:`` line naming
the file (and line), a non-zero exit, no traceback, and no MLflow run opened for prepare."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bertpipe.infra.errors import BertpipeError
from bertpipe.stages.prepare.files import open_regular, text_lines
from bertpipe.stages.prepare.ingest import Ingest
from bertpipe.stages.prepare.params import SourceParams
from tests.test_prepare_stage import make_config

pytestmark = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs os.mkfifo")

GBK = [f"第{i}条 当事人订立合同，应当遵循公平原则确定各方的权利和义务。" for i in range(40)]
UTF8 = [f"第{i}条 依法成立的合同，对当事人具有法律约束力。" for i in range(10)]


def _cli(params: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    return subprocess.run([sys.executable, "-m", "bertpipe", *args, "--params", str(params)], env=env,
                          capture_output=True, text=True, timeout=120)


def _one_error(r: subprocess.CompletedProcess, *expected: str) -> str:
    out = r.stdout + r.stderr
    assert r.returncode != 0, out
    assert "Traceback" not in out, out
    errors = [ln for ln in out.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1, out
    for e in expected:
        assert e in errors[0], errors[0]
    return errors[0]


def _no_prepare_run(cfg, opened: bool = False) -> None:
    """No run left RUNNING; ``opened``: prepare's run may exist (closed), the error coming from inside the build."""
    from bertpipe.infra.tracking import client, experiment_id

    c = client(cfg)
    runs = c.search_runs([experiment_id(cfg, c)])
    assert not [r for r in runs if r.info.status == "RUNNING"], [r.info.run_name for r in runs]
    if not opened:
        assert not [r for r in runs if "prepare" in (r.info.run_name or "")], [r.info.run_name for r in runs]


def test_fifo_source_is_refused_before_any_run(tmp_path):
    fifo = tmp_path / "pipe.txt"
    os.mkfifo(fifo)
    cfg = make_config(tmp_path, domain=[{"path": str(fifo)}], general=[])
    r = _cli(tmp_path / "params.yaml", "prepare")
    _one_error(r, str(fifo), "expected a regular file, found a FIFO")
    assert not (tmp_path / "work" / "prepare").exists()
    _no_prepare_run(cfg)


@pytest.mark.parametrize("how", ["glob", "directory"])
def test_fifo_among_a_sources_files_is_refused_with_the_inputs(tmp_path, how):
    """own_inputs runs before the fingerprint and the MLflow run: a FIFO a glob or directory matches fails there."""
    from bertpipe.stages.prepare.sources import own_inputs

    d = tmp_path / "in"
    d.mkdir()
    (d / "a.txt").write_text("\n".join(UTF8) + "\n", encoding="utf-8")
    fifo = d / "pipe.txt"
    os.mkfifo(fifo)
    cfg = make_config(tmp_path, domain=[{"path": str(d / "*.txt") if how == "glob" else str(d)}], general=[])
    with pytest.raises(BertpipeError, match=rf"prepare\.domain\.sources\[0\]\.path: {fifo}: expected a regular file"):
        own_inputs(cfg)


def test_open_regular_does_not_block_on_a_fifo_or_read_a_device(tmp_path):
    fifo = tmp_path / "p"
    os.mkfifo(fifo)
    with pytest.raises(BertpipeError, match="found a FIFO"):
        open_regular(fifo)
    if Path("/dev/zero").exists():
        with pytest.raises(BertpipeError, match="found a character device"):
            open_regular("/dev/zero")
    (tmp_path / "f.txt").write_bytes(b"ok\n")
    with open_regular(tmp_path / "f.txt") as fh:
        assert fh.read() == b"ok\n"


def test_retrain_add_refuses_a_fifo(tmp_path):
    from bertpipe.doors.incoming import check_file

    cfg = make_config(tmp_path)
    fifo = tmp_path / "new.jsonl"
    os.mkfifo(fifo)
    with pytest.raises(BertpipeError, match=r"--add: .*new\.jsonl: expected a regular file, found a FIFO"):
        check_file(cfg, fifo)


def _mixed(tmp_path: Path) -> Path:
    """30 GBK lines, 10 UTF-8 lines (lines 31-40), 10 more GBK lines: what concatenating two exports gives."""
    p = tmp_path / "mixed.txt"
    p.write_bytes(("\n".join(GBK[:30]) + "\n").encode("gbk") + ("\n".join(UTF8) + "\n").encode("utf-8")
                  + ("\n".join(GBK[30:]) + "\n").encode("gbk"))
    return p


def test_mixed_encodings_fail_with_the_line_through_the_cli(tmp_path):
    p = _mixed(tmp_path)
    cfg = make_config(tmp_path, domain=[{"path": str(p)}], general=[])
    r = _cli(tmp_path / "params.yaml", "prepare")
    err = _one_error(r, "mixed.txt:31:", "UTF-8", "line 1 is GB18030", "encoding: per-line")
    assert "mojibake" not in err
    assert not (tmp_path / "work" / "prepare").exists()
    _no_prepare_run(cfg, opened=True)  # decoding is found out while reading, inside the stage's run


@pytest.mark.parametrize("chunk", [1 << 20, 97])
def test_mixed_encodings_detected_in_any_chunk(tmp_path, chunk):
    """The disagreeing line is found wherever the chunks are cut (a UTF-8 run after many GB18030 chunks too)."""
    data = _mixed(tmp_path).read_bytes()
    with pytest.raises(BertpipeError, match=r"x\.txt:31: byte offset \d+: this line is UTF-8 but line 1 is GB18030"):
        list(text_lines(io.BytesIO(data), "x.txt", chunk_bytes=chunk))
    utf8_first = ("\n".join(UTF8) + "\n").encode("utf-8") + ("\n".join(GBK) + "\n").encode("gbk")
    with pytest.raises(BertpipeError, match=r"x\.txt:11: .*this line is GB18030 but line 1 is UTF-8"):
        list(text_lines(io.BytesIO(utf8_first), "x.txt", chunk_bytes=chunk))


def test_per_line_encoding_reads_each_line_right(tmp_path):
    p = _mixed(tmp_path)
    ing = Ingest(Path)
    docs = list(ing.documents([SourceParams(path=str(p), encoding="per-line")], "domain"))
    assert [d["text"] for d in docs] == GBK[:30] + UTF8 + GBK[30:]
    assert ing.counts["gb18030_lines"] == 40
    # one encoding throughout reads the same in chunks as small as a line
    for enc, lines in (("gbk", GBK), ("utf-8", UTF8)):
        data = ("\r\n".join(lines) + "\r\n").encode(enc)
        assert list(text_lines(io.BytesIO(data), "y.txt", chunk_bytes=64)) == [*lines, ""]
