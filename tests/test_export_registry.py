"""Registry with exports: real tiny NER and QA heads trained through the finetune stage, exported by the export
stage, registered in a real MLflow sqlite store; loaded back with mlflow.pyfunc and scored with `models predict`."""

from __future__ import annotations

import json

import pytest
import torch

from tests import synthetic as S
from bertpipe.core.stage import run_stage
from bertpipe.graph.pipeline import all_stages, load_config

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def registered(tmp_path_factory, zh_tokenizer_dir):
    root = tmp_path_factory.mktemp("reg")
    # The "adapted" encoder is a tiny random BERT standing in for work/pretrain's output.
    S.tiny_encoder(root / "work" / "pretrain" / "model", zh_tokenizer_dir, layers=2, hidden=64)
    (root / "work" / "evaluate").mkdir(parents=True)
    S.write_jsonl(root / "ner.jsonl", S.ner_sentences(300, seed=3))
    S.write_jsonl(root / "cls.jsonl", S.keyword_classification(240, seed=1))
    (root / "qa.json").write_text(json.dumps(S.squad(240, seed=4), ensure_ascii=False), encoding="utf-8")
    (root / "params.yaml").write_text(
        """
paths: {work: work, state: state}
model: {base: work/pretrain/model}
finetune:
  encoders: [adapted]
  train: {lr: 1.0e-3, epochs: 4, batch_size: 16, max_seq_len: 64, seeds: [7], warmup_ratio: 0.05,
          early_stopping: {patience: 0}, precision: fp32}
  search: {trials: 0}
  tasks:
    ner: {type: ner, format: jsonl, train: ner.jsonl, stride: 8, train_overrides: {epochs: 5}}
    cls: {type: classification, format: jsonl, train: cls.jsonl, truncation: head_tail, head_tokens: 8}
    qa: {type: qa, format: squad, train: qa.json, doc_stride: 16, max_query_len: 16}
distill: {enabled: false}
register: {register_encoder: false}
""",
        encoding="utf-8",
    )
    cfg = load_config(root / "params.yaml")
    stages = all_stages(cfg)
    for name in ("splits", "finetune/ner/adapted", "finetune/qa/adapted", "finetune/cls/adapted", "export/ner",
                 "export/qa", "export/cls", "register"):
        run_stage(stages[name], cfg)
    return root, cfg


@pytest.mark.slow
def test_ner_and_qa_pyfunc_from_the_registry(registered):
    from bertpipe.infra.tracking import client, fluent_mlflow

    root, cfg = registered
    reg = json.loads((root / "work" / "register" / "registry.json").read_text(encoding="utf-8"))
    assert {m["name"] for m in reg["models"]} == {"bertpipe-ner", "bertpipe-qa", "bertpipe-cls"}
    with fluent_mlflow(cfg) as mlflow:
        ner = mlflow.pyfunc.load_model("models:/bertpipe-ner@champion")
        texts = ["的一是在李四不了有和人去北京", "国务院总理李克强在北京会见了法国总统马克龙。"]
        out = ner.predict(texts)
        assert len(out) == 2 and all(isinstance(ents, list) for ents in out)
        for text, ents in zip(texts, out):
            for e in ents:
                assert text[e["start"] : e["end"]] == e["text"] and e["label"] in ("PER", "LOC")
                assert 0.0 < e["score"] <= 1.0
        assert any(e["text"] == "李四" and e["label"] == "PER" for e in out[0]), out[0]

        qa = mlflow.pyfunc.load_model("models:/bertpipe-qa@champion")
        context = "的一是在。李四住在上海。了有和人。"
        res = qa.predict({"question": "李四住在哪里？", "context": context})
        assert len(res) == 1 and res[0]["answer"] == context[res[0]["start"] : res[0]["end"]]
        assert res[0]["answer"] == "上海" and 0.0 < res[0]["score"] <= 1.0
    c = client(cfg)
    v = c.get_model_version_by_alias("bertpipe-ner", "champion")
    assert "Export (ONNX + int8)" in v.description and "max |torch - onnxruntime|" in v.description
    assert v.tags["bertpipe.export_uri"].endswith("bertpipe-export/bertpipe-ner")


@pytest.mark.slow
def test_models_predict_with_bad_lines_every_backend(registered, tmp_path):
    from typer.testing import CliRunner

    from bertpipe.doors.cli.commands import app

    root, _ = registered
    src = tmp_path / "in.jsonl"
    long_text = "的一是在" * 60 + "李四去北京"  # past max_seq_len: the task's windows cover it
    src.write_text("\n".join([json.dumps({"id": "a", "text": "的一是在李四不了有和人去北京"}, ensure_ascii=False),
                              "{not json", json.dumps({"text": long_text}, ensure_ascii=False),
                              json.dumps({"txt": "wrong field"}), '"王五在上海"']) + "\n", encoding="utf-8")
    p = str(root / "params.yaml")
    runner = CliRunner()
    outs = {}
    for backend in ("torch", "onnx", "int8"):
        dst = tmp_path / f"out-{backend}.jsonl"
        res = runner.invoke(app, ["models", "predict", "bertpipe-ner", "--input", str(src), "--output", str(dst),
                                  "--backend", backend, "--params", p])
        assert res.exit_code == 0, res.output
        assert f"{src}:2: not valid JSON" in res.output and f"{src}:4: expected a non-empty string field" in res.output
        rows = [json.loads(ln) for ln in dst.read_text(encoding="utf-8").splitlines()]
        assert [r["line"] for r in rows] == [1, 2, 3, 4, 5] and rows[0]["id"] == "a"
        assert "error" in rows[1] and "error" in rows[3] and "prediction" in rows[4]
        assert any(e["start"] >= 240 and e["text"] == "李四" for e in rows[2]["prediction"]), rows[2]
        outs[backend] = [[(e["start"], e["end"], e["label"]) for e in r.get("prediction", [])] for r in rows]
    assert outs["onnx"] == outs["torch"]
    # --strict: stops at line 2, no output file written, an existing one untouched.
    dst = tmp_path / "strict.jsonl"
    dst.write_text("keep me", encoding="utf-8")
    res = runner.invoke(app, ["models", "predict", "bertpipe-ner/1", "-i", str(src), "-o", str(dst), "--strict",
                              "--force", "--params", p])
    assert res.exit_code == 2 and f"{src}:2:" in res.output and "Traceback" not in res.output
    assert dst.read_text(encoding="utf-8") == "keep me" and not list(tmp_path.glob(".strict.jsonl*"))
    res = runner.invoke(app, ["models", "predict", "bertpipe-nope", "-i", str(src), "-o", str(dst), "--force",
                              "--params", p])
    assert res.exit_code == 2 and "no registered model 'bertpipe-nope'" in res.output


@pytest.mark.slow
def test_models_predict_classification_from_the_transformers_flavor(registered, tmp_path):
    """The classification version is a transformers-flavor model; its ONNX files come from the version's run."""
    from typer.testing import CliRunner

    from bertpipe.doors.cli.commands import app

    root, _ = registered
    src = tmp_path / "in.txt"
    texts = ["这本书太好了吧", "这本书太坏了吧", "的一是在" * 40 + "好"]  # the last: past max_seq_len, head_tail keeps "好"
    src.write_text("\n".join(texts) + "\n", encoding="utf-8")
    labels = {}
    for backend in ("torch", "int8"):
        dst = tmp_path / f"{backend}.jsonl"
        res = CliRunner().invoke(app, ["models", "predict", "bertpipe-cls@champion", "-i", str(src), "-o", str(dst),
                                       "--backend", backend, "--params", str(root / "params.yaml")])
        assert res.exit_code == 0, res.output
        rows = [json.loads(ln) for ln in dst.read_text(encoding="utf-8").splitlines()]
        labels[backend] = [r["prediction"]["label"] for r in rows]
        assert all(0.5 <= r["prediction"]["score"] <= 1.0 for r in rows)
    assert labels["torch"] == ["pos", "neg", "pos"] and labels["int8"] == labels["torch"]


class Counting:
    """A real model that counts the feature rows it is asked to score."""

    def __init__(self, model):
        self.model, self.rows = model, 0
        self.training = False

    def parameters(self):
        return self.model.parameters()

    def eval(self):
        return self

    def train(self, mode: bool = True):
        return self

    def __call__(self, **batch):
        self.rows += len(batch["input_ids"])
        return self.model(**batch)


@pytest.mark.slow
def test_export_checks_score_each_backend_once(registered):
    """The export checks run the test split once per backend (raw outputs and scores from one pass)."""
    from types import SimpleNamespace

    from bertpipe.lib.inference.backends import OrtModel, load_torch
    from bertpipe.stages.export.stage import _task_checks

    root, cfg = registered
    model_dir = root / "work" / "finetune" / "cls" / "adapted" / "model"
    onnx = root / "work" / "export" / "cls" / "model.onnx"
    ctx = SimpleNamespace(cfg=cfg, params=cfg.params.export, log=lambda m: None)
    backends = {"torch": Counting(load_torch(model_dir)), "onnx": Counting(OrtModel(onnx))}
    checks = _task_checks(ctx, "cls", model_dir, backends)
    assert checks["features"] > 0
    assert [b.rows for b in backends.values()] == [checks["features"]] * 2
