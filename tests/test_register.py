"""register: real MLflow sqlite registry, real tiny models trained for real steps and scored with the finetune
scoring code: the floor, ties, like-with-like comparison, re-scoring on a new test set, idempotent reruns, history
under concurrent promotes, and the `models` commands."""

from __future__ import annotations

import json
import os
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from bertpipe.core.stage import Stage, run_stage, write_json
from bertpipe.graph.pipeline import load_config
from bertpipe.lib.labelled import Example, write_split
from bertpipe.stages.register import stage as register
from bertpipe.stages.register.declare import VERSION

LABELS = ["neg", "pos"]
POS = ["这个产品很好", "质量很好", "服务好", "好用", "非常好", "很好很满意", "真好", "好极了"]
NEG = ["太差了", "质量差", "服务很差", "差评", "非常差", "差得很", "真差", "差极了"]


def examples(prefix: str, n: int, offset: int = 0) -> list[Example]:
    """Balanced toy reviews: 'pos' texts say 好, 'neg' texts say 差."""
    out = []
    for i in range(n):
        label = LABELS[i % 2]
        words = POS if label == "pos" else NEG
        out.append(Example(id=f"{prefix}{i}", text=words[(i // 2 + offset) % len(words)] + "。" * (i % 3),
                           label=label))
    return out


def write_task(root: Path, task: str, test: list[Example]) -> None:
    tdir = root / "work" / "splits" / task
    tdir.mkdir(parents=True, exist_ok=True)
    info = write_split(tdir / "test.jsonl", test)
    write_json(tdir / "splits.json", {"splits": {"test": info}, "labels": LABELS})


def task_params() -> dict:
    return {"type": "classification", "format": "jsonl", "train": "train.jsonl"}


def tiny_classifier(path: Path, tokenizer_dir: Path, seed: int, steps: int = 0, always: str | None = None) -> Path:
    """A 1-layer BERT classifier: trained ``steps`` AdamW steps on the toy reviews, or forced to one class."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    torch.manual_seed(seed)
    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    cfg = BertConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                     intermediate_size=64, max_position_embeddings=64, num_labels=2,
                     id2label=dict(enumerate(LABELS)), label2id={lab: i for i, lab in enumerate(LABELS)})
    model = BertForSequenceClassification(cfg)
    train = examples("train", 32)
    enc = tok([e.text for e in train], padding=True, return_tensors="pt")
    y = torch.tensor([LABELS.index(e.label) for e in train])
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(steps):
        loss = model(**enc, labels=y).loss
        loss.backward()
        opt.step()
        opt.zero_grad()
    if always is not None:  # the majority-class predictor: one class wins for every input
        with torch.no_grad():
            model.classifier.weight.zero_()
            model.classifier.bias.copy_(torch.tensor([5.0 if lab == always else -5.0 for lab in LABELS]))
    model.save_pretrained(str(path))
    tok.save_pretrained(str(path))
    return path


def score_on_test(model_dir: Path, root: Path, task: str) -> tuple[float, list[dict]]:
    """The model's macro-F1 and predictions on the task's test split, with the training library's scoring code."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from bertpipe.lib.labelled import read_split
    from bertpipe.lib.training.features import featurize
    from bertpipe.lib.training.params import TaskParams, TrainParams
    from bertpipe.lib.training.predict import score

    tp, trp = TaskParams.model_validate(task_params()), TrainParams()
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    model = AutoModelForSequenceClassification.from_pretrained(str(model_dir))
    exs = read_split(root / "work" / "splits" / task / "test.jsonl")
    split = featurize(tok, exs, tp, trp, {lab: i for i, lab in enumerate(LABELS)}, Counter(), "test")
    flat, _, recs = score(model, split, tp, LABELS, tok.pad_token_id, 64, False)
    return flat["macro_f1"], recs


def finetune_dir(root: Path, name: str, tokenizer_dir: Path, task: str = "sentiment", lr: float = 3e-5,
                 model: Path | None = None, **model_kw) -> Path:
    """A finetune output as the stage writes it: model/, metrics.json (saved seed), predictions, manifest."""
    import shutil

    ft = root / "ft" / name
    if model is not None:
        shutil.copytree(model, ft / "model")
    else:
        tiny_classifier(ft / "model", tokenizer_dir, **model_kw)
    value, recs = score_on_test(ft / "model", root, task)
    write_json(ft / "metrics.json", {"primary": "macro_f1", "per_seed": {
        "42": {"test": {"macro_f1": value}, "saved": True}}})
    with open(ft / "predictions_test.jsonl", "w", encoding="utf-8") as f:
        f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in recs)
    write_json(ft / "manifest.json", {"fingerprint": f"fp-{name}", "inputs": {},
                                      "params": {f"finetune.tasks.{task}": task_params(),
                                                 "finetune.train": {"lr": lr}}})
    return ft


def finetune_output(root: Path, tokenizer_dir: Path, accuracy: float, seed: int) -> Path:
    """A finetune output with a given test accuracy (for tests about display, not about scores)."""
    ft = root / f"ft-{seed}"
    tiny_classifier(ft / "model", tokenizer_dir, seed)
    write_json(ft / "metrics.json", {"primary": "accuracy", "per_seed": {
        str(seed): {"test": {"accuracy": accuracy}, "saved": True}}})
    write_json(ft / "manifest.json", {"fingerprint": f"fp{seed}", "inputs": {},
                                      "params": {"finetune.tasks.sentiment": task_params()}})
    return ft


def register_stage(*fts: Path, tasks: tuple[str, ...] = ("sentiment",)) -> Stage:
    """The register stage over hand-made finetune outputs: the graph's finetune stages, output dirs replaced."""
    from dataclasses import replace

    from bertpipe.stages.finetune.declare import finetune_stage

    def sources(c):
        return {f"finetune/{t}": replace(finetune_stage(t, "adapted"), output=lambda _c, ft=ft: ft)
                for t, ft in zip(tasks, fts)}

    return Stage(
        "register", VERSION, ("register", "tracking"),
        lambda c: {**{k: st.output(c) for k, st in sources(c).items()}, "evaluate": c.work / "evaluate",
                   "adapted": c.work / "pretrain"},
        lambda c: c.work / "register", register.build, sources=sources,
    )


def write_baselines(root: Path, task: str = "sentiment") -> float:
    """work/evaluate/metrics.json with the majority-class baseline computed on the task's test split."""
    from bertpipe.lib.labelled import read_split
    from bertpipe.lib.measures.metrics import classification_metrics

    gold = [e.label for e in read_split(root / "work" / "splits" / task / "test.jsonl")]
    majority = Counter(gold).most_common(1)[0][0]
    flat, _ = classification_metrics(gold, [majority] * len(gold), LABELS)
    path = root / "work" / "evaluate" / "metrics.json"
    ev = json.loads(path.read_text()) if path.exists() else {"split": "test", "tasks": {}}
    ev["tasks"][task] = {"type": "classification", "primary": "macro_f1",
                         "baselines": {"majority": {"macro_f1": flat["macro_f1"]}}}
    write_json(path, ev)
    return flat["macro_f1"]


def make_project(root: Path, register_yaml: str = "register_encoder: false", tasks=("sentiment",)):
    tasks_yaml = ", ".join(f"{t}: {json.dumps(task_params())}" for t in tasks)
    (root / "params.yaml").write_text(f"paths: {{work: work, state: state}}\nregister: {{{register_yaml}}}\n"
                                      f"finetune: {{tasks: {{{tasks_yaml}}}}}\n")
    (root / "work" / "evaluate").mkdir(parents=True, exist_ok=True)
    (root / "work" / "pretrain").mkdir(parents=True, exist_ok=True)
    for t in tasks:
        write_task(root, t, examples(f"{t}-test", 24))
    return load_config(root / "params.yaml")


def record(out: Path, name: str = "bertpipe-sentiment") -> dict:
    return next(m for m in json.loads((out / "registry.json").read_text())["models"] if m["name"] == name)


def versions(cfg, name: str = "bertpipe-sentiment") -> list[str]:
    from bertpipe.infra.tracking import client

    return sorted((str(v.version) for v in client(cfg).search_model_versions(f"name='{name}'")), key=int)


def test_floor_tie_like_with_like_and_rescoring(tmp_path, zh_tokenizer_dir):
    from bertpipe.infra.tracking import client, fluent_mlflow
    from bertpipe.lib.registered.champion import current_champion, history, promote, rollback
    from bertpipe.stages.register.decision import summary_lines

    cfg = make_project(tmp_path)
    floor = write_baselines(tmp_path)
    c = client(cfg)

    # A majority-class model: registered as challenger only, never champion, and it says why.
    majority = finetune_dir(tmp_path, "majority", zh_tokenizer_dir, seed=1, always="pos")
    r = run_stage(register_stage(majority), cfg)
    rec = record(r.out)
    assert rec["value"] == pytest.approx(floor) and rec["below_floor"] and not rec["promoted"]
    assert rec["aliases"] == ["challenger"] and current_champion(c, "bertpipe-sentiment") is None
    mv = c.get_model_version("bertpipe-sentiment", rec["version"])
    assert f"{floor:.4f}" in rec["reason"] and "below the floor" in mv.description
    assert mv.tags["bertpipe.below_floor"] == "true" and f"{floor:.4f}" in mv.tags["bertpipe.decision"]
    assert any("BELOW THE FLOOR" in line for line in summary_lines(r.out / "registry.json"))

    # A trained model above the floor: the first champion.
    good = finetune_dir(tmp_path, "good", zh_tokenizer_dir, seed=2, steps=40)
    rec = record(run_stage(register_stage(good), cfg).out)
    assert rec["value"] > floor and rec["promoted"] and rec["aliases"] == ["challenger", "champion"]
    champ_v = rec["version"]

    # Same weights retrained "with another lr": a different version, the same test set (no re-scoring), a tie.
    tie = finetune_dir(tmp_path, "tie", zh_tokenizer_dir, lr=1e-4, model=good / "model")
    r = run_stage(register_stage(tie), cfg)
    rec = record(r.out)
    assert rec["version"] != champ_v and not rec["reused"]
    assert rec["champion_before"] == champ_v and not rec["champion_rescored"]
    assert rec["champion_value"] == pytest.approx(rec["value"]) and not rec["promoted"] and "ties" in rec["reason"]
    assert str(current_champion(c, "bertpipe-sentiment").version) == champ_v
    decision = (r.out / "decision.md").read_text()
    assert f"Upstream since champion v{champ_v}" in decision and "finetune: changed" in decision
    assert "Floor: majority baseline" in decision

    # The same content again (the register stage reruns for a register param): no new version.
    before = versions(cfg)
    cfg2 = cfg.with_overrides(["register.floor_margin=0.001"])
    rec = record(run_stage(register_stage(tie), cfg2).out)
    assert rec["reused"] and rec["version"] == before[-1] and versions(cfg) == before

    # New test data: the champion is re-scored on it, with the training library's scoring code, before comparing. One text
    # carries both labels, so no model scores 1.0 on it (the champion's recorded score).
    ambiguous = [Example(id=f"amb{i}", text="一般般", label=LABELS[i]) for i in range(2)]
    write_task(tmp_path, "sentiment", examples("new-test", 30, offset=3) + ambiguous)
    new_floor = write_baselines(tmp_path)
    newer = finetune_dir(tmp_path, "newer", zh_tokenizer_dir, seed=3, steps=40)
    rec = record(run_stage(register_stage(newer), cfg).out)
    expected, _ = score_on_test(good / "model", tmp_path, "sentiment")
    assert rec["champion_before"] == champ_v and rec["champion_rescored"]
    assert rec["champion_value"] == pytest.approx(expected, abs=1e-6) and expected < 1.0
    assert rec["promoted"] == (rec["value"] > max(expected, new_floor))
    assert history(c, "bertpipe-sentiment")[0] == champ_v

    # A person promotes the newer version, then rolls back: a later rerun with that content must not undo it.
    newer_v = rec["version"]
    promote(c, "bertpipe-sentiment", newer_v)
    assert rollback(c, "bertpipe-sentiment") == champ_v
    rec = record(run_stage(register_stage(newer), cfg.with_overrides(["register.floor_margin=0.002"])).out)
    assert rec["reused"] and not rec["promoted"] and "held champion before" in rec["reason"]
    assert str(current_champion(c, "bertpipe-sentiment").version) == champ_v

    with fluent_mlflow(cfg) as mlflow:
        pipe = mlflow.transformers.load_model("models:/bertpipe-sentiment@champion")
        assert pipe("不错")[0]["label"] in LABELS


def test_rerun_after_a_failure_registers_nothing_twice(tmp_path, zh_tokenizer_dir):
    from bertpipe.lib.registered.champion import history

    tasks = ("sentiment", "reviews")
    cfg = make_project(tmp_path, tasks=tasks)
    for t in tasks:
        write_baselines(tmp_path, t)
    ft1 = finetune_dir(tmp_path, "a", zh_tokenizer_dir, task="sentiment", seed=1, steps=40)
    ft2 = finetune_dir(tmp_path, "b", zh_tokenizer_dir, task="reviews", seed=2, steps=40)
    weights = ft2 / "model" / "model.safetensors"
    saved = weights.read_bytes()
    weights.unlink()  # the second model is broken: logging it fails after the first was registered
    with pytest.raises(Exception):
        run_stage(register_stage(ft1, ft2, tasks=tasks), cfg)
    from bertpipe.infra.tracking import client

    c = client(cfg)
    assert versions(cfg) == ["1"]
    assert not c.get_registered_model("bertpipe-sentiment").aliases  # no alias moved before all were registered

    weights.write_bytes(saved)
    out = run_stage(register_stage(ft1, ft2, tasks=tasks), cfg).out
    assert versions(cfg) == ["1"] and versions(cfg, "bertpipe-reviews") == ["1"]
    assert record(out)["reused"] and not record(out, "bertpipe-reviews")["reused"]
    for name in ("bertpipe-sentiment", "bertpipe-reviews"):
        assert history(c, name) == ["1"]
        assert set(c.get_model_version(name, "1").aliases) == {"challenger", "champion"}


def test_interleaved_promotes_lose_no_history_and_rollback_to_deleted_version(tmp_path):
    from typer.testing import CliRunner

    from bertpipe.doors.cli.commands import app
    from bertpipe.infra.tracking import client
    from bertpipe.lib.registered.champion import history, promote

    (tmp_path / "params.yaml").write_text("paths: {work: work, state: state}\n")
    cfg = load_config(tmp_path / "params.yaml")
    c = client(cfg)
    c.create_registered_model("m")
    (tmp_path / "src").mkdir()
    n = 12
    for _ in range(n):
        c.create_model_version("m", str(tmp_path / "src"))

    def worker(vs):
        for v in vs:
            promote(c, "m", str(v))

    threads = [threading.Thread(target=worker, args=([v for v in range(1, n + 1) if v % 4 == k],)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    hist = history(c, "m")
    assert sorted(hist, key=int) == [str(v) for v in range(1, n + 1)]  # every promote is in the history, once
    assert str(c.get_model_version_by_alias("m", "champion").version) == hist[-1]

    c.delete_model_version("m", hist[-2])
    runner = CliRunner()
    out = runner.invoke(app, ["models", "rollback", "m", "--params", str(tmp_path / "params.yaml")])
    lines = [ln for ln in out.output.splitlines() if ln.strip()]
    assert out.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error:") and "deleted" in lines[0]
    assert "Traceback" not in out.output and str(c.get_model_version_by_alias("m", "champion").version) == hist[-1]
    out = runner.invoke(app, ["models", "promote", "m", hist[-2], "--params", str(tmp_path / "params.yaml")])
    assert out.exit_code == 2 and out.output.startswith("error:") and "Traceback" not in out.output


def test_promote_refuses_a_degenerate_version_without_force(tmp_path):
    """A version register recorded as degenerate (it learned nothing; the gate never crowns it) is not crowned by
    hand either unless --force says so: one error line, the champion unchanged."""
    from typer.testing import CliRunner

    from bertpipe.doors.cli.commands import app
    from bertpipe.infra.tracking import client
    from bertpipe.lib.registered.champion import promote

    (tmp_path / "params.yaml").write_text("paths: {work: work, state: state}\n")
    c = client(load_config(tmp_path / "params.yaml"))
    c.create_registered_model("m")
    (tmp_path / "src").mkdir()
    for degenerate in ("false", "true"):
        v = c.create_model_version("m", str(tmp_path / "src")).version
        c.set_model_version_tag("m", v, "bertpipe.degenerate", degenerate)  # as register records each task model
    promote(c, "m", "1")
    argv = ["models", "promote", "m", "2", "--params", str(tmp_path / "params.yaml")]
    out = CliRunner().invoke(app, argv)
    lines = [ln for ln in out.output.splitlines() if ln.strip()]
    assert out.exit_code == 2 and len(lines) == 1, out.output
    assert lines[0].startswith("error: model 'm' v2 is degenerate"), out.output
    assert "--force" in lines[0] and str(c.get_model_version_by_alias("m", "champion").version) == "1"
    out = CliRunner().invoke(app, argv + ["--force"])
    assert out.exit_code == 0 and str(c.get_model_version_by_alias("m", "champion").version) == "2", out.output


def test_models_cli(tmp_path, zh_tokenizer_dir):
    from typer.testing import CliRunner

    from bertpipe.doors.cli.commands import app

    cfg = make_project(tmp_path)
    run_stage(register_stage(finetune_output(tmp_path, zh_tokenizer_dir, 0.7, 5)), cfg)
    p = str(tmp_path / "params.yaml")
    runner = CliRunner()
    out = runner.invoke(app, ["models", "list", "--params", p])
    assert out.exit_code == 0 and "bertpipe-sentiment" in out.output and "champion=v1" in out.output
    out = runner.invoke(app, ["models", "show", "bertpipe-sentiment", "--params", p])
    assert out.exit_code == 0 and "accuracy=0.700000" in out.output
    out = runner.invoke(app, ["models", "rollback", "bertpipe-sentiment", "--params", p])
    assert out.exit_code == 2 and "no earlier champion" in out.output
    out = runner.invoke(app, ["models", "promote", "bertpipe-sentiment", "9", "--params", p])
    assert out.exit_code == 2 and "has no version 9" in out.output


def test_require_ci_blocks_an_improvement_the_interval_cannot_tell_from_noise(tmp_path, zh_tokenizer_dir):
    pytest.importorskip("bertpipe.lib.measures.bootstrap")
    cfg = make_project(tmp_path, "register_encoder: false, require_ci: true, ci_samples: 200")
    # One text carries both labels, so every model gets one of them wrong.
    write_task(tmp_path, "sentiment", examples("test", 24) + [Example(id=f"amb{i}", text="一般般", label=LABELS[i])
                                                              for i in range(2)])
    write_baselines(tmp_path)
    good = finetune_dir(tmp_path, "good", zh_tokenizer_dir, seed=2, steps=40)
    assert record(run_stage(register_stage(good), cfg).out)["promoted"]
    # A copy with one wrong test prediction corrected: better by one example of 26, within finetune noise.
    other = finetune_dir(tmp_path, "other", zh_tokenizer_dir, model=good / "model", lr=1e-4)
    metrics = json.loads((other / "metrics.json").read_text())
    recs = [json.loads(x) for x in (other / "predictions_test.jsonl").read_text().splitlines()]
    wrong = next(r for r in recs if r["pred"] != r["label"])
    wrong["pred"] = wrong["label"]
    from bertpipe.lib.measures.metrics import classification_metrics

    metrics["per_seed"]["42"]["test"]["macro_f1"] = classification_metrics(
        [r["label"] for r in recs], [r["pred"] for r in recs], LABELS)[0]["macro_f1"]
    write_json(other / "metrics.json", metrics)
    (other / "predictions_test.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in recs))
    rec = record(run_stage(register_stage(other), cfg).out)
    assert rec["ci95"] is not None and rec["ci95"][0] <= 0 and not rec["promoted"] and "interval" in rec["reason"]


def test_test_set_identity_is_data_and_eval_settings_not_training_params(tmp_path):
    from bertpipe.stages.register.gate import test_identity

    cfg = make_project(tmp_path)
    ft = tmp_path / "ft"
    ft.mkdir()

    def identity(train: dict, task_over: dict | None = None) -> str:
        write_json(ft / "manifest.json", {"fingerprint": "x", "inputs": {}, "params": {
            "finetune.tasks.sentiment": {**task_params(), **(task_over or {})}, "finetune.train": train}})
        return test_identity(cfg, ft, "sentiment")[0]

    base = identity({"lr": 3e-5})
    assert identity({"lr": 1e-3, "epochs": 7, "seeds": [1, 2]}) == base
    assert identity({"lr": 3e-5, "max_seq_len": 64}) != base
    assert identity({"lr": 3e-5, "max_eval_examples": 10}) != base
    assert identity({"lr": 3e-5}, {"truncation": "head_tail"}) != base
    assert identity({"lr": 3e-5}, {"train_overrides": {"lr": 1e-2}}) == base
    write_task(tmp_path, "sentiment", examples("other", 24))
    assert identity({"lr": 3e-5}) != base
    # Without the split's splits.json: the finetune data inputs stand for the test data.
    (tmp_path / "work" / "splits" / "sentiment" / "splits.json").unlink()
    fallback = identity({"lr": 3e-5})
    assert identity({"lr": 1e-3}) == fallback and identity({"lr": 3e-5}, {"split_seed": 1}) != fallback


def tiny_mlm(path: Path, tokenizer_dir: Path, texts: list[str], steps: int, seed: int,
             start: Path | None = None) -> Path:
    """A 1-layer BERT masked LM, from scratch or from ``start``, trained ``steps`` steps on ``texts``."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForMaskedLM

    torch.manual_seed(seed)
    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    model = BertForMaskedLM.from_pretrained(str(start)) if start else BertForMaskedLM(BertConfig(
        vocab_size=len(tok), hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
        max_position_embeddings=64))
    enc = tok(texts, padding=True, truncation=True, max_length=48, return_tensors="pt")
    opt = torch.optim.AdamW(model.parameters(), lr=5e-3)
    for _ in range(steps):
        ids = enc["input_ids"].clone()
        mask = (torch.rand(ids.shape) < 0.15) & (enc["attention_mask"] == 1)
        labels = torch.where(mask, ids, torch.full_like(ids, -100))
        ids[mask] = tok.mask_token_id
        model(input_ids=ids, attention_mask=enc["attention_mask"], labels=labels).loss.backward()
        opt.step()
        opt.zero_grad()
    model.save_pretrained(str(path))
    tok.save_pretrained(str(path))
    return path


def prepared_domain(root: Path, texts: list[str], fingerprint: str) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    d = root / "work" / "prepare" / "domain"
    d.mkdir(parents=True, exist_ok=True)
    for split in ("valid", "test"):
        pq.write_table(pa.table({"text": texts}), d / f"{split}.parquet")
    write_json(root / "work" / "prepare" / "manifest.json", {"fingerprint": fingerprint})


def evaluate_comparison(cfg, base: Path, adapted: Path) -> dict[str, float]:
    """The evaluate stage's encoder comparison into work/evaluate/metrics.json; its gate scores."""
    from types import SimpleNamespace

    from bertpipe.lib.layout import corpus_dir
    from bertpipe.stages.evaluate.stage import _encoder_comparison

    ctx = SimpleNamespace(inputs={"corpus": corpus_dir(cfg, "domain"), "base": base, "adapted": adapted}, cfg=cfg,
                          log=lambda m: None, counts={})
    out = _encoder_comparison(ctx, cfg.params.evaluate, ["base", "adapted"])
    write_json(cfg.work / "evaluate" / "metrics.json", {"encoder_comparison": out})
    return {e: r["neg_nll_per_char"] for e, r in out["gate"].items()}


def test_encoder_gate_floor_reuse_and_rescoring(tmp_path, zh_tokenizer_dir, sample_raw):
    import shutil

    from bertpipe.infra.tracking import client
    from bertpipe.lib.measures.encoder_gate import encoder_gate_score
    from bertpipe.lib.registered.champion import current_champion
    from tests.corpus import law_texts

    (tmp_path / "params.yaml").write_text(
        "paths: {work: work, state: state}\nmodel: {base: base_mlm}\nfinetune: {tasks: {}}\n"
        "evaluate: {mlm_max_texts: 24, mlm_max_seq_len: 48}\n")
    cfg = load_config(tmp_path / "params.yaml")
    (tmp_path / "work" / "evaluate").mkdir(parents=True)
    texts = law_texts(sample_raw, 24)
    prepared_domain(tmp_path, texts, "prep-1")
    base = tiny_mlm(tmp_path / "base_mlm", zh_tokenizer_dir, texts, 0, seed=1)
    adapted = tmp_path / "work" / "pretrain"

    def pretrain_output(fingerprint: str, steps: int, start: Path = base) -> None:
        shutil.rmtree(adapted, ignore_errors=True)
        tiny_mlm(adapted / "model", zh_tokenizer_dir, texts, steps, seed=2, start=start)
        write_json(adapted / "manifest.json", {"fingerprint": fingerprint})

    # The base encoder itself, "adapted" for zero steps: it does not beat its own floor. Evaluate scored both on the
    # same windows: register reads those numbers (no model runs in register).
    pretrain_output("pre-copy", 0)
    evaluated = evaluate_comparison(cfg, base, adapted / "model")
    rec = record(run_stage(register_stage(tasks=()), cfg).out, "bertpipe-encoder")
    assert rec["below_floor"] and not rec["promoted"] and "base encoder" in rec["floor"]
    assert "evaluate's" in rec["score_source"] and "evaluate's score" in rec["floor"]
    assert (rec["value"], rec["floor_value"]) == (evaluated["adapted"], evaluated["base"])

    pretrain_output("pre-trained", 30)
    rec = record(run_stage(register_stage(tasks=()), cfg).out, "bertpipe-encoder")
    assert rec["value"] > rec["floor_value"] and rec["promoted"] and rec["version"] == "2"
    champion_dir = tmp_path / "champion_copy"
    shutil.copytree(adapted / "model", champion_dir)

    # Same content, the stage reruns for another reason: reused, stays champion, nothing registered.
    rec = record(run_stage(register_stage(tasks=()), cfg.with_overrides(["register.floor_margin=0.001"])).out,
                 "bertpipe-encoder")
    assert rec["reused"] and rec["stays_champion"] and versions(cfg, "bertpipe-encoder") == ["1", "2"]

    # New domain data: the champion is re-scored on the new held-out text before the comparison.
    texts = law_texts(sample_raw, 24, offset=500)
    prepared_domain(tmp_path, texts, "prep-2")
    pretrain_output("pre-new", 5, start=champion_dir)
    rec = record(run_stage(register_stage(tasks=()), cfg).out, "bertpipe-encoder")
    assert rec["champion_before"] == "2" and rec["champion_rescored"]
    assert rec["champion_value"] == pytest.approx(encoder_gate_score(champion_dir, cfg)[1], abs=1e-5)
    assert rec["promoted"] == (rec["value"] > rec["champion_value"])
    champion = current_champion(client(cfg), "bertpipe-encoder").version
    assert str(champion) == ("3" if rec["promoted"] else "2")


def test_a_manifest_with_bad_task_params_is_one_error_line(tmp_path):
    """A finetune output whose manifest holds task params this version cannot read (here: no `format`) is named in
    one error line, not a pydantic traceback."""
    from bertpipe.infra.errors import BertpipeError
    from bertpipe.stages.register.gate import task_settings

    (tmp_path / "params.yaml").write_text("paths: {work: work, state: .bertpipe}\n")
    cfg = load_config(tmp_path / "params.yaml")
    ft = tmp_path / "work" / "finetune" / "t" / "adapted"
    ft.mkdir(parents=True)
    write_json(ft / "manifest.json", {"fingerprint": "x", "params": {"finetune.tasks.t": {"type": "classification"}}})
    with pytest.raises(BertpipeError) as e:
        task_settings(cfg, ft, "t")
    assert str(e.value).startswith(f"{ft}/manifest.json: params.finetune.tasks.t: ") and "\n" not in str(e.value)


def test_a_model_registered_from_a_worker_thread_gets_its_inferred_signature(tmp_path, zh_tokenizer_dir, capfd):
    """The flow registers in a worker thread, where MLflow's own signature inference (under a SIGALRM timeout)
    fails and falls back with a warning; the signature is inferred from the pipeline's output instead. Other stage
    threads read the environment meanwhile: MLflow must not swap os.environ's accessors under them (its tracking of
    API-key variables; a thread adding a name while it lists them failed the logging)."""
    from bertpipe.infra.tracking import experiment_id, fluent_mlflow
    from bertpipe.stages.register.record import log_and_register

    make_project(tmp_path)
    cfg = load_config(tmp_path / "params.yaml")
    model_dir = tiny_classifier(tmp_path / "m", zh_tokenizer_dir, seed=1)
    got: dict = {}

    def register_it() -> None:
        try:
            with fluent_mlflow(cfg) as mlflow:
                with mlflow.start_run(experiment_id=experiment_id(cfg)):
                    got["version"] = log_and_register(mlflow, "bertpipe-sentiment", model_dir,
                                                      "text-classification", "zh", [])
                got["info"] = mlflow.models.get_model_info(f"models:/bertpipe-sentiment/{got['version']}")
        except BaseException as e:  # noqa: BLE001 (reported by the assertion below)
            got["error"] = e

    accessors = (os._Environ.get, os._Environ.__getitem__)
    swapped, done = threading.Event(), threading.Event()

    def another_stage() -> None:
        while not done.is_set():
            if (os._Environ.get, os._Environ.__getitem__) != accessors:
                swapped.set()
            os.environ.get("PATH")
            time.sleep(0.0005)

    t, other = threading.Thread(target=register_it), threading.Thread(target=another_stage)
    other.start()
    t.start()
    t.join(300)
    done.set()
    other.join(10)
    assert "error" not in got, got.get("error")
    assert not swapped.is_set(), "mlflow swapped os.environ's accessors while registering"
    err = capfd.readouterr().err  # MLflow's loggers write to stderr through their own handler
    assert "Attempted to generate a signature" not in err, err[-2000:]
    outputs = got["info"].signature.outputs.to_dict()
    assert [o["name"] for o in outputs] == ["label", "score"], outputs


def test_registering_and_loading_print_no_mlflow_warning(tmp_path, zh_tokenizer_dir, capfd):
    """A classifier with its model card: the flavor stores that card instead of looking the local path up on the
    Hub as a repo id (MLflow's "could not be retrieved from the hub" warning). The NER pyfunc, loaded in a fresh
    process as a user loads it, predicts without MLflow's type-hint UserWarning."""
    import subprocess
    import sys
    from types import SimpleNamespace

    from transformers import AutoTokenizer, BertConfig, BertForTokenClassification

    from bertpipe.infra.tracking import experiment_id, fluent_mlflow, tracking_uri
    from bertpipe.lib import modelcard
    from bertpipe.stages.register.record import log_and_register

    cfg = make_project(tmp_path)
    cls_dir = tiny_classifier(tmp_path / "cls", zh_tokenizer_dir, seed=1)
    ctx = SimpleNamespace(cfg=cfg, name="finetune/sentiment/base", fingerprint="a" * 64, inputs={})
    modelcard.write(cls_dir, ctx, pipeline_tag="text-classification", base_model="bert-base-chinese")
    tok = AutoTokenizer.from_pretrained(str(zh_tokenizer_dir))
    tags = ["O", "B-PER", "I-PER"]
    BertForTokenClassification(BertConfig(
        vocab_size=len(tok), hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
        id2label=dict(enumerate(tags)), label2id={t: i for i, t in enumerate(tags)})).save_pretrained(tmp_path / "ner")
    tok.save_pretrained(tmp_path / "ner")
    capfd.readouterr()
    with fluent_mlflow(cfg) as mlflow:
        with mlflow.start_run(experiment_id=experiment_id(cfg)):
            log_and_register(mlflow, "bertpipe-sentiment", cls_dir, "text-classification", "zh", [])
            ner_version = log_and_register(mlflow, "bertpipe-ner", tmp_path / "ner", "token-classification", "zh", [])
    err = capfd.readouterr().err
    assert "could not be retrieved from the hub" not in err and "type hints" not in err, err[-3000:]
    load = ("import mlflow, sys\nmlflow.set_tracking_uri(sys.argv[1])\n"
            f"m = mlflow.pyfunc.load_model('models:/bertpipe-ner/{ner_version}')\n"
            "print(type(m.predict(['张三在北京工作。'])[0]).__name__)\n")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    proc = subprocess.run([sys.executable, "-c", load, tracking_uri(cfg)], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip() == "list", proc.stderr[-3000:]
    assert "Warning" not in proc.stderr, proc.stderr[-3000:]
