"""The optional envtext sample and examples/evidence_climate: the package's labelled sets unpack into a task whose
test texts stay out of the domain corpus, the example's splits stage splits it, and the archive is held to its pin."""

from __future__ import annotations

import contextlib
import json
from collections import Counter
from pathlib import Path

import pytest

from bertpipe.core.stage import run_stage
from bertpipe.graph.pipeline import all_stages, load_config
from bertpipe.infra.errors import BertpipeError
from bertpipe.lib.labelled import SPLITS, read_task, split_info
from bertpipe.lib.layout import task_dir
from bertpipe.lib.samples import SAMPLES, _download, fetch_samples
from tests.e2e_project import REPO

NO_TRACKING = lambda *a: contextlib.nullcontext()  # noqa: E731
ENVTEXT = next(s for s in SAMPLES if s.name == "envtext")


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_envtext_unpacks_the_task_and_a_corpus_without_its_test_texts(climate_raw):
    folder = climate_raw / "envtext"
    rec = json.loads((climate_raw / "SOURCES.json").read_text())["envtext"]
    assert rec["package"] == "envtext==0.1.4" and set(rec["files"]) == {"CLS_IsClimate.json", "SA_Intensity.json"}
    assert set(rec["derived"]) == {"is_climate_train.jsonl", "is_climate_test.jsonl", "corpus.jsonl"}
    src = json.loads((folder / "CLS_IsClimate.json").read_text(encoding="utf-8"))
    for split, fname in (("train", "is_climate_train.jsonl"), ("valid", "is_climate_test.jsonl")):
        rows = _jsonl(folder / fname)
        # every text of the package's split, under the package's label (pos -> climate, neg -> other)
        assert Counter(r["label"] for r in rows) == {"climate": len(src[split]["pos"]),
                                                     "other": len(src[split]["neg"])}
        assert sorted(r["text"] for r in rows) == sorted(src[split]["pos"] + src[split]["neg"])
    test_texts = {r["text"].strip() for r in _jsonl(folder / "is_climate_test.jsonl")}
    corpus = [r["text"].strip() for r in _jsonl(folder / "corpus.jsonl")]
    intensity = json.loads((folder / "SA_Intensity.json").read_text(encoding="utf-8"))
    assert len(corpus) == len(set(corpus)) > len(src["train"]["pos"]) + len(src["train"]["neg"])
    assert not test_texts & set(corpus)
    assert set(corpus) >= {t.strip() for t in intensity["train"]["text"]} - test_texts  # the second set's texts too


def test_example_splits_stage_splits_the_task(tmp_path, climate_raw):
    """examples/evidence_climate/params.yaml as shipped (smoke caps): the splits stage reads the sample's files and
    makes non-empty train/dev/test splits with both labels; test comes from the package's valid split only."""
    cfg = load_config(REPO / "examples" / "evidence_climate" / "params.yaml", "smoke",
                      [f"paths.raw={climate_raw}", f"paths.work={tmp_path / 'work'}", f"paths.state={tmp_path / 's'}"])
    assert cfg.params.finetune.encoders == ["base", "adapted", "tapt"]
    assert [s.path for s in cfg.params.prepare.domain.sources] == ["{raw}/envtext/corpus.jsonl"]
    run_stage(all_stages(cfg)["splits"], cfg, tracker_factory=NO_TRACKING)
    data = read_task(task_dir(cfg, "is_climate"))
    for split in SPLITS:
        assert {ex.label for ex in data[split]} == {"climate", "other"}, split
    assert all(ex.id.split(":")[-1].startswith("valid-") for ex in data["test"])
    assert not {ex.id for ex in data["train"] + data["dev"]} & {ex.id for ex in data["test"]}
    counts = split_info(task_dir(cfg, "is_climate"))["counts"]
    assert (counts["train_examples"], counts["test_examples"]) == (300, 100)  # the smoke profile's caps
    assert counts["train_available"] > 1500 and counts["test_available"] > 1800


def test_an_archive_that_differs_from_its_pin_is_refused_and_dropped(tmp_path):
    cache = tmp_path / "downloads"
    cache.mkdir()
    fake = cache / "envtext-0.1.4-py3-none-any.whl"
    fake.write_bytes(b"not the pinned wheel")
    with pytest.raises(BertpipeError, match="sha256 differs from the one pinned for envtext==0.1.4"):
        _download(ENVTEXT, cache)
    assert not fake.exists()  # the next run downloads it again instead of failing on the cached copy forever


def test_a_lost_derived_file_is_made_again(tmp_path, climate_raw, monkeypatch):
    """Offline (only the download cache can serve the archive): a deleted corpus.jsonl means the sample is not up to
    date, and the refresh writes it again, byte for byte."""
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    raw = tmp_path / "raw"
    fetch_samples(raw, tmp_path, ("envtext",), log=lambda *_: None)
    corpus = raw / "envtext" / "corpus.jsonl"
    want = corpus.read_bytes()
    corpus.unlink()
    said: list[str] = []
    fetch_samples(raw, tmp_path, ("envtext",), log=said.append)
    assert said == [f"envtext: envtext==0.1.4 -> {raw / 'envtext'}"] and corpus.read_bytes() == want
