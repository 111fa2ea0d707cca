"""Each head trained for real through the stage contract; saved models load in plain transformers pipelines."""

from __future__ import annotations

import contextlib
import json
import random
from pathlib import Path

import pytest
import torch
import yaml

from bertpipe.graph.pipeline import load_config
from bertpipe.infra.errors import BertpipeError
from tests import synthetic as S
from bertpipe.core.stage import run_stage
from bertpipe.stages.finetune.declare import finetune_stage
from bertpipe.stages.splits.declare import splits_stage
from tests.e2e_project import invoke

torch.set_num_threads(1)
NO_TRACKING = lambda *a: contextlib.nullcontext()  # noqa: E731
FIX = Path(__file__).parent / "data" / "finetune"


@pytest.fixture(scope="module")
def project(tmp_path_factory, zh_tokenizer_dir):
    root = tmp_path_factory.mktemp("ft")
    enc = S.tiny_encoder(root / "enc", zh_tokenizer_dir, layers=2, hidden=64)
    S.write_jsonl(root / "cls.jsonl", S.keyword_classification(320, seed=1))
    S.write_jsonl(root / "pair.jsonl", S.pair_classification(320, seed=2))
    S.write_jsonl(root / "ner.jsonl", S.ner_sentences(400, seed=3))
    (root / "qa.json").write_text(json.dumps(S.squad(320, seed=4), ensure_ascii=False), encoding="utf-8")
    rng = random.Random(5)
    long_rows = []
    for i in range(200):  # ~700 characters each; the class keyword sits only in the last 12
        lab = "pos" if i % 2 else "neg"
        body = "".join(rng.choice(S.FILLER) for _ in range(690))
        tail = "".join(rng.choice(S.FILLER) for _ in range(12))
        k = rng.randrange(12)
        long_rows.append({"id": i, "text": body + tail[:k] + S.KEYS[lab] + tail[k:], "label": lab})
    S.write_jsonl(root / "long.jsonl", long_rows)
    (root / "params.yaml").write_text(
        f"""
paths: {{work: work, state: state}}
model: {{base: {enc}}}
finetune:
  encoders: [base]
  train: {{lr: 1.0e-3, epochs: 3, batch_size: 16, max_seq_len: 64, seeds: [7], warmup_ratio: 0.05,
          early_stopping: {{patience: 0}}}}
  search: {{trials: 0}}
  tasks:
    cls: {{type: classification, format: jsonl, train: cls.jsonl}}
    pair: {{type: pair_classification, format: jsonl, train: pair.jsonl}}
    ner: {{type: ner, format: jsonl, train: ner.jsonl, train_overrides: {{epochs: 5}}}}
    qa: {{type: qa, format: squad, train: qa.json, doc_stride: 16, max_query_len: 16}}
    long_tail: {{type: classification, format: jsonl, train: long.jsonl, truncation: tail,
                train_overrides: {{epochs: 6, max_seq_len: 24}}}}
    long_window: {{type: classification, format: jsonl, train: long.jsonl, truncation: window, stride: 48,
                  window_aggregate: vote, train_overrides: {{max_seq_len: 128, epochs: 1, max_train_examples: 48}}}}
""",
        encoding="utf-8",
    )
    return root


def _run(project: Path, task: str):
    cfg = load_config(project / "params.yaml")
    run_stage(splits_stage(cfg), cfg, tracker_factory=NO_TRACKING)  # the split files finetune reads
    res = run_stage(finetune_stage(task, "base"), cfg, tracker_factory=NO_TRACKING)
    return res, json.loads((res.out / "metrics.json").read_text(encoding="utf-8"))


@pytest.mark.slow
@pytest.mark.parametrize(
    "task, metric, floor",
    [("cls", "macro_f1", 0.9), ("pair", "macro_f1", 0.8), ("ner", "f1", 0.5), ("qa", "f1", 0.6)],
)
def test_head_beats_chance_and_loads_in_a_pipeline(project, task, metric, floor):
    from transformers import AutoConfig, pipeline

    from bertpipe.lib.training.heads import auto_class

    res, m = _run(project, task)
    seed = m["per_seed"]["7"]
    assert seed["test"][metric] > floor, seed["test"]
    assert res.metrics[f"test_{metric}"] == pytest.approx(m["summary"]["test"][metric]["mean"])
    assert (res.out / "curves.png").stat().st_size > 0 and (res.out / "predictions_test.jsonl").is_file()
    model_dir = str(res.out / "model")
    model = auto_class(m["type"]).from_pretrained(model_dir)
    if m["type"] != "qa":
        assert AutoConfig.from_pretrained(model_dir).label2id == {lab: i for i, lab in enumerate(m["labels"])}
    if task == "qa":  # transformers 5 has no question-answering pipeline: plain Auto classes, no bertpipe code
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(model_dir)
        context = "的一是在。李四住在上海。了有和人。"
        enc = tok("李四住在哪里？", context, return_tensors="pt", return_offsets_mapping=True)
        offsets = enc.pop("offset_mapping")[0]
        with torch.no_grad():
            out = model(**enc)
        ctx_tokens = torch.tensor([s == 1 for s in enc.sequence_ids(0)])
        s = int(out.start_logits[0].masked_fill(~ctx_tokens, -1e9).argmax())
        e = int(out.end_logits[0].masked_fill(~ctx_tokens, -1e9)[s:].argmax()) + s
        assert context[int(offsets[s][0]) : int(offsets[e][1])] == "上海"
        return
    pipe = pipeline(m["pipeline_task"], model=model_dir, tokenizer=model_dir, device="cpu")
    if task == "cls":
        out = pipe(["这本书太好了吧", "这本书太坏了吧"])
        assert [o["label"] for o in out] == ["pos", "neg"]
    elif task == "pair":
        assert pipe({"text": "的一好是在", "text_pair": "不了是有和"})["label"] == "same"
    elif task == "ner":
        text = "的一是在李四不了有和人去London"
        ents = pipe(text, aggregation_strategy="simple")
        assert all(text[e["start"] : e["end"]] == e["word"].replace(" ", "") or e["word"].lower() in text.lower()
                   for e in ents)
        assert {e["entity_group"] for e in ents} <= {"PER", "LOC"} and ents


@pytest.mark.slow
def test_documents_far_beyond_max_seq_len(project):
    _, tail = _run(project, "long_tail")
    assert tail["counts"]["train_long"] > 0
    assert tail["per_seed"]["7"]["test"]["macro_f1"] > 0.9  # the keyword is in the kept tail
    res, win = _run(project, "long_window")
    preds = [json.loads(x) for x in (res.out / "predictions_test.jsonl").read_text(encoding="utf-8").splitlines()]
    assert all(p["windows"] >= 6 for p in preds)  # ~700 pieces in windows of 126, every 48
    assert win["counts"]["train_features"] > 6 * win["counts"]["train_examples"]
    # The manifest records the stage's resolved spec (the task's overrides folded in): what `bertpipe config
    # --stage` prints and the fingerprint hashes.
    spec = json.loads((res.out / "manifest.json").read_text(encoding="utf-8"))["params"]
    assert spec["finetune.train"]["max_seq_len"] == 128 and spec["finetune.train"]["epochs"] == 1
    shown = invoke(["config", "--params", str(project / "params.yaml"), "--stage", "finetune/long_window/base"],
                   project)
    assert shown.returncode == 0, shown.stderr
    assert yaml.safe_load(shown.stdout) == spec


def test_cmrc_format_fixture_trains_and_reports(tmp_path, zh_tokenizer_dir):
    enc = S.tiny_encoder(tmp_path / "enc", zh_tokenizer_dir, layers=1, hidden=32)
    # Trained on synthetic SQuAD, scored on the CMRC fixture (training on the test file would be dropped as leakage)
    (tmp_path / "train.json").write_text(json.dumps(S.squad(16, seed=3), ensure_ascii=False), encoding="utf-8")
    (tmp_path / "params.yaml").write_text(
        f"""
paths: {{work: work, state: state}}
model: {{base: {enc}}}
finetune:
  encoders: [base]
  train: {{epochs: 1, batch_size: 4, max_seq_len: 48, seeds: [1, 2]}}
  search: {{trials: 0}}
  tasks:
    cmrc: {{type: qa, format: squad, train: train.json, test: {FIX / 'cmrc_tiny.json'},
           dev_ratio: 0.0, doc_stride: 16}}
""",
        encoding="utf-8",
    )
    res, m = _run(tmp_path, "cmrc")
    assert set(m["per_seed"]) == {"1", "2"} and m["primary"] == "f1"
    assert m["counts"]["test_features"] > m["counts"]["test_examples"] == 4  # long contexts: several windows
    assert 0.0 <= m["summary"]["test"]["f1"]["mean"] <= 1.0 and len(m["summary"]["test"]["f1"]["values"]) == 2
    assert sum(1 for p in m["per_seed"].values() if p.get("saved")) >= 1


def test_unknown_task_and_missing_data_are_one_line_errors(tmp_path):
    (tmp_path / "params.yaml").write_text(
        "finetune:\n  tasks:\n    t: {type: classification, format: jsonl, train: nowhere.jsonl}\n", encoding="utf-8")
    cfg = load_config(tmp_path / "params.yaml")
    with pytest.raises(BertpipeError, match="no task named 'x'"):
        finetune_stage("x", "base").inputs(cfg)
    with pytest.raises(BertpipeError, match=r"does not exist \(run the stage that makes it first\)"):
        run_stage(finetune_stage("t", "base"), cfg, tracker_factory=NO_TRACKING)
    with pytest.raises(BertpipeError, match="nowhere.jsonl does not exist"):
        run_stage(splits_stage(cfg), cfg, tracker_factory=NO_TRACKING)
    with pytest.raises(BertpipeError, match="tasks.t.train_overrides"):
        load_config(tmp_path / "params.yaml", overrides=["finetune.tasks.t.train_overrides={lrr: 1}"])
