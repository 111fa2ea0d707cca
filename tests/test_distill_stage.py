"""distill and export stages on a tiny teacher trained for real: the student learns the task from the teacher and is
smaller (its speed is bench/bench_export.py's); the ONNX export matches torch and the int8 file is smaller with
mostly equal predictions."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pytest
import torch

from tests import synthetic as S
from bertpipe.core.stage import run_stage
from bertpipe.graph.pipeline import all_stages, load_config
from bertpipe.stages.distill.declare import distill_stage
from bertpipe.stages.export.declare import export_stage
from bertpipe.stages.finetune.declare import finetune_stage
from bertpipe.stages.splits.declare import splits_stage

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
          early_stopping: {{patience: 0}}, precision: fp32}}
  search: {{trials: 0}}
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
    run_stage(splits_stage(cfg), cfg, tracker_factory=NO_TRACKING)  # the splits finetune and distill read
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
def test_student_learns_from_the_teacher_and_is_smaller(built, task, metric, floor):
    _, _, res = built
    m = json.loads((res[task].out / "metrics.json").read_text(encoding="utf-8"))
    assert m["student_init"]["layers"] == 2 and m["student_init"]["layer_map"] == [1, 3]
    assert m["teacher"]["layers"] == 4
    assert m["student"]["test"][metric] > floor, m["student"]["test"]
    assert m["student"]["params"] < m["teacher"]["params"]
    assert m["student"]["size_bytes"] < m["teacher"]["size_bytes"]
    # The speed claim itself (the student is faster) is bench/bench_export.py's: 2 timed batches on a 2-core machine
    # busy with other tests read 0.78x once in CI. Here: the ratio is the two side-by-side measurements'.
    speed = {r: m[r]["speed"]["examples_per_s"] for r in ("teacher", "student")}
    assert min(speed.values()) > 0 and m["comparison"]["speedup"] == pytest.approx(speed["student"] / speed["teacher"])
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
    from bertpipe.lib.inference.backends import session

    sess = session(res.out / "model.onnx")
    ids = torch.randint(1000, 3000, (3, 29)).numpy()
    feed = {i.name: (ids if i.name == "input_ids" else (ids * 0 + (i.name == "attention_mask")))
            for i in sess.get_inputs()}
    assert sess.run(None, feed)[0].shape[0] == 3


def test_student_shapes_and_the_distillation_loss(tmp_path, zh_tokenizer_dir):
    from transformers import AutoModelForTokenClassification

    from bertpipe.stages.distill.loss import Distiller
    from bertpipe.stages.distill.params import DistillParams
    from bertpipe.stages.distill.student import layer_map, make_student

    assert layer_map(6, 3) == [1, 3, 5] and layer_map(12, 6) == [1, 3, 5, 7, 9, 11] and layer_map(4, 1) == [3]
    enc = S.tiny_encoder(tmp_path / "enc", zh_tokenizer_dir, layers=4, hidden=64)
    teacher = AutoModelForTokenClassification.from_pretrained(str(enc), num_labels=3).eval()
    same, info = make_student(teacher, DistillParams(ratio=0.5), seed=0)
    assert info["layer_map"] == [1, 3]
    t_state, s_state = teacher.state_dict(), same.state_dict()
    assert torch.equal(s_state["bert.encoder.layer.0.attention.self.query.weight"],
                       t_state["bert.encoder.layer.1.attention.self.query.weight"])
    assert torch.equal(s_state["classifier.weight"], t_state["classifier.weight"])
    small, info = make_student(teacher, DistillParams(student={"layers": 1, "hidden": 32, "heads": 2}), seed=0)
    assert (small.config.hidden_size, small.config.num_hidden_layers) == (32, 1) and info["init"].startswith("random")

    d = Distiller(small, teacher, temperature=2.0, alpha=0.5, hidden_weight=1.0, layer_map=info["layer_map"])
    # Only the student and the projection train: the teacher is invisible to the optimiser and the state snapshot.
    names = [n for n, _ in d.named_parameters()]
    assert names and all(n.startswith(("student.", "proj.")) for n in names)
    ids = torch.randint(1000, 3000, (2, 10))
    labels = torch.full((2, 10), -100)
    labels[:, 1:9] = torch.randint(0, 3, (2, 8))
    out = d(input_ids=ids, attention_mask=torch.ones_like(ids), labels=labels)
    out.loss.backward()
    assert torch.isfinite(out.loss) and d.proj.weight.grad is not None
    assert all(p.grad is None for p in teacher.parameters())
    # A student equal to its teacher has zero soft loss: what remains is the hard-label loss alone.
    twin = Distiller(teacher, teacher, temperature=2.0, alpha=1.0)
    assert twin(input_ids=ids, attention_mask=torch.ones_like(ids), labels=labels).loss.item() == pytest.approx(0.0,
                                                                                                             abs=1e-6)


def test_a_tapt_encoder_can_teach(tmp_path):
    """distill.teacher_encoder names any encoder kind finetune trains, tapt (DAPT + TAPT) included: the student's
    teacher input is that encoder's finetune; a teacher that is not finetuned means no student."""
    (tmp_path / "params.yaml").write_text(
        "paths: {work: w, state: s}\nmodel: {base: some/hub-id}\n"
        "finetune: {encoders: [base, adapted, tapt], tasks: {cls: {type: classification, format: jsonl, "
        "train: cls.jsonl}}}\ndistill: {teacher_encoder: tapt}\n", encoding="utf-8")
    cfg = load_config(tmp_path / "params.yaml")
    assert distill_stage("cls").inputs(cfg)["teacher"] == cfg.work / "finetune" / "cls" / "tapt"
    without = cfg.with_overrides(["finetune.encoders=[base, adapted]"])
    assert "distill/cls" not in all_stages(without)
