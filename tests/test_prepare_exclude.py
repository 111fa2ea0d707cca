"""No leakage by construction: a finetune task's dev/test texts planted in the pretraining corpora are removed by
prepare (exactly, with one character changed, inside a longer line), its train texts are not, and the counts say so."""

from __future__ import annotations

import contextlib
import json
import random
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml

from bertpipe.infra.errors import BertpipeError
from tests import synthetic as S
from bertpipe.core.stage import run_stage
from bertpipe.graph.pipeline import all_stages, load_config
from bertpipe.lib.labelled import read_task
from bertpipe.lib.layout import task_dir

NO_TRACKING = lambda *a: contextlib.nullcontext()  # noqa: E731


def _text(rng: random.Random, n: int) -> str:
    return "".join(rng.choice(S.FILLER) for _ in range(n))


def _one_char_changed(text: str) -> str:
    k = len(text) // 2
    return text[:k] + ("国" if text[k] != "国" else "民") + text[k + 1 :]


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("exclude")
    rng = random.Random(7)
    rows = [{"id": i, "text": _text(rng, 60), "label": "ab"[i % 2]} for i in range(120)]
    S.write_jsonl(root / "task.jsonl", rows)
    params = {
        "paths": {"work": "work", "state": "state"},
        "prepare": {"domain": {"sources": [{"path": "domain.txt", "format": "txt", "name": "dom"}]},
                    "general": {"sources": [{"path": "general.txt", "format": "txt", "name": "gen"}]},
                    "split": {"valid": 0.1, "test": 0.1}},
        "finetune": {"tasks": {"t": {"type": "classification", "format": "jsonl", "train": "task.jsonl",
                                     "dev_ratio": 0.2, "test_ratio": 0.2}}},
    }
    (root / "params.yaml").write_text(yaml.safe_dump(params, allow_unicode=True), encoding="utf-8")
    cfg = load_config(root / "params.yaml")
    stages = all_stages(cfg)
    run_stage(stages["splits"], cfg, tracker_factory=NO_TRACKING)
    data = read_task(task_dir(cfg, "t"))
    test, dev, train = data["test"][0].text, data["dev"][0].text, data["train"][0].text
    planted = {
        "exact": test,
        "one_char": _one_char_changed(data["test"][1].text),
        "inside": _text(rng, 40) + "，" + data["test"][2].text + "。" + _text(rng, 40),
        "dev_spaced": " ".join(dev[i : i + 10] for i in range(0, len(dev), 10)),  # whitespace does not hide it
        "train": train,
    }
    filler = [_text(rng, 50) for _ in range(200)]
    (root / "domain.txt").write_text("\n".join(filler + list(planted.values())) + "\n", encoding="utf-8")
    (root / "general.txt").write_text("\n".join([_text(rng, 50) for _ in range(100)] + [data["test"][3].text])
                                      + "\n", encoding="utf-8")
    run_stage(stages["prepare"], cfg, tracker_factory=NO_TRACKING)
    return cfg, planted, data


def _corpus(cfg, name: str) -> list[str]:
    out = []
    for f in sorted((cfg.work / "prepare" / name).glob("*/part-*.parquet")):
        out += pq.read_table(f).column("text").to_pylist()
    return out


def test_planted_dev_and_test_texts_are_removed_and_train_texts_stay(built):
    cfg, planted, data = built
    domain = _corpus(cfg, "domain")
    for kind in ("exact", "one_char", "inside", "dev_spaced"):
        assert planted[kind] not in domain, kind
    assert planted["train"] in domain and len(domain) == 201
    assert data["test"][3].text not in _corpus(cfg, "general")
    stats = json.loads((cfg.work / "prepare" / "stats.json").read_text(encoding="utf-8"))["corpora"]
    assert stats["domain"]["excluded"]["by_task"]["t"] == {"exact": 2, "contains": 1, "near": 1}
    assert stats["domain"]["excluded"]["docs"] == 4 and stats["general"]["excluded"]["docs"] == 1
    report = (cfg.work / "prepare" / "report.md").read_text(encoding="utf-8")
    assert "removed 4 documents matching finetune tasks' dev/test texts (t: exact 2, contains 1, near 1)" in report


def test_prepare_reruns_when_a_test_split_changes_and_needs_the_splits_stage(built, tmp_path):
    cfg, _, _ = built
    stage = all_stages(cfg)["prepare"]
    assert {k for k in stage.inputs(cfg) if k.startswith("splits/")} == {"splits/t/dev", "splits/t/test"}
    off = load_config(cfg.source, overrides=["prepare.exclude.tasks=false"])
    assert not [k for k in all_stages(off)["prepare"].inputs(off) if k.startswith("splits/")]
    fresh = load_config(cfg.source, overrides=[f"paths.work={tmp_path / 'w'}"])
    with pytest.raises(BertpipeError, match=r"splits/t/dev.*run the stage that makes it first"):
        run_stage(all_stages(fresh)["prepare"], fresh, tracker_factory=NO_TRACKING)
