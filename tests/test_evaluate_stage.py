"""The base-vs-adapted report from real finetune outputs of two tiny encoders, through the stage contract."""

from __future__ import annotations

import contextlib
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from bertpipe.config import load_config
from bertpipe.errors import BertpipeError
from bertpipe.evaluate.stage import compare
from bertpipe.finetune import synthetic as S
from bertpipe.pipeline import evaluate_stage, finetune_pairs, finetune_stage, tasks_stage
from bertpipe.stage import run_stage

torch.set_num_threads(1)
NO_TRACKING = lambda *a: contextlib.nullcontext()  # noqa: E731


def _ft(task_type: str, values: dict[str, dict[str, float]], primary: str) -> dict:
    return {"type": task_type, "primary": primary, "seeds": [int(s) for s in values],
            "per_seed": {s: {"test": v, "dev": v} for s, v in values.items()}}


def test_compare_pairs_seeds_and_handles_one_encoder():
    res = compare(
        {
            ("t", "base"): _ft("classification", {"1": {"macro_f1": 0.5}, "2": {"macro_f1": 0.7}}, "macro_f1"),
            ("t", "adapted"): _ft("classification", {"1": {"macro_f1": 0.6}, "2": {"macro_f1": 0.9}}, "macro_f1"),
            ("n", "adapted"): _ft("ner", {"1": {"f1": 0.4}}, "f1"),
        },
        "test",
    )
    t = res["tasks"]["t"]
    assert t["base"]["macro_f1"]["mean"] == pytest.approx(0.6) and t["adapted"]["macro_f1"]["mean"] == pytest.approx(0.75)
    assert t["delta"]["macro_f1"]["values"] == pytest.approx([0.1, 0.2])
    assert t["delta"]["macro_f1"]["std"] == pytest.approx(0.0707106, rel=1e-4)
    assert "delta" not in res["tasks"]["n"] and res["encoders"] == ["base", "adapted"]


@pytest.fixture(scope="module")
def project(tmp_path_factory, zh_tokenizer_dir):
    root = tmp_path_factory.mktemp("ev")
    base = S.tiny_encoder(root / "base_enc", zh_tokenizer_dir, layers=1, hidden=32, seed=0)
    S.tiny_encoder(root / "work" / "pretrain" / "model", zh_tokenizer_dir, layers=1, hidden=32, seed=1)
    corpus = root / "work" / "prepare" / "domain"
    corpus.mkdir(parents=True)
    pq.write_table(pa.table({"text": ["第一条 为了保护专利权人的合法权益，制定本法。", "", "第二条 本法所称的发明创造。"]}),
                   corpus / "valid.parquet")
    S.write_jsonl(root / "cls.jsonl", S.keyword_classification(120, labels=("pos", "neg", "mid")))
    S.write_jsonl(root / "ner.jsonl", S.ner_sentences(60))
    (root / "params.yaml").write_text(
        f"""
paths: {{work: work, state: state}}
model: {{base: {base}}}
finetune:
  train: {{lr: 1.0e-3, epochs: 1, batch_size: 16, max_seq_len: 48, seeds: [1, 2]}}
  tasks:
    cls: {{type: classification, format: jsonl, train: cls.jsonl}}
    ner: {{type: ner, format: jsonl, train: ner.jsonl}}
evaluate: {{mlm_max_texts: 10, mlm_max_seq_len: 32}}
""",
        encoding="utf-8",
    )
    return root


def test_report_base_vs_adapted(project):
    cfg = load_config(project / "params.yaml")
    with pytest.raises(BertpipeError, match="finetune"):  # nothing finetuned yet
        run_stage(evaluate_stage(), cfg, tracker_factory=NO_TRACKING)
    run_stage(tasks_stage(cfg), cfg, tracker_factory=NO_TRACKING)
    for t, e in finetune_pairs(cfg):
        run_stage(finetune_stage(t, e), cfg, tracker_factory=NO_TRACKING)
    res = run_stage(evaluate_stage(), cfg, tracker_factory=NO_TRACKING)
    out = res.out
    m = json.loads((out / "metrics.json").read_text(encoding="utf-8"))
    assert set(m["tasks"]) == {"cls", "ner"} and m["encoders"] == ["base", "adapted"] and m["split"] == "test"
    for task, primary in (("cls", "macro_f1"), ("ner", "f1")):
        t = m["tasks"][task]
        assert t["primary"] == primary and t["seeds"] == [1, 2]
        for enc in ("base", "adapted"):
            ft = json.loads((cfg.work / "finetune" / task / enc / "metrics.json").read_text(encoding="utf-8"))
            assert t[enc][primary]["values"] == [ft["per_seed"][s]["test"][primary] for s in ("1", "2")]
        d = t["delta"][primary]
        assert d["mean"] == pytest.approx(t["adapted"][primary]["mean"] - t["base"][primary]["mean"])
        assert res.metrics[f"{task}.delta.{primary}"] == pytest.approx(d["mean"])
    assert m["mlm"]["base"]["masked_tokens"] > 0 and m["mlm"]["adapted"]["perplexity"] > 1
    assert m["mlm"]["delta"]["perplexity"] == pytest.approx(m["mlm"]["adapted"]["perplexity"] - m["mlm"]["base"]["perplexity"])
    report = (out / "report.md").read_text(encoding="utf-8")
    assert "| cls | **macro_f1** |" in report and "| ner | **f1** |" in report and "Δ adapted − base" in report
    pictures = [line.split("](")[1].rstrip(")") for line in report.splitlines() if line.startswith("![")]
    assert "figures/primary.png" in pictures and "figures/confusion_cls_adapted.png" in pictures
    assert all((out / p).stat().st_size > 1000 for p in pictures)
    # unchanged inputs: the stage is skipped; a changed evaluate param reruns it
    assert run_stage(evaluate_stage(), cfg, tracker_factory=NO_TRACKING).skipped
    cfg2 = load_config(project / "params.yaml", overrides=["evaluate.perplexity=false"])
    res2 = run_stage(evaluate_stage(), cfg2, tracker_factory=NO_TRACKING)
    assert not res2.skipped and json.loads((res2.out / "metrics.json").read_text())["mlm"] == {}
