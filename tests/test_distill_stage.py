"""distill and export stages on a tiny teacher trained for real: the student learns the task from the teacher, is
smaller and faster; the ONNX export matches torch and the int8 file is smaller with mostly equal predictions."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pytest
import torch

from bertpipe.config import load_config
from bertpipe.finetune import synthetic as S
from bertpipe.pipeline import all_stages, distill_stage, export_stage, finetune_stage
from bertpipe.stage import run_stage

torch.set_num_threads(1)
NO_TRACKING = lambda *a: contextlib.nullcontext()  # noqa: E731


def write_project(root: Path, tokenizer_dir: Path, extra: str = "") -> Path:
    enc = S.tiny_encoder(root / "enc", tokenizer_dir, layers=4, hidden=64)
    S.write_jsonl(root / "cls.jsonl", S.keyword_classification(240, seed=1))
    S.write_jsonl(root / "ner.jsonl", S.ner_sentences(300, seed=3))
    (root / "params.yaml").write_text(
        f"""
paths: {{work: work, state: state}}
model: {{base: {enc}}}
finetune:
  encoders: [base]
  train: {{lr: 1.0e-3, epochs: 3, batch_size: 16, max_seq_len: 48, seeds: [7], warmup_ratio: 0.05,
          early_stopping: {{patience: 0}}, bf16: false}}
  tasks:
    cls: {{type: classification, format: jsonl, train: cls.jsonl}}
    ner: {{type: ner, format: jsonl, train: ner.jsonl, train_overrides: {{epochs: 5}}}}
distill: {{teacher_encoder: base, ratio: 0.5, temperature: 2.0, alpha: 0.7, bench_batches: 2,
          train_overrides: {{epochs: 4}}}}
register: {{register_encoder: false}}
{extra}""",
        encoding="utf-8",
    )
    return root


@pytest.fixture(scope="module")
def built(tmp_path_factory, zh_tokenizer_dir):
    root = write_project(tmp_path_factory.mktemp("distill"), zh_tokenizer_dir)
    cfg = load_config(root / "params.yaml")
    out = {}
    for task in ("cls", "ner"):
        run_stage(finetune_stage(task, "base"), cfg, tracker_factory=NO_TRACKING)
        out[task] = run_stage(distill_stage(task), cfg, tracker_factory=NO_TRACKING)
    return root, cfg, out


def test_stage_graph_has_distill_and_export_after_the_finetunes(built):
    _, cfg, _ = built
    names = list(all_stages(cfg))
    assert names.index("distill/cls") > names.index("finetune/cls/base")
    assert {"distill/cls", "distill/ner", "export/cls-student", "export/ner-student"} <= set(names)
    assert "export/encoder" not in names  # register.register_encoder: false
    assert "export/cls" not in names  # register logs the adapted finetunes; this project has only base ones
    assert names.index("export/cls-student") > names.index("distill/cls") and names[-1] == "register"


@pytest.mark.slow
@pytest.mark.parametrize("task, metric, floor", [("cls", "macro_f1", 0.85), ("ner", "f1", 0.4)])
def test_student_learns_from_the_teacher_and_is_smaller_and_faster(built, task, metric, floor):
    _, _, res = built
    m = json.loads((res[task].out / "metrics.json").read_text(encoding="utf-8"))
    assert m["student_init"]["layers"] == 2 and m["student_init"]["layer_map"] == [1, 3]
    assert m["teacher"]["layers"] == 4
    assert m["student"]["test"][metric] > floor, m["student"]["test"]
    assert m["student"]["params"] < m["teacher"]["params"]
    assert m["student"]["size_bytes"] < m["teacher"]["size_bytes"]
    assert m["comparison"]["speedup"] > 1.0  # half the layers; measured side by side in the same run
    assert m["summary"]["test"][metric]["mean"] == m["student"]["test"][metric]  # the finetune schema register reads
    from transformers import AutoModelForSequenceClassification, AutoModelForTokenClassification

    cls = AutoModelForSequenceClassification if task == "cls" else AutoModelForTokenClassification
    assert cls.from_pretrained(str(res[task].out / "model")).config.num_hidden_layers == 2
    assert "| student |" in (res[task].out / "report.md").read_text(encoding="utf-8")


@pytest.mark.slow
@pytest.mark.parametrize("key", ["cls-student", "ner-student"])
def test_export_matches_torch_and_int8_is_smaller(built, key):
    _, cfg, _ = built
    res = run_stage(export_stage(key), cfg, tracker_factory=NO_TRACKING)
    checks = json.loads((res.out / "checks.json").read_text(encoding="utf-8"))
    assert checks["max_abs_diff"]["onnx"] < 1e-3
    assert checks["agreement"]["onnx"] == 1.0
    primary = checks["primary"]
    assert checks["quality"]["onnx"][primary] == pytest.approx(checks["quality"]["torch"][primary], abs=1e-9)
    assert checks["agreement"]["int8"] >= 0.8, checks["agreement"]
    assert (res.out / "model.int8.onnx").stat().st_size < 0.6 * (res.out / "model.onnx").stat().st_size
    meta = json.loads((res.out / "task.json").read_text(encoding="utf-8"))
    assert meta["labels"] and meta["type"] in ("classification", "ner")
    # dynamic axes: another batch size and sequence length than the export's dummy input run through onnxruntime
    from bertpipe.export.onnx import session

    sess = session(res.out / "model.onnx")
    ids = torch.randint(1000, 3000, (3, 29)).numpy()
    feed = {i.name: (ids if i.name == "input_ids" else (ids * 0 + (i.name == "attention_mask")))
            for i in sess.get_inputs()}
    assert sess.run(None, feed)[0].shape[0] == 3
