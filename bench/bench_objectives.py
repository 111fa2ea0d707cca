"""MLM or ELECTRA's RTD for domain pretraining, at equal compute: which gives the better finetuned models?

    nice -n 5 python bench/bench_objectives.py                 # the docs/objectives.md run (~30 min on a loaded box)
    python bench/bench_objectives.py --quick                   # a few steps, 2 seeds: proves the script end to end
    python bench/bench_objectives.py --mlm-steps 600 --rtd-fractions 0.25 1 --seeds 1 2 3 4 5

In a throwaway project over the real sample data (demo profile: the tiny 2-layer, 128-wide encoder bootstrapped from
the general corpus, then the domain vocabulary), one shared start: tasks -> prepare -> base -> vocab (CLI, as
bench/bench_adaptation.py). From it, domain pretraining twice (or more), each in its own copy of the work dir:

- **compute**: the FLOPs of one optimizer step of each objective on the same batch of the domain corpus (torch's
  FlopCounterMode: matmuls and attention, forward + backward; load-independent), so MLM gets ``--mlm-steps`` steps and
  RTD ``round(mlm_steps x flops_mlm / flops_rtd x fraction)`` for each ``--rtd-fractions`` (1: equal compute; 0.25:
  the claim's "a quarter of MLM's compute"). The wall time of a few steps of each (same process, interleaved) and each
  pretrain stage's CPU seconds are reported beside it;
- **downstream**: each encoder finetuned on each task for every seed (the finetune stage, in process, one seed at a
  time so every seed's test predictions are kept), test macro-F1; the TF-IDF baseline
  (``bertpipe.lib.measures.baselines``) on the same train split and test examples; RTD − MLM and MLM − TF-IDF as paired
  bootstrap intervals over test examples (``bertpipe.lib.measures.bootstrap.paired_bootstrap``) of the mean over seeds.

Writes bench/out/objectives_<tag>.json and .md and prints the table (docs/objectives.md reads it).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import json
import multiprocessing
import os
import resource
import shutil
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from common import run_cli, setup_project  # noqa: E402  (one way to run a stage alone and time it)

OUT = REPO / "bench" / "out"
COMMON = ("splits", "prepare", "base", "vocab")
# The finetune recipe: the demo's (lr 3e-4, 3 epochs, batch 32) on 64 tokens and fewer examples, so 2 objectives x
# 2 tasks x 3 seeds fit ~35 min of a shared 2-core machine (docs/demo-budget.md: at 128 tokens sentiment 3,000 ->
# 0.71, law_department 6,000 -> 0.22 on one seed). Test sets capped at 300 examples as in the demo.
FINETUNE = {"finetune.train.max_train_examples": 3000, "finetune.train.max_eval_examples": 300,
            "finetune.train.max_seq_len": 64, "finetune.tasks.law_department.train_overrides.max_train_examples": 4000,
            "finetune.train.num_threads": 1}
QUICK = {"base.max_steps": 20, "vocab.head_fit_steps": 5, "vocab.eval_texts": 8, "finetune.train.epochs": 1,
         "finetune.train.max_train_examples": 300, "finetune.train.max_eval_examples": 100,
         "finetune.tasks.law_department.train_overrides.max_train_examples": 300}
NO_TRACKER = lambda *a: contextlib.nullcontext()  # noqa: E731


def load(project: Path, sets: dict):
    from bertpipe.graph.pipeline import load_config

    return load_config(str(project / "params.yaml"), None, [f"{k}={v}" for k, v in sets.items()])


# ---------------------------------------------------------------- compute per step


def step_costs(cfg, repeats: int = 3) -> dict:
    """FLOPs and wall seconds of one optimizer step of each objective, same batch, same starting encoder."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from bertpipe.lib.mlm import data, model
    from bertpipe.lib.mlm.data import collate
    from bertpipe.lib.mlm.masking import MaskSpec, mask_batch, normal_token_ids, seeded
    from bertpipe.stages.pretrain.declare import pretrain_stage
    from bertpipe.stages.pretrain.stage import objective_model

    torch.set_num_threads(1)
    inputs = pretrain_stage().inputs(cfg)
    mlm, tok, _ = model.load_checkpoint(Path(inputs["model"]), log=lambda *_: None)
    base_p = cfg.params.pretrain
    texts = data.read_texts(Path(inputs["corpus"]), "train")
    ex = data.build_examples(texts, tok, cfg.params.model.language, base_p, base_p.batch_size, base_p.seed)
    b = collate(ex[: base_p.batch_size], tok.pad_token_id)
    ids, labels = mask_batch(b["input_ids"], b["word_ids"], MaskSpec.from_params(base_p), tok.mask_token_id,
                             normal_token_ids(tok), seeded(0, 0))
    out: dict = {"batch": list(ids.shape)}
    models = {}
    for obj in ("mlm", "rtd"):
        p = base_p.model_copy(update={"objective": obj, "pair_objective": "none"})
        models[obj] = objective_model(copy.deepcopy(mlm), p).train()

    def step(obj):
        res = models[obj](ids, b["attention_mask"], b["token_type_ids"], labels, None)
        loss = res["mlm_loss"] + (res["disc_weight"] * res["disc_loss"] if "disc_loss" in res else 0.0)
        loss.backward()

    for obj in models:
        with FlopCounterMode(display=False) as fc:
            step(obj)
        out[obj] = {"flops": int(fc.get_total_flops()),
                    "params": sum(w.numel() for w in models[obj].parameters())}
    wall = {obj: [] for obj in models}
    for _ in range(repeats):  # interleaved, so a load change hits both alike
        for obj in models:
            t0 = time.perf_counter()
            step(obj)
            wall[obj].append(time.perf_counter() - t0)
    for obj in models:
        out[obj]["wall_s_median"] = statistics.median(wall[obj])
    out["flops_ratio_rtd_over_mlm"] = out["rtd"]["flops"] / out["mlm"]["flops"]
    out["wall_ratio_rtd_over_mlm"] = out["rtd"]["wall_s_median"] / out["mlm"]["wall_s_median"]
    return out


# ---------------------------------------------------------------- encoders and finetunes


def copy_work(src: Path, work: Path, stages) -> None:
    for stage in stages:
        shutil.copytree(src / stage, work / stage, dirs_exist_ok=True, symlinks=True)


def pretrain(project: Path, name: str, sets: dict, log: Path) -> dict:
    """Copy the shared start into work_<name> and pretrain there (CLI: its CPU seconds are the stage's own)."""
    common, work = Path(sets["paths.work"]), project / f"work_{name}"
    copy_work(common, work, COMMON)
    sets = {**sets, "paths.work": str(work)}
    wall, cpu, rc = run_cli(project, ["pretrain"], sets, log)
    if rc:
        raise SystemExit(f"pretrain {name} failed (see {log})")
    m = json.loads((work / "pretrain" / "manifest.json").read_text())["metrics"]
    keep = ("steps", "eval_loss", "initial_eval_loss", "eval_mlm_loss", "eval_disc_loss", "eval_disc_acc", "tokens")
    return {"sets": sets, "wall_s": round(wall, 1), "cpu_s": round(cpu, 1), **{k: m[k] for k in keep if k in m}}


def finetune_seed(project: Path, sets: dict, task: str, seed: int, cache: Path) -> dict[str, dict]:
    """{id: prediction record} of one seed's finetune on the encoder of ``sets`` (cached under ``cache``)."""
    if cache.is_file():
        return json.loads(cache.read_text())
    from bertpipe.core.stage import run_stage
    from bertpipe.stages.finetune.declare import finetune_stage

    # A work dir per (encoder, task, seed): parallel jobs would otherwise wait on one finetune output's lock.
    src = Path(sets["paths.work"])
    work = src.with_name(f"{src.name}_{task}_s{seed}")
    copy_work(src, work, (*COMMON, "pretrain"))
    cfg = load(project, {**sets, "paths.work": str(work), "finetune.train.seeds": f"[{seed}]"})
    res = run_stage(finetune_stage(task, "adapted"), cfg, force=True, tracker_factory=NO_TRACKER)
    rows = [json.loads(x) for x in (res.out / "predictions_test.jsonl").read_text(encoding="utf-8").splitlines() if x]
    preds = {str(r["id"]): r for r in rows}
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.write_text(json.dumps(preds, ensure_ascii=False))
    return preds


class MeanOverSeeds:
    """Per-example tuples of the seeds' predictions -> the mean over seeds of macro-F1, so one paired bootstrap over
    examples resamples the same examples for every seed."""

    def __call__(self, gold, stacked) -> float:
        from bertpipe.lib.measures.bootstrap import macro_f1

        return statistics.fmean(macro_f1(gold, [s[k] for s in stacked]) for k in range(len(stacked[0])))


def summarise(task: str, arms: list[str], seeds: list[int], preds: dict, cfg, n_boot: int) -> dict:
    from bertpipe.lib.labelled import read_task
    from bertpipe.lib.layout import task_dir
    from bertpipe.lib.measures.baselines import tfidf_predictions
    from bertpipe.lib.measures.bootstrap import macro_f1, paired_bootstrap

    splits = read_task(task_dir(cfg, task))
    ids = sorted(preds[(arms[0], seeds[0])])
    by_id = {str(e.id): e for e in splits["test"]}
    gold = [by_id[i].label for i in ids]
    tfidf = tfidf_predictions(splits["train"], [by_id[i] for i in ids])
    stacked = {a: [tuple(preds[(a, s)][i]["pred"] for s in seeds) for i in ids] for a in arms}
    out = {"test_examples": len(ids), "train_examples": len(splits["train"]), "tfidf": macro_f1(gold, tfidf)}
    for a in arms:
        v = [macro_f1(gold, [row[k] for row in stacked[a]]) for k in range(len(seeds))]
        out[a] = {"mean": statistics.fmean(v), "std": statistics.stdev(v) if len(v) > 1 else 0.0, "values": v}
    fn = MeanOverSeeds()
    for a in arms[1:]:
        out[f"{a}_minus_mlm"] = paired_bootstrap(gold, stacked["mlm"], stacked[a], fn, n_boot, 0)
    out["mlm_minus_tfidf"] = paired_bootstrap(gold, [(p,) * len(seeds) for p in tfidf], stacked["mlm"], fn, n_boot, 1)
    return out


def table(res: dict) -> str:
    c = res["costs"]
    lines = [f"{res['when']}; load average {res['load_before']} before, {res['load_after']} after; seeds "
             f"{res['seeds']}; {res['minutes']:.1f} min", "",
             f"Compute per optimizer step (batch {c['batch']}): MLM {c['mlm']['flops'] / 1e9:.2f} GFLOP, RTD "
             f"{c['rtd']['flops'] / 1e9:.2f} GFLOP (x{c['flops_ratio_rtd_over_mlm']:.2f}); wall x"
             f"{c['wall_ratio_rtd_over_mlm']:.2f} (median of {res['repeats']} interleaved steps)", "",
             "| encoder | steps | GFLOP total | pretrain CPU s | held-out gen/MLM loss | disc loss (acc) |",
             "|---|---|---|---|---|---|"]
    for a, e in res["encoders"].items():
        obj = "rtd" if a.startswith("rtd") else "mlm"
        disc = f"{e['eval_disc_loss']:.3f} ({e['eval_disc_acc']:.3f})" if "eval_disc_loss" in e else "—"
        mlm_loss = e.get("eval_mlm_loss", e.get("eval_loss"))
        lines.append(f"| {a} | {e['steps']} | {e['steps'] * c[obj]['flops'] / 1e9:.0f} | {e['cpu_s']} | "
                     f"{mlm_loss:.3f} | {disc} |")
    arms = list(res["encoders"])
    fmt = lambda d: f"{d['mean']:+.3f} [{d['ci95'][0]:+.3f}, {d['ci95'][1]:+.3f}]"  # noqa: E731
    lines += ["", "| task | TF-IDF | " + " | ".join(arms) + " | " + " | ".join(f"{a} − mlm (95% CI)" for a in arms[1:])
              + " | mlm − TF-IDF (95% CI) |", "|---" * (2 * len(arms) + 2) + "|"]
    for task, t in res["tasks"].items():
        cells = [f"{t[a]['mean']:.3f} ± {t[a]['std']:.3f}" for a in arms]
        deltas = [fmt(t[f"{a}_minus_mlm"]) for a in arms[1:]]
        lines.append(f"| {task} (macro-F1, {t['test_examples']} test) | {t['tfidf']:.3f} | " + " | ".join(cells)
                     + " | " + " | ".join(deltas) + f" | {fmt(t['mlm_minus_tfidf'])} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="a few steps, 2 seeds, small finetunes: a smoke run")
    ap.add_argument("--mlm-steps", type=int, default=None, help="MLM's pretraining steps (default 200; --quick 10)")
    ap.add_argument("--rtd-fractions", type=float, nargs="+", default=[1.0],
                    help="RTD budgets as fractions of MLM's FLOPs (1: equal compute; 0.25: the claim)")
    ap.add_argument("--seeds", type=int, nargs="+", default=None, help="default: 1 2 3 (--quick: 1 2)")
    ap.add_argument("--tasks", nargs="+", default=["sentiment", "law_department"])
    ap.add_argument("--bootstrap", type=int, default=1000)
    ap.add_argument("--jobs", type=int, default=1, help="pretraining runs / finetunes at once (own processes)")
    ap.add_argument("--project", type=Path, default=Path("/tmp/bertpipe-objectives"))
    ap.add_argument("--raw", type=Path, default=REPO / ".bertpipe" / "test-raw")
    args = ap.parse_args()
    tag = "quick" if args.quick else "demo"
    seeds = args.seeds or ([1, 2] if args.quick else [1, 2, 3])
    mlm_steps = args.mlm_steps or (10 if args.quick else 200)
    t_start, load_before = time.time(), os.getloadavg()[0]
    setup_project(args.project, args.raw.resolve())
    sets = {"profile": "demo", "paths.work": str(args.project / f"work_{tag}_common"), **FINETUNE,
            **(QUICK if args.quick else {})}
    log = args.project / f"{tag}.log"
    for stage in COMMON:
        wall, cpu, rc = run_cli(args.project, [stage], sets, log)
        if rc:
            raise SystemExit(f"bertpipe {stage} failed (see {log})")
        print(f"[objectives] {stage}: {wall:.0f}s", file=sys.stderr, flush=True)
    costs = step_costs(load(args.project, sets))
    print(f"[objectives] step FLOPs rtd/mlm {costs['flops_ratio_rtd_over_mlm']:.3f}, wall "
          f"{costs['wall_ratio_rtd_over_mlm']:.3f}", file=sys.stderr, flush=True)
    budgets = {"mlm": ("mlm", mlm_steps)}
    for f in args.rtd_fractions:
        name = "rtd" if f == 1.0 else f"rtd@{f:g}"
        budgets[name] = ("rtd", max(1, round(mlm_steps * f / costs["flops_ratio_rtd_over_mlm"])))
    # Pretraining runs, then task by task, seed by seed, every encoder in turn: a run cut short still holds paired
    # results (each seed's predictions are cached, so the same command resumes where it stopped). --jobs N runs N at
    # once (own processes, one thread each): a shared machine's load shares out per process.
    from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor

    def enc_sets(obj, steps):
        return {**sets, "pretrain.objective": obj, "pretrain.max_steps": steps}

    with ThreadPoolExecutor(args.jobs) as pool:
        futs = {name: pool.submit(pretrain, args.project, f"{tag}_{name.replace('@', '_')}", enc_sets(obj, steps), log)
                for name, (obj, steps) in budgets.items()}
        encoders = {name: f.result() for name, f in futs.items()}
    for name, (_, steps) in budgets.items():
        print(f"[objectives] pretrain {name}: {steps} steps, {encoders[name]['wall_s']}s", file=sys.stderr, flush=True)
    jobs = [(task, seed, name, steps) for task in args.tasks for seed in seeds for name, (_, steps) in budgets.items()]
    with ProcessPoolExecutor(args.jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        futs = {(task, name, seed): pool.submit(finetune_seed, args.project, encoders[name]["sets"], task, seed,
                                                args.project / "preds" / tag / name / task / f"seed{seed}_{steps}.json")
                for task, seed, name, steps in jobs}
        preds = {}
        for key, f in futs.items():
            preds[key] = f.result()
            print(f"[objectives] {key[0]}/{key[1]} seed {key[2]} done at {(time.time() - t_start) / 60:.1f} min",
                  file=sys.stderr, flush=True)
    cfg = load(args.project, sets)
    tasks = {t: summarise(t, list(budgets), seeds, {(a, s): preds[(t, a, s)] for a in budgets for s in seeds}, cfg,
                          args.bootstrap) for t in args.tasks}
    for e in encoders.values():
        e.pop("sets")
    res = {"when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime(t_start)), "seeds": seeds, "costs": costs,
           "repeats": 3, "encoders": encoders, "tasks": tasks, "load_before": round(load_before, 1),
           "load_after": round(os.getloadavg()[0], 1), "minutes": (time.time() - t_start) / 60,
           "cpu_s_self": round(resource.getrusage(resource.RUSAGE_SELF).ru_utime, 1),
           "command": " ".join(sys.argv)}
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / f"objectives_{tag}.json").write_text(json.dumps(res, indent=1, ensure_ascii=False))
    md = table(res)
    (OUT / f"objectives_{tag}.md").write_text(md + "\n", encoding="utf-8")
    print(md)


if __name__ == "__main__":
    main()
