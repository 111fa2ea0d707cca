"""`bertpipe retrain --add`: each file is read as prepare will read it from the drop dir before anything is copied;
a bad one is a one-line error and the drop dir stays exactly as it was."""

from __future__ import annotations

import json
import os
import threading

import pytest
from typer.testing import CliRunner

from bertpipe.doors.cli.commands import app
from bertpipe.doors.incoming import add_files
from bertpipe.graph.pipeline import load_config
from tests.e2e_project import write_project

GOOD = json.dumps({"id": "a1", "text": "第一条 为了规范数据，制定本法。"}, ensure_ascii=False) + "\n"

CASES = {
    "binary.jsonl": (b"\x00\x01\x02PK\x03\x04" * 20, "NUL byte"),
    "broken.jsonl": ((GOOD + '{"id": "a2", "text": \n').encode(), "broken.jsonl:2"),
    "notext.jsonl": (b'{"id": "a1", "body": "x"}\n', "string field 'text'"),
    "empty.jsonl": (b"", "no record"),
    "blank.jsonl": (b'{"id": "a1", "text": "   "}\n\n', "no record"),
    "array.jsonl": (b'[1, 2, 3]\n', "JSON object"),
    "notes.txt": (GOOD.encode(), "'*.jsonl'"),
    ".hidden.jsonl": (GOOD.encode(), "'*.jsonl'"),
}


@pytest.fixture()
def project(tmp_path, sample_raw):
    params = write_project(tmp_path / "proj", sample_raw)
    drop = params.parent / "data" / "incoming"
    drop.mkdir(parents=True)
    (drop / "earlier.jsonl").write_text(GOOD, encoding="utf-8")
    (drop / "clash.jsonl").write_text(GOOD, encoding="utf-8")
    return params, drop


def _snapshot(d):
    return {p.name: p.read_bytes() for p in sorted(d.iterdir())}


def _retrain(params, files):
    args = ["retrain", "--params", str(params)]
    for f in files:
        args += ["--add", str(f)]
    return CliRunner().invoke(app, args)


@pytest.mark.parametrize("name", sorted(CASES))
def test_a_bad_file_is_rejected_in_one_line_and_nothing_enters_the_drop_dir(project, tmp_path, name):
    params, drop = project
    data, expected = CASES[name]
    good = tmp_path / "good.jsonl"
    good.write_text(GOOD, encoding="utf-8")
    bad = tmp_path / name
    bad.write_bytes(data)
    before = _snapshot(drop)
    res = _retrain(params, [good, bad])  # the good file first: it must not be copied either
    out = res.output
    assert res.exit_code != 0, out
    errors = [ln for ln in out.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1 and expected in errors[0] and str(bad.name) in errors[0], out
    assert "Traceback" not in out
    assert _snapshot(drop) == before
    assert bad.read_bytes() == data


def test_missing_file_and_name_clash(project, tmp_path):
    params, drop = project
    before = _snapshot(drop)
    res = _retrain(params, [tmp_path / "nowhere.jsonl"])
    assert res.exit_code != 0 and "not a file" in res.output and "Traceback" not in res.output
    other = tmp_path / "clash.jsonl"
    other.write_text(GOOD.replace("a1", "b1"), encoding="utf-8")
    res = _retrain(params, [other])
    assert res.exit_code != 0 and "already exists with other content" in res.output
    assert _snapshot(drop) == before


def test_good_files_are_copied_and_the_same_file_twice_is_a_no_op(project, tmp_path):
    params, drop = project
    good = tmp_path / "new_laws.jsonl"
    good.write_text(GOOD * 3, encoding="utf-8")
    cfg = load_config(params)
    assert add_files(cfg, [str(good)]) == [drop / "new_laws.jsonl"]
    assert (drop / "new_laws.jsonl").read_bytes() == good.read_bytes()
    snap = _snapshot(drop)
    add_files(cfg, [str(good), str(drop / "clash.jsonl")])
    assert _snapshot(drop) == snap and not [p for p in drop.iterdir() if p.name.endswith(".tmp")]


def test_the_schedule_reports_a_file_in_the_drop_dir_once_it_has_held_still(tmp_path):
    """`bertpipe schedule`'s watcher (flows/schedule.py): a file still being copied in triggers no run with half of
    it; each new file is reported once; the drop dir may appear after the watcher started."""
    from bertpipe_prefect.flows.schedule import arrivals

    drop = tmp_path / "incoming"
    polls = arrivals(drop, "*.jsonl", threading.Event(), every_s=0)
    assert next(polls) == []
    drop.mkdir()
    with open(drop / "a.jsonl", "w", encoding="utf-8") as f:
        f.write(GOOD)
        f.flush()
        assert next(polls) == []  # seen once: it may still grow
        f.write(GOOD)
        f.flush()
        assert next(polls) == []  # it grew since
    (drop / "notes.txt").write_text(GOOD, encoding="utf-8")  # not the incoming source's glob
    (drop / ".b.jsonl").write_text(GOOD, encoding="utf-8")  # hidden: retrain --add's copy before its rename
    assert next(polls) == ["a.jsonl"]  # held still for a poll interval
    assert next(polls) == []  # reported once
    os.rename(drop / ".b.jsonl", drop / "b.jsonl")
    assert next(polls) == []
    assert next(polls) == ["b.jsonl"]
