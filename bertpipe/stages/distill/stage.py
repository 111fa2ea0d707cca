"""The distill stage: for one finetune task, a smaller student trained on the task's train split from the finetuned
teacher's soft targets (plus the hard labels), through the training library's loop and scoring code
(``bertpipe.lib.training``).

Output (``ctx.out``): ``model/`` (the student, save_pretrained with tokenizer and id2label, loadable like a finetuned
model), ``metrics.json`` (the finetune schema — primary, per_seed, summary — so register and export treat a student
like any finetuned model, plus ``teacher``/``student``/``comparison``), ``predictions_test.jsonl``, ``report.md``.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bertpipe.infra.errors import BertpipeError


def _scorer(model, split, p, labels, pad, tp, bf16):
    from bertpipe.lib.training.predict import score

    return score(model, split, p, labels, pad, tp.eval_batch_size, bf16)


def _throughput(models: dict, feats: list, pad: int, batch_size: int, n_batches: int) -> dict:
    """Examples/s and per-batch latency of each model over the same test batches, interleaved in one run."""
    from bertpipe.lib.inference.speed import batched, time_calls
    from bertpipe.lib.training.predict import run_model

    chunks = batched(feats, batch_size)[: max(1, n_batches)]
    calls = {name: (lambda c, m=m: len(run_model(m, c, pad, batch_size, False))) for name, m in models.items()}
    return time_calls(calls, chunks, rounds=3)


def report_md(task: str, primary: str, rows: list[dict], speed_ratio: float, quality_ratio: float) -> str:
    lines = [f"# distill: {task}", "",
             "| model | layers | hidden | params | size MB | test " + primary + " | examples/s | p50 ms/batch |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['name']} | {r['layers']} | {r['hidden']} | {r['params']:,} | {r['size_bytes'] / 1e6:.2f} | "
                     f"{r['test'].get(primary, float('nan')):.4f} | {r['speed']['examples_per_s']:.1f} | "
                     f"{r['speed']['p50_ms']:.1f} |")
    share = f"{quality_ratio:.1%}" if quality_ratio == quality_ratio else "n/a (teacher scored 0)"
    lines += ["", f"Student/teacher: {speed_ratio:.2f}x examples/s at {share} of the teacher's test {primary} "
                  "(measured side by side in this run; absolute figures depend on the machine's load)."]
    if rows[0]["layers"] == rows[1]["layers"] and rows[0]["hidden"] == rows[1]["hidden"]:
        lines += ["", "The student has the teacher's shape (nothing to shrink at this ratio): the speed ratio shows "
                      "the measurement's noise."]
    return "\n".join(lines) + "\n"


@dataclass
class _Setup:
    """What the teacher, the student and their scoring share: the task, its featurised splits, the settings."""

    task: str
    p: Any  # the task's TaskParams
    stp: Any  # the student's TrainParams (finetune.train with distill's overrides)
    teacher_dir: Path
    labels: list[str]
    tok: Any
    splits: dict
    pad: int
    device: Any
    bf16: bool  # scoring runs in bf16 where training does; fp16 training scores in fp32
    primary: str
    counts: Counter


def build(ctx, task: str) -> dict:
    from bertpipe.core.stage import write_json

    dp = ctx.params
    d = _load(ctx, task)
    teacher, student, init, res = _fit(ctx, d)
    results = {name: _scores(d, model) for name, model in (("teacher", teacher), ("student", student))}
    _save(ctx, d, student, results["student"])
    rows, comparison = _compare(d, {"teacher": (teacher, d.teacher_dir), "student": (student, ctx.out / "model")},
                                results, dp.bench_batches)
    out = _metrics(d, dp, init, res, results["student"], rows, comparison)
    write_json(ctx.out / "metrics.json", out)
    (ctx.out / "report.md").write_text(report_md(task, d.primary, rows, comparison["speedup"],
                                                 comparison["quality_ratio"]), encoding="utf-8")
    for name in ("metrics.json", "report.md", "predictions_test.jsonl"):
        ctx.log_artifact(ctx.out / name)
    t_val, s_val = rows[0]["test"].get(d.primary, 0.0), rows[1]["test"].get(d.primary, 0.0)
    ctx.log(f"{task}: teacher {d.primary} {t_val:.4f}, student {s_val:.4f}; student {comparison['speedup']:.2f}x "
            f"examples/s, {comparison['param_ratio']:.0%} of the parameters")
    flat = {f"test_{d.primary}": s_val, f"teacher_test_{d.primary}": t_val, "speedup": comparison["speedup"],
            "quality_ratio": comparison["quality_ratio"], "param_ratio": comparison["param_ratio"]}
    ctx.log_metrics(flat)
    ctx.counts.update({k: int(v) for k, v in d.counts.items()})
    return flat


def _load(ctx, task: str) -> _Setup:
    """The finetuned teacher's task, featurised with its tokenizer and labels, and the student's settings."""
    from transformers import AutoTokenizer

    from bertpipe.infra.cores import use_training_threads
    from bertpipe.infra.device import pick_device, precision_for
    from bertpipe.lib.labelled import model_labels, task_examples, task_settings
    from bertpipe.lib.measures.metrics import PRIMARY
    from bertpipe.lib.training.features import featurize
    from bertpipe.lib.training.params import with_overrides

    p, tp = task_settings(ctx.cfg, task, Path(ctx.inputs["teacher"]) / "model", ctx.log)
    stp = with_overrides(tp, ctx.params.train_overrides)
    ctx.counts["torch_threads"] = use_training_threads(stp.num_threads)  # the same in every door (bertpipe.infra.cores)
    device = pick_device(stp.device)
    teacher_dir = Path(ctx.inputs["teacher"]) / "model"
    if not (teacher_dir / "config.json").is_file():
        raise BertpipeError(f"distill/{task}: no finetuned teacher at {ctx.inputs['teacher']}/model")
    counts: Counter = Counter()
    data = task_examples(ctx.cfg, task)
    labels = model_labels(teacher_dir)
    label2id = {lab: i for i, lab in enumerate(labels)}
    tok = AutoTokenizer.from_pretrained(str(teacher_dir))
    splits = {s: featurize(tok, data[s], p, stp, label2id, counts, s) for s in ("train", "dev", "test")}
    prec = precision_for(stp.precision, device)
    ctx.counts.update(prec.record())
    ctx.log(f"{ctx.name}: precision {prec.words()}")
    return _Setup(task, p, stp, teacher_dir, labels, tok, splits, tok.pad_token_id if tok.pad_token_id is not None
                  else 0, device, prec.bf16, PRIMARY[p.type], counts)


def _fit(ctx, d: _Setup) -> tuple[Any, Any, dict, Any]:
    """(teacher, trained student, how the student was made, the training result): the student trained on the
    teacher's soft targets and the hard labels, early-stopped on dev where there is one."""
    from bertpipe.lib.training.heads import auto_class
    from bertpipe.lib.training.loop import train
    from bertpipe.stages.distill.loss import Distiller
    from bertpipe.stages.distill.student import make_student

    dp, seed = ctx.params, d.stp.seeds[0]
    teacher = auto_class(d.p.type).from_pretrained(str(d.teacher_dir)).to(d.device).eval()
    student, init = make_student(teacher, dp, seed)
    student.to(d.device)
    ctx.log(f"{d.task}: teacher {teacher.config.num_hidden_layers}x{teacher.config.hidden_size} -> student "
            f"{init['layers']}x{init['hidden']} ({init['init']})")
    distiller = Distiller(student, teacher, dp.temperature, dp.alpha, dp.hidden_weight, init["layer_map"])

    if d.splits["dev"].examples:
        def dev_eval(m):
            flat, _, _ = _scorer(m.student, d.splits["dev"], d.p, d.labels, d.pad, d.stp, d.bf16)
            return flat.get(d.primary, 0.0), flat
    else:
        def dev_eval(m):
            import time

            return time.monotonic(), {}
    res = train(distiller, d.splits["train"].feats, d.stp, dev_eval, d.pad, seed,
                log_metrics=lambda m, step: ctx.log_metrics({f"student_{k}": v for k, v in m.items()}, step),
                desc=f"distill {d.task}")
    return teacher, distiller.student.eval(), init, res


def _scores(d: _Setup, model) -> dict:
    """A model's dev and test scores, its test details and predictions."""
    dev, _, _ = _scorer(model, d.splits["dev"], d.p, d.labels, d.pad, d.stp, d.bf16)
    test, details, recs = _scorer(model, d.splits["test"], d.p, d.labels, d.pad, d.stp, d.bf16)
    return {"dev": dev, "test": test, "test_details": details, "recs": recs}


def _save(ctx, d: _Setup, student, scored: dict) -> None:
    """``model/`` (the student, its tokenizer and card) and ``predictions_test.jsonl``."""
    from bertpipe.lib import modelcard
    from bertpipe.lib.training.heads import pipeline_task

    student.save_pretrained(ctx.out / "model")
    d.tok.save_pretrained(ctx.out / "model")
    modelcard.write(ctx.out / "model", ctx, pipeline_tag=pipeline_task(d.p.type) or "feature-extraction",
                    base_model=str(ctx.inputs.get("teacher", "")), labels=d.labels,
                    metrics={f"test_{k}": v for k, v in scored["test"].items()},
                    notes="A distilled student of the base model above (its teacher).", task=d.p,
                    max_seq_len=d.stp.max_seq_len)
    with open(ctx.out / "predictions_test.jsonl", "w", encoding="utf-8") as f:
        for r in scored["recs"]:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")


def _compare(d: _Setup, models: dict[str, tuple[Any, Path]], results: dict, bench_batches: int
             ) -> tuple[list[dict], dict]:
    """(a row per model: shape, size, scores, speed over the same test batches; the student/teacher ratios)."""
    from bertpipe.lib.inference.speed import dir_size, n_params

    bench_feats = d.splits["test"].feats or d.splits["train"].feats
    speed = _throughput({name: m for name, (m, _) in models.items()}, bench_feats, d.pad, d.stp.eval_batch_size,
                        bench_batches)
    rows = [{"name": name, "layers": m.config.num_hidden_layers, "hidden": m.config.hidden_size,
             "params": n_params(m), "size_bytes": dir_size(mdir), "dev": results[name]["dev"],
             "test": results[name]["test"], "speed": speed[name]} for name, (m, mdir) in models.items()]
    t_val, s_val = rows[0]["test"].get(d.primary, 0.0), rows[1]["test"].get(d.primary, 0.0)
    comparison = {"speedup": speed["student"]["examples_per_s"] / max(speed["teacher"]["examples_per_s"], 1e-9),
                  "quality_ratio": s_val / t_val if t_val > 0 else float("nan"),
                  "param_ratio": rows[1]["params"] / rows[0]["params"],
                  "size_ratio": rows[1]["size_bytes"] / max(rows[0]["size_bytes"], 1)}
    return rows, comparison


def _metrics(d: _Setup, dp, init: dict, res, s: dict, rows: list[dict], comparison: dict) -> dict:
    """metrics.json in the finetune schema (one seed, the student's), with the teacher, the student and their
    comparison."""
    from bertpipe.lib.training.heads import pipeline_task

    seed = d.stp.seeds[0]
    return {
        "task": d.task, "type": d.p.type, "encoder": "student", "primary": d.primary,
        "pipeline_task": pipeline_task(d.p.type), "labels": d.labels, "seeds": [seed],
        "teacher_dir": str(d.teacher_dir), "student_init": init, "distill": dp.model_dump(),
        "per_seed": {str(seed): {"dev": s["dev"], "test": s["test"], "test_details": s["test_details"],
                                 "best_step": res.best_step, "steps": res.steps, "saved": True,
                                 "train_seconds": round(res.seconds, 2)}},
        "summary": {sp: {k: {"mean": v, "std": 0.0, "values": [v]} for k, v in s[sp].items()}
                    for sp in ("dev", "test")},
        "teacher": rows[0], "student": rows[1], "comparison": comparison, "counts": dict(d.counts),
    }
