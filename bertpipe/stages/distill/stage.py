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
from pathlib import Path

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


def build(ctx, task: str) -> dict:
    from transformers import AutoTokenizer

    from bertpipe.core.stage import write_json
    from bertpipe.infra.cores import use_training_threads
    from bertpipe.infra.device import pick_device, precision_for
    from bertpipe.lib.inference.speed import dir_size, n_params
    from bertpipe.lib.labelled import model_labels, task_examples, task_settings
    from bertpipe.lib.measures.metrics import PRIMARY
    from bertpipe.lib.training.features import featurize
    from bertpipe.lib.training.heads import auto_class, pipeline_task
    from bertpipe.lib.training.loop import train
    from bertpipe.lib.training.params import with_overrides
    from bertpipe.stages.distill.loss import Distiller
    from bertpipe.stages.distill.student import make_student

    dp = ctx.params
    p, tp = task_settings(ctx.cfg, task, Path(ctx.inputs["teacher"]) / "model", ctx.log)
    stp = with_overrides(tp, dp.train_overrides)
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
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    prec = precision_for(stp.precision, device)
    bf16 = prec.bf16  # scoring runs in bf16 where training does; fp16 training scores in fp32
    ctx.counts.update(prec.record())
    ctx.log(f"{ctx.name}: precision {prec.words()}")
    primary = PRIMARY[p.type]
    seed = stp.seeds[0]

    teacher = auto_class(p.type).from_pretrained(str(teacher_dir)).to(device).eval()
    student, init = make_student(teacher, dp, seed)
    student.to(device)
    ctx.log(f"{task}: teacher {teacher.config.num_hidden_layers}x{teacher.config.hidden_size} -> student "
            f"{init['layers']}x{init['hidden']} ({init['init']})")
    distiller = Distiller(student, teacher, dp.temperature, dp.alpha, dp.hidden_weight, init["layer_map"])

    if data["dev"]:
        def dev_eval(m):
            flat, _, _ = _scorer(m.student, splits["dev"], p, labels, pad, stp, bf16)
            return flat.get(primary, 0.0), flat
    else:
        def dev_eval(m):
            import time

            return time.monotonic(), {}
    res = train(distiller, splits["train"].feats, stp, dev_eval, pad, seed,
                log_metrics=lambda m, step: ctx.log_metrics({f"student_{k}": v for k, v in m.items()}, step),
                desc=f"distill {task}")
    student = distiller.student.eval()
    results = {}
    for name, model in (("teacher", teacher), ("student", student)):
        dev, _, _ = _scorer(model, splits["dev"], p, labels, pad, stp, bf16)
        test, details, recs = _scorer(model, splits["test"], p, labels, pad, stp, bf16)
        results[name] = {"dev": dev, "test": test, "test_details": details, "recs": recs}
    student.save_pretrained(ctx.out / "model")
    tok.save_pretrained(ctx.out / "model")
    from bertpipe.lib import modelcard

    modelcard.write(ctx.out / "model", ctx, pipeline_tag=pipeline_task(p.type) or "feature-extraction",
                    base_model=str(ctx.inputs.get("teacher", "")), labels=labels,
                    metrics={f"test_{k}": v for k, v in results["student"]["test"].items()},
                    notes="A distilled student of the base model above (its teacher).", task=p,
                    max_seq_len=stp.max_seq_len)
    with open(ctx.out / "predictions_test.jsonl", "w", encoding="utf-8") as f:
        for r in results["student"]["recs"]:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    bench_feats = splits["test"].feats or splits["train"].feats
    speed = _throughput({"teacher": teacher, "student": student}, bench_feats, pad, stp.eval_batch_size,
                        dp.bench_batches)
    rows = []
    for name, model, mdir in (("teacher", teacher, teacher_dir), ("student", student, ctx.out / "model")):
        rows.append({"name": name, "layers": model.config.num_hidden_layers, "hidden": model.config.hidden_size,
                     "params": n_params(model), "size_bytes": dir_size(mdir), "dev": results[name]["dev"],
                     "test": results[name]["test"], "speed": speed[name]})
    t_val, s_val = rows[0]["test"].get(primary, 0.0), rows[1]["test"].get(primary, 0.0)
    speed_ratio = speed["student"]["examples_per_s"] / max(speed["teacher"]["examples_per_s"], 1e-9)
    quality_ratio = s_val / t_val if t_val > 0 else float("nan")
    comparison = {"speedup": speed_ratio, "quality_ratio": quality_ratio,
                  "param_ratio": rows[1]["params"] / rows[0]["params"],
                  "size_ratio": rows[1]["size_bytes"] / max(rows[0]["size_bytes"], 1)}
    s = results["student"]
    out = {
        "task": task, "type": p.type, "encoder": "student", "primary": primary, "pipeline_task": pipeline_task(p.type),
        "labels": labels, "seeds": [seed], "teacher_dir": str(teacher_dir), "student_init": init,
        "distill": dp.model_dump(),
        "per_seed": {str(seed): {"dev": s["dev"], "test": s["test"], "test_details": s["test_details"],
                                 "best_step": res.best_step, "steps": res.steps, "saved": True,
                                 "train_seconds": round(res.seconds, 2)}},
        "summary": {sp: {k: {"mean": v, "std": 0.0, "values": [v]} for k, v in s[sp].items()}
                    for sp in ("dev", "test")},
        "teacher": rows[0], "student": rows[1], "comparison": comparison, "counts": dict(counts),
    }
    write_json(ctx.out / "metrics.json", out)
    (ctx.out / "report.md").write_text(report_md(task, primary, rows, speed_ratio, quality_ratio), encoding="utf-8")
    for name in ("metrics.json", "report.md", "predictions_test.jsonl"):
        ctx.log_artifact(ctx.out / name)
    ctx.log(f"{task}: teacher {primary} {t_val:.4f}, student {s_val:.4f}; student {speed_ratio:.2f}x examples/s, "
            f"{comparison['param_ratio']:.0%} of the parameters")
    flat = {f"test_{primary}": s_val, f"teacher_test_{primary}": t_val, "speedup": speed_ratio,
            "quality_ratio": quality_ratio, "param_ratio": comparison["param_ratio"]}
    ctx.log_metrics(flat)
    ctx.counts.update({k: int(v) for k, v in counts.items()})
    return flat
