"""From the registry alone to how a champion was made: a real tiny finetune (real MLflow sqlite store, real steps),
then register; the champion's source run is the finetune run, with its params, loss curve, curves.png and the task
splits logged as datasets with their digests, and the registered model has a description."""

from __future__ import annotations

import json

import pytest

from bertpipe.graph.pipeline import load_config
from tests import synthetic as S
from bertpipe.core.stage import run_stage
from bertpipe.lib.labelled import split_info
from bertpipe.lib.layout import task_dir
from bertpipe.stages.finetune.declare import finetune_stage
from bertpipe.stages.splits.declare import splits_stage
from tests.test_register import examples, register_stage, write_baselines

pytestmark = pytest.mark.slow


def test_champion_leads_to_its_training_run(tmp_path, zh_tokenizer_dir):
    enc = S.tiny_encoder(tmp_path / "enc", zh_tokenizer_dir, layers=1, hidden=32, positions=64)
    rows = [{"id": e.id, "text": e.text, "label": e.label} for e in examples("train", 96)]
    S.write_jsonl(tmp_path / "train.jsonl", rows)
    (tmp_path / "params.yaml").write_text(
        f"paths: {{work: work, state: state}}\nmodel: {{base: {enc}}}\n"
        "finetune:\n  encoders: [base]\n  train: {lr: 1.0e-2, epochs: 6, batch_size: 8, max_seq_len: 32, "
        "seeds: [7], early_stopping: {patience: 0}}\n  search: {trials: 0}\n"
        "  tasks: {sentiment: {type: classification, format: jsonl, train: train.jsonl, "
        "train_overrides: {eval_batch_size: 16}}}\n"
        "register: {floor: none, register_encoder: false}\n", encoding="utf-8")
    cfg = load_config(tmp_path / "params.yaml")
    run_stage(splits_stage(cfg), cfg)
    ft = run_stage(finetune_stage("sentiment", "base"), cfg)
    from bertpipe.infra.tracking import client

    splits = split_info(task_dir(cfg, "sentiment"))["splits"]
    want = {f"sentiment/{s}": i["sha256"][:36] for s, i in splits.items() if i.get("sha256")}
    # the finetune run names its data itself, before any register (a base-encoder run is never registered)
    logged = client(cfg).get_run(ft.run_id).inputs.dataset_inputs
    assert {d.dataset.name: d.dataset.digest for d in logged} == want and len(logged) == len(want), logged
    contexts = {d.dataset.name: {t.key: t.value for t in d.tags}["mlflow.data.context"] for d in logged}
    assert contexts == {"sentiment/train": "training", "sentiment/dev": "dev", "sentiment/test": "test"}, contexts
    for d in ("evaluate", "pretrain"):
        (tmp_path / "work" / d).mkdir(parents=True)
    write_baselines(tmp_path)
    run_stage(register_stage(ft.out), cfg)

    c = client(cfg)
    rm = c.get_registered_model("bertpipe-sentiment")
    assert "sentiment" in rm.description and "champion" in rm.description
    v = c.get_model_version_by_alias("bertpipe-sentiment", "champion")
    assert v.run_id == ft.run_id == json.loads((ft.out / "manifest.json").read_text())["mlflow_run_id"]
    run = c.get_run(v.run_id)
    assert run.info.status == "FINISHED" and run.data.tags["bertpipe.stage"] == "finetune/sentiment/base"
    assert float(run.data.params["finetune.train.lr"]) == 1e-2
    assert run.data.params["finetune.train.eval_batch_size"] == "16"  # the resolved spec: the task's override in
    curve = c.get_metric_history(v.run_id, "seed7_train_loss")
    assert len(curve) >= 2 and curve[0].step < curve[-1].step
    assert "curves.png" in {f.path for f in c.list_artifacts(v.run_id)}
    digests = {d.dataset.name: d.dataset.digest for d in run.inputs.dataset_inputs}
    assert digests == want and len(run.inputs.dataset_inputs) == len(want), digests  # register adds no second copy

    # the saved model directory carries a Hugging Face model card and still loads in a pipeline
    from huggingface_hub import ModelCard
    from transformers import pipeline

    card = ModelCard.load(ft.out / "model" / "README.md")
    # shown relative to the project, so the card (hashed into later stages) does not depend on where the project lives
    assert card.data.base_model == enc.relative_to(tmp_path).as_posix() and card.data.pipeline_tag == "text-classification"
    assert "test_macro_f1" in card.text and splits["test"]["sha256"][:16] in card.text
    pipe = pipeline("text-classification", model=str(ft.out / "model"))
    assert pipe("质量很好")[0]["label"] in ("pos", "neg")
