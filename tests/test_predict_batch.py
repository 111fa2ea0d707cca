"""Batch prediction file handling: formats, bad lines with their numbers, order, --strict leaving nothing behind,
and the pyfunc input shapes. The predictor here is a stand-in that measures text length (the real models are
exercised in test_export_registry.py); what is under test is the file handling around it."""

from __future__ import annotations

import json

import pandas as pd
import pytest

from bertpipe.infra.errors import BertpipeError
from bertpipe.lib.inference.files import predict_file, read_rows
from bertpipe.stages.register.pyfunc import to_records


class LengthPredictor:
    type = "classification"

    def __init__(self):
        self.calls = []

    def predict(self, records):
        self.calls.append(len(records))
        return [{"label": "long" if len(r["text"]) > 3 else "short", "score": 1.0} for r in records]


def test_jsonl_bad_lines_are_reported_and_the_rest_scored_in_order(tmp_path):
    src = tmp_path / "in.jsonl"
    lines = ['{"id": 7, "text": "abcdef"}', "{broken", "", '"ab"', '{"text": ""}', "[1, 2]", '{"text": "xyzw"}']
    src.write_text("\n".join(lines) + "\n", encoding="utf-8")
    msgs = []
    pred = LengthPredictor()
    stats = predict_file(pred, src, tmp_path / "out.jsonl", chunk=2, log=msgs.append)
    rows = [json.loads(x) for x in (tmp_path / "out.jsonl").read_text(encoding="utf-8").splitlines()]
    assert [r["line"] for r in rows] == list(range(1, 8))
    assert rows[0] == {"id": 7, "line": 1, "prediction": {"label": "long", "score": 1.0}}
    assert rows[3]["prediction"]["label"] == "short" and rows[6]["prediction"]["label"] == "long"
    assert [r["line"] for r in rows if "error" in r] == [2, 3, 5, 6]
    assert stats == {"lines": 7, "predicted": 3, "bad": 4}
    assert any(f"{src}:2: not valid JSON" in m for m in msgs) and any(f"{src}:3: empty line" in m for m in msgs)
    assert sum(pred.calls) == 3 and max(pred.calls) <= 2  # batched by chunk


def test_csv_and_txt(tmp_path):
    (tmp_path / "in.csv").write_text('id,text\n1,"hello, world"\n2,\n3,hi\n', encoding="utf-8")
    predict_file(LengthPredictor(), tmp_path / "in.csv", tmp_path / "a.jsonl", log=lambda m: None)
    rows = [json.loads(x) for x in (tmp_path / "a.jsonl").read_text(encoding="utf-8").splitlines()]
    assert [(r["id"], r["line"], "error" in r) for r in rows] == [("1", 2, False), ("2", 3, True), ("3", 4, False)]
    (tmp_path / "in.txt").write_text("first text\n\nthird\n", encoding="utf-8")
    predict_file(LengthPredictor(), tmp_path / "in.txt", tmp_path / "b.jsonl", log=lambda m: None)
    rows = [json.loads(x) for x in (tmp_path / "b.jsonl").read_text(encoding="utf-8").splitlines()]
    assert [("error" in r) for r in rows] == [False, True, False]


def test_strict_stops_and_writes_nothing(tmp_path):
    src = tmp_path / "in.jsonl"
    src.write_text('{"text": "fine"}\n{"nope": 1}\n', encoding="utf-8")
    out = tmp_path / "out.jsonl"
    out.write_text("previous results", encoding="utf-8")
    with pytest.raises(BertpipeError, match=r"in.jsonl:2: expected a non-empty string field 'text'"):
        predict_file(LengthPredictor(), src, out, strict=True, force=True)
    assert out.read_text(encoding="utf-8") == "previous results"
    assert [p.name for p in tmp_path.iterdir()] and not list(tmp_path.glob(".out.jsonl*"))
    (tmp_path / "x.parquet").write_bytes(b"PAR1")
    with pytest.raises(BertpipeError, match="expected a .jsonl"):
        predict_file(LengthPredictor(), tmp_path / "x.parquet", out)
    with pytest.raises(BertpipeError, match="must not overwrite the input"):
        predict_file(LengthPredictor(), src, src)


def test_pyfunc_input_shapes():
    assert to_records(["a", "b"], "ner") == [{"text": "a"}, {"text": "b"}]
    assert to_records("a", "ner") == [{"text": "a"}]
    assert to_records({"question": "q", "context": "c"}, "qa") == [{"question": "q", "context": "c"}]
    assert to_records({"question": ["q1", "q2"], "context": ["c1", "c2"]}, "qa")[1] == {"question": "q2",
                                                                                        "context": "c2"}
    df = pd.DataFrame({"question": ["q"], "context": ["c"]})
    assert to_records(df, "qa") == [{"question": "q", "context": "c"}]
    assert to_records(pd.DataFrame({0: ["t"]}), "ner") == [{"text": "t", "text_pair": None}]


def test_output_is_refused_when_it_exists_or_is_a_directory_naming_the_users_path(tmp_path):
    src = tmp_path / "in.txt"
    src.write_text("abcdef\nxy\n", encoding="utf-8")
    out = tmp_path / "out.jsonl"
    out.write_text("earlier results", encoding="utf-8")
    with pytest.raises(BertpipeError, match=r"out.jsonl: exists; give --force"):
        predict_file(LengthPredictor(), src, out)
    assert out.read_text(encoding="utf-8") == "earlier results"
    predict_file(LengthPredictor(), src, out, force=True, log=lambda m: None)
    assert len(out.read_text(encoding="utf-8").splitlines()) == 2
    (tmp_path / "d").mkdir()
    with pytest.raises(BertpipeError) as e:
        predict_file(LengthPredictor(), src, tmp_path / "d")
    assert str(e.value).startswith(f"{tmp_path / 'd'}: is a directory") and ".tmp" not in str(e.value)
    with pytest.raises(BertpipeError, match="does not exist"):
        predict_file(LengthPredictor(), src, tmp_path / "nope" / "o.jsonl")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["d", "in.txt", "out.jsonl"]


def test_progress_has_a_total(tmp_path, capsys):
    src = tmp_path / "in.jsonl"
    src.write_text('{"text": "abcdef"}\n{broken\n{"text": "xy"}', encoding="utf-8")  # no newline at the end
    predict_file(LengthPredictor(), src, tmp_path / "o.jsonl", log=lambda m: None)
    assert "3/3" in capsys.readouterr().err


def test_cli_checks_its_files_before_the_model(tmp_path):
    """A mistyped input is named at once, before the registry is even opened (loading a model takes seconds)."""
    from typer.testing import CliRunner

    from bertpipe.doors.cli.commands import app

    (tmp_path / "params.yaml").write_text("paths: {work: work, state: .bertpipe}\n", encoding="utf-8")
    res = CliRunner().invoke(app, ["models", "predict", "no-such-model", "-i", str(tmp_path / "missing.jsonl"),
                                   "-o", str(tmp_path / "o.jsonl"), "--params", str(tmp_path / "params.yaml")])
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert res.exit_code == 2 and lines == [f"error: {tmp_path / 'missing.jsonl'}: no such input file"], res.output
    assert not (tmp_path / ".bertpipe").exists()  # nothing was opened or created
