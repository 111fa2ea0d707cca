"""Where pretraining starts (bertpipe.lib.lineage), against a real MLflow registry: the same answer for every front
door, continuing from the champion only when the corpus changed since it was trained, and reproducing the
champion's own start otherwise (so a rerun after a retrain rebuilds nothing)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bertpipe.graph.pipeline import all_stages
from bertpipe.graph.pipeline import load_config
from bertpipe.lib import lineage
from bertpipe.lib.registered.versions import cache_dir
from tests.e2e_project import write_project

NAME = "bertpipe-encoder"


@pytest.fixture()
def project(tmp_path, sample_raw):
    # No finetune tasks: prepare's identity (the corpus id) then needs no task splits on disk.
    return write_project(tmp_path / "proj", sample_raw, extra={"finetune": {"tasks": {}}})


def _client(cfg):
    from bertpipe.infra.tracking import client

    return client(cfg)


def _register(cfg, lineage_rec: dict | None) -> str:
    """A registered encoder version whose export (the per-version cache lineage reads) carries ``lineage_rec``."""
    c = _client(cfg)
    try:
        c.create_registered_model(NAME)
    except Exception:
        pass
    src = cfg.state / "sources" / str(len(c.search_model_versions(f"name='{NAME}'")) + 1)
    src.mkdir(parents=True)
    mv = c.create_model_version(NAME, source=src.resolve().as_uri())
    exported = cache_dir(cfg, c.get_model_version(NAME, mv.version))
    exported.mkdir(parents=True)
    conf = {"model_type": "bert"}
    if lineage_rec is not None:
        conf[lineage.KEY] = lineage_rec
    (exported / "config.json").write_text(json.dumps(conf))
    c.set_registered_model_alias(NAME, "champion", mv.version)
    return str(mv.version)


def corpus_id(cfg) -> str:
    """The prepare stage's fingerprint, as the start stage reads it from prepare's manifest once prepare ran."""
    from bertpipe.core.stage import fingerprint
    from bertpipe.stages.prepare.declare import prepare_stage

    return fingerprint(prepare_stage(), cfg)[0]


def resolve(cfg):
    return lineage.resolve(cfg, corpus_id(cfg))


def _decided(cfg):
    """The start stage's decision written where the graph reads it (its build, without a stage run)."""
    from bertpipe.lib.layout import start_file
    from bertpipe.stages.start.stage import decide

    start_file(cfg).parent.mkdir(parents=True, exist_ok=True)
    start_file(cfg).write_text(json.dumps(decide(cfg, corpus_id(cfg))), encoding="utf-8")
    return cfg


def test_no_registry_means_the_base_and_creates_no_store(project):
    cfg = load_config(project)
    start = resolve(cfg)
    assert start.kind == "base" and start.model == cfg.work / "base" / "model"
    assert not (cfg.state / "mlflow.db").exists()


def test_champion_lineage_rules(project):
    cfg = load_config(project)
    corpus = corpus_id(cfg)
    assert corpus and corpus == corpus_id(load_config(project))

    # v1 was trained from the base on exactly this corpus: a rerun starts where v1 started (the base).
    v1 = _register(cfg, {"corpus": corpus, "start": {"kind": "base"}})
    assert resolve(cfg).kind == "base"
    # ... the vocab stage's inputs say so for every door (they all build this graph), once the start stage wrote it.
    assert all_stages(cfg)["vocab"].inputs(_decided(cfg))["model"] == cfg.work / "base" / "model"

    # New data in the drop dir: the corpus changed, so pretraining continues from the champion.
    drop = project.parent / "data" / "incoming"
    drop.mkdir(parents=True)
    (drop / "new.jsonl").write_text(json.dumps({"id": "n1", "text": "新的法律条文。"}, ensure_ascii=False) + "\n")
    grown = load_config(project)
    assert corpus_id(grown) != corpus
    start = resolve(grown)
    assert (start.kind, start.version) == ("champion", v1)
    assert all_stages(grown)["vocab"].inputs(_decided(grown))["model"] == cache_dir(
        cfg, _client(cfg).get_model_version(NAME, v1))
    assert all_stages(grown)["pretrain"].inputs(grown)["model"] == grown.work / "vocab" / "model"

    # v2, trained from v1 on the grown corpus, becomes champion: a scheduled run on that corpus starts from v1
    # again (the same inputs as the retrain that made v2, so nothing is rebuilt) ...
    v2 = _register(grown, {"corpus": corpus_id(grown), "start": {"kind": "champion", "name": NAME,
                                                                         "version": v1}})
    again = resolve(grown)
    assert (again.kind, again.version, again.model) == ("champion", v1, start.model)
    # ... and the next new data continues from v2.
    (drop / "newer.jsonl").write_text(json.dumps({"id": "n2", "text": "更新的法律条文。"}, ensure_ascii=False) + "\n")
    assert resolve(load_config(project)).version == v2

    # retrain_from: base always adapts the base; an explicit continue_from always wins.
    assert resolve(load_config(project, overrides=["flow.retrain_from=base"])).kind == "base"
    explicit = resolve(load_config(project, overrides=[f"model.continue_from={start.model}"]))
    assert (explicit.kind, explicit.model) == ("path", Path(start.model))


def test_a_champion_without_lineage_is_continued_from(project):
    cfg = load_config(project)
    v = _register(cfg, None)
    assert (resolve(cfg).kind, resolve(cfg).version) == ("champion", v)
