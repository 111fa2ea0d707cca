"""The `splits` stage: split files that finetune, prepare, evaluate and register all read; near-duplicates never
straddle a task's splits; caps and label mapping applied once; fingerprint follows the data, not the learning rate."""

from __future__ import annotations

import contextlib
import hashlib
import json
import random
from pathlib import Path

import yaml

from tests import synthetic as S
from bertpipe.core.stage import fingerprint, run_stage
from bertpipe.graph.pipeline import all_stages, load_config
from bertpipe.lib.labelled import SPLITS, read_task, split_info
from bertpipe.lib.layout import task_dir
from bertpipe.stages.splits.leaks import leak_text, near_pairs

NO_TRACKING = lambda *a: contextlib.nullcontext()  # noqa: E731


def _text(rng: random.Random, n: int) -> str:
    return "".join(rng.choice(S.FILLER) for _ in range(n))


def _amend(rng: random.Random, text: str) -> str:
    """One character changed in the middle: a near-duplicate (5-gram Jaccard ~0.8 at 60 chars), not a copy."""
    k = len(text) // 2
    return text[:k] + rng.choice([c for c in S.FILLER if c != text[k]]) + text[k + 1 :]


def _project(root: Path, tasks: dict, train: dict | None = None) -> Path:
    params = {"paths": {"work": "work", "state": "state"},
              "finetune": {"train": {"lr": 1e-3, **(train or {})}, "tasks": tasks}}
    (root / "params.yaml").write_text(yaml.safe_dump(params, allow_unicode=True), encoding="utf-8")
    return root / "params.yaml"


def _laws(root: Path) -> None:
    """40 "laws" of 6 articles; law k and law k+20 are two versions of one law (most articles near-identical, under
    different law_ids); one boilerplate article ends every law, which must not glue all laws into one split."""
    rng = random.Random(0)
    rows = []
    boiler = "本法自公布之日起施行，由国务院有关部门负责解释并组织实施。"
    originals = {k: [_text(rng, 60) for _ in range(5)] for k in range(20)}
    for law in range(40):
        arts = originals[law] if law < 20 else [_amend(rng, a) for a in originals[law - 20]]
        label = ["a", "b", "c", "d"][law % 20 % 4]
        for i, a in enumerate([*arts, boiler]):
            rows.append({"id": f"{law}-{i}", "text": a, "label": label, "law_id": f"L{law}"})
    S.write_jsonl(root / "laws.jsonl", rows)


def test_versions_of_one_law_share_a_split_and_nothing_near_duplicate_crosses(tmp_path):
    _laws(tmp_path)
    cfg = load_config(_project(tmp_path, {"laws": {"type": "classification", "format": "jsonl", "train": "laws.jsonl",
                                                   "group_field": "law_id", "dev_ratio": 0.2, "test_ratio": 0.2}}))
    run_stage(all_stages(cfg)["splits"], cfg, tracker_factory=NO_TRACKING)
    data = read_task(task_dir(cfg, "laws"))
    where = {ex.group: s for s in SPLITS for ex in data[s] if ex.text[:4] != "本法自公"}
    for k in range(20):
        assert where[f"L{k}"] == where[f"L{k + 20}"], k
    assert {s for s in where.values()} == set(SPLITS)  # the boilerplate did not merge everything
    pool = [ex for s in SPLITS for ex in data[s]]
    split_of = [s for s in SPLITS for _ in data[s]]
    pairs = near_pairs([leak_text(ex) for ex in pool], cfg.params.prepare.dedup)
    assert len(pairs) > 0 and all(split_of[i] == split_of[j] for i, j in pairs.tolist())
    counts = split_info(task_dir(cfg, "laws"))["counts"]
    assert counts["groups"] == 40 and counts["groups_after_merge"] == 20
    assert counts["train_near_dup_dropped"] + counts["dev_near_dup_dropped"] > 0  # boilerplate copies went


def test_a_given_test_file_is_kept_and_its_near_duplicates_leave_train(tmp_path):
    rng = random.Random(1)
    test = [{"id": i, "text": _text(rng, 60), "label": "ab"[i % 2]} for i in range(20)]
    train = [{"id": i, "text": _text(rng, 60), "label": "ab"[i % 2]} for i in range(60)]
    train += [{"id": 100, "text": _amend(rng, test[3]["text"]), "label": "b"},
              {"id": 101, "text": test[4]["text"], "label": "a"}]
    S.write_jsonl(tmp_path / "train.jsonl", train)
    S.write_jsonl(tmp_path / "test.jsonl", test)
    cfg = load_config(_project(tmp_path, {"t": {"type": "classification", "format": "jsonl", "train": "train.jsonl",
                                                "test": "test.jsonl", "dev_ratio": 0.1}}))
    run_stage(all_stages(cfg)["splits"], cfg, tracker_factory=NO_TRACKING)
    data = read_task(task_dir(cfg, "t"))
    assert [ex.text for ex in data["test"]] == [r["text"] for r in test]
    kept = {ex.id for s in ("train", "dev") for ex in data[s]}
    assert "train:100" not in kept and "train:101" not in kept and len(kept) == 60


def test_caps_labels_hashes_and_a_fingerprint_of_the_data_only(tmp_path):
    S.write_jsonl(tmp_path / "cls.jsonl", S.keyword_classification(300, seed=1))
    S.write_jsonl(tmp_path / "ner.jsonl", S.ner_sentences(200, seed=2))
    rng = random.Random(2)
    S.write_jsonl(tmp_path / "odd_test.jsonl", [{"id": i, "text": _text(rng, 30), "label": "zzz"} for i in range(5)])
    tasks = {
        "cls": {"type": "classification", "format": "jsonl", "train": "cls.jsonl",
                "train_overrides": {"max_train_examples": 50}},
        "ner": {"type": "ner", "format": "jsonl", "train": "ner.jsonl"},
        "odd": {"type": "classification", "format": "jsonl", "train": "cls.jsonl", "test": "odd_test.jsonl",
                "unknown_label": "map", "unknown_label_name": "<unk>"},
    }
    params = _project(tmp_path, tasks, {"max_eval_examples": 20})
    cfg = load_config(params)
    stage = all_stages(cfg)["splits"]
    run_stage(stage, cfg, tracker_factory=NO_TRACKING)
    info = split_info(task_dir(cfg, "cls"))
    data = read_task(task_dir(cfg, "cls"))
    assert [len(data[s]) for s in SPLITS] == [50, 20, 20]
    assert info["counts"]["train_available"] > 50 and info["labels"] == ["neg", "pos"]
    for s in SPLITS:
        raw = (task_dir(cfg, "cls") / f"{s}.jsonl").read_bytes()
        assert info["splits"][s] == {"examples": len(data[s]), "sha256": hashlib.sha256(raw).hexdigest()}
    ner = split_info(task_dir(cfg, "ner"))
    assert ner["entity_types"] == ["LOC", "PER"] and "B-PER" in ner["labels"]
    odd = read_task(task_dir(cfg, "odd"))
    assert {ex.label for ex in odd["test"]} == {"<unk>"} and "<unk>" in split_info(task_dir(cfg, "odd"))["labels"]
    json.loads((task_dir(cfg, "cls") / "splits.json").read_text())  # plain JSON

    fp = fingerprint(stage, cfg)[0]
    same = load_config(params, overrides=["finetune.train.lr=0.5", "finetune.train.epochs=9"])
    assert fingerprint(all_stages(same)["splits"], same)[0] == fp
    for change in ("finetune.train.max_eval_examples=30", "finetune.tasks.cls.split_seed=5",
                   "prepare.dedup.threshold=0.8"):
        other = load_config(params, overrides=[change])
        assert fingerprint(all_stages(other)["splits"], other)[0] != fp, change
