"""register: real MLflow sqlite registry, real (tiny) transformers models, champion/challenger and rollback."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bertpipe.config import load_config
from bertpipe.register import stage as register
from bertpipe.stage import Stage, run_stage, write_json


def tiny_classifier(path: Path, tokenizer_dir: Path, seed: int) -> Path:
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    torch.manual_seed(seed)
    tok = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    cfg = BertConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                     intermediate_size=64, max_position_embeddings=64, num_labels=2,
                     id2label={0: "neg", 1: "pos"}, label2id={"neg": 0, "pos": 1})
    model = BertForSequenceClassification(cfg)
    model.save_pretrained(str(path))
    tok.save_pretrained(str(path))
    return path


def finetune_output(root: Path, tokenizer_dir: Path, accuracy: float, seed: int) -> Path:
    ft = root / f"ft-{seed}"
    tiny_classifier(ft / "model", tokenizer_dir, seed)
    stat = {"mean": accuracy, "std": 0.0, "values": [accuracy]}
    write_json(ft / "metrics.json", {"primary": "accuracy", "summary": {"test": {"accuracy": stat, "macro_f1": stat}}})
    write_json(ft / "manifest.json", {"fingerprint": f"fp{seed}", "inputs": {"train": {"digest": "same-data"}},
                                      "params": {"finetune.tasks.sentiment": {"type": "classification"}}})
    return ft


def register_stage(ft: Path) -> Stage:
    return Stage(
        "register", register.VERSION, ("register", "tracking"),
        lambda c: {"finetune/sentiment": ft, "evaluate": c.work / "evaluate", "adapted": c.work / "pretrain"},
        lambda c: c.work / "register", register.build,
    )


@pytest.fixture
def project(tmp_path):
    (tmp_path / "params.yaml").write_text("paths: {work: work, state: state}\nregister: {register_encoder: false,"
                                          " min_delta: 0.01}\n")
    (tmp_path / "work" / "evaluate").mkdir(parents=True)
    (tmp_path / "work" / "pretrain").mkdir(parents=True)
    return load_config(tmp_path / "params.yaml")


def test_champion_challenger_promote_rollback_and_loading(project, zh_tokenizer_dir, tmp_path):
    from bertpipe.register.registry import describe_versions, promote, rollback
    from bertpipe.tracking import client, fluent_mlflow

    cfg = project
    r1 = run_stage(register_stage(finetune_output(tmp_path, zh_tokenizer_dir, 0.80, 1)), cfg)
    assert not r1.skipped
    rec = json.loads((r1.out / "registry.json").read_text())["models"][0]
    assert rec["name"] == "bertpipe-sentiment" and rec["promoted"] and rec["aliases"] == ["challenger", "champion"]

    # The same inputs again: nothing registered.
    assert run_stage(register_stage(tmp_path / "ft-1"), cfg).skipped

    # Worse on the same test set (by less than min_delta): challenger only, reason recorded.
    run_stage(register_stage(finetune_output(tmp_path, zh_tokenizer_dir, 0.805, 2)), cfg)
    c = client(cfg)
    rows = {r["version"]: r for r in describe_versions(c, "bertpipe-sentiment")}
    assert rows["1"]["aliases"] == ["champion"] and rows["2"]["aliases"] == ["challenger"]
    assert "champion kept" in rows["2"]["decision"]
    v2 = c.get_model_version("bertpipe-sentiment", "2")
    assert "accuracy" in v2.description and "Lineage" in v2.description

    # Better: promoted.
    run_stage(register_stage(finetune_output(tmp_path, zh_tokenizer_dir, 0.90, 3)), cfg)
    assert str(c.get_model_version_by_alias("bertpipe-sentiment", "champion").version) == "3"
    assert rollback(c, "bertpipe-sentiment") == "1"
    assert str(c.get_model_version_by_alias("bertpipe-sentiment", "champion").version) == "1"
    promote(c, "bertpipe-sentiment", "3")

    with fluent_mlflow(cfg) as mlflow:
        pyfunc = mlflow.pyfunc.load_model("models:/bertpipe-sentiment@champion")
        pred = pyfunc.predict(["这个产品很好", "太差了"])
        assert list(pred["label"]) and set(pred["label"]) <= {"neg", "pos"} and len(pred) == 2
        pipe = mlflow.transformers.load_model("models:/bertpipe-sentiment@champion")
        assert pipe("不错")[0]["label"] in {"neg", "pos"}


def test_models_cli(project, zh_tokenizer_dir, tmp_path):
    from typer.testing import CliRunner

    from bertpipe.cli import app

    run_stage(register_stage(finetune_output(tmp_path, zh_tokenizer_dir, 0.7, 5)), project)
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
