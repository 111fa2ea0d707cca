"""Did domain adaptation make a better model? Base vs adapted vs baselines per task, over seeds, with paired intervals.

    OMP_NUM_THREADS=2 python bench/bench_adaptation.py   # profile `evidence` (params.yaml): ~35-60 min on 2 cores
    python bench/bench_adaptation.py --quick             # the demo profile at a few steps: proves the script end to end
    python bench/bench_adaptation.py --seeds 1 2 3 4 5 --project /tmp/evidence --raw data/raw --set KEY=VALUE
    python bench/bench_adaptation.py --params examples/evidence_climate/params.yaml --tasks is_climate --raw data/raw \
        --project /tmp/evidence-climate              # another domain, its own profiles (docs/evidence.md)

Runs every stage alone through the CLI in a throwaway project over the real sample data (tasks, prepare, base, vocab,
pretrain on every core, `--threads`; then each task x encoder x seed as its own `bertpipe finetune`, so every seed's
test predictions are kept, `--workers` at once with the cores divided among them), then per task:

- baselines trained on the task's capped train split and scored on the same test examples the finetunes saw, from
  `bertpipe.evaluate.baselines` (what evaluate reports): majority and TF-IDF + logistic regression (classification),
  no entity and the train lexicon (NER);
- base and adapted: the primary test metric per seed (mean, std);
- adapted − base and adapted − TF-IDF/lexicon: `bertpipe.evaluate.bootstrap.paired_bootstrap` over test examples, the
  statistic being the mean over seeds of the per-seed metric (every seed's predictions resampled on the same draw), so
  the interval covers the test set's chance; the seeds' spread is in the ± columns;
- the encoder comparison per masked character (`bertpipe.evaluate.fair_mlm.compare_encoders`, as evaluate) of the
  base and adapted encoders on the domain test split, and register's gate score (`encoder_gate_score`) for each.

A rerun with the same --project resumes: fresh stages are skipped, kept finetune predictions are read back.
Writes bench/out/adaptation_<profile>.json and .md and prints the table; docs/evidence.md explains how to read it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from sweep_demo import run_cli, setup_project  # noqa: E402  (one way to run a stage alone and time it)

from bertpipe.evaluate import baselines as BL  # noqa: E402
from bertpipe.evaluate import bootstrap as B  # noqa: E402

OUT = REPO / "bench" / "out"
QUICK_SETS = {  # --quick: the demo profile shrunk until the whole chain takes a few minutes under load
    "base.max_steps": 30, "pretrain.max_steps": 30, "vocab.head_fit_steps": 10, "vocab.eval_texts": 8,
    "finetune.train.max_train_examples": 400, "finetune.train.max_eval_examples": 150, "finetune.train.epochs": 1,
    # per task too: a profile's per-task override (law_department 12,000, NER 6,000) would win over the shared cap
    **{f"finetune.tasks.{t}.train_overrides.max_train_examples": 400
       for t in ("law_department", "sentiment", "msra_ner")},
}


# ---------------------------------------------------------------- metrics and baselines (the shared modules)


def macro_f1(gold, pred) -> float:
    return B.macro_f1(gold, pred)


def baseline_predictions(train, test) -> dict[str, list]:
    """Per-example predictions of the baselines evaluate reports: majority + TF-IDF (classification), or no entity +
    the train lexicon (NER), trained on the task's capped train split."""
    if train and getattr(train[0], "label", None) is None:  # NER: spans, no label
        lex = BL.Lexicon.from_train(train)
        return {"majority": [[] for _ in test], "lexicon": [lex.match(ex.text) for ex in test]}
    return {"majority": BL.majority_predictions(train, test), "tfidf": BL.tfidf_predictions(train, test)}


class Stacked:
    """Per-seed predictions stacked into one 'prediction' per example, so a single paired bootstrap over examples
    resamples the same examples for every seed and scores the mean over seeds of metric(seed's predictions)."""

    def __init__(self, metric_fn):
        self.metric_fn = metric_fn

    def __call__(self, gold, stacked) -> float:
        seeds = len(stacked[0])
        return statistics.fmean(self.metric_fn(gold, [s[k] for s in stacked]) for k in range(seeds))


def task_splits(project: Path, params_sets: dict, task: str):
    """The capped train and test splits exactly as the `tasks` stage materialises them for finetune."""
    from bertpipe.config import load_config
    from bertpipe.taskdata.stage import materialise

    cfg = load_config(str(project / "params.yaml"), None, [f"{k}={v}" for k, v in params_sets.items()])
    fp = cfg.params.finetune
    data, *_ = materialise(task, fp.tasks[task], fp.train, cfg.path, cfg.params.prepare.dedup, cfg.root)
    return data["train"], data["test"]


# ---------------------------------------------------------------- the run

def _read_preds(path: Path) -> dict[str, dict]:
    return {r["id"]: r for r in (json.loads(x) for x in path.read_text(encoding="utf-8").splitlines() if x.strip())}


def run_finetunes(project: Path, sets: dict, tasks: list[str], seeds: list[int], log: Path, times: dict,
                  workers: int, threads: int) -> dict:
    """{(task, encoder, seed): {id: prediction record}}, each seed its own `bertpipe finetune` run (the stage saves
    one seed's predictions). `workers` runs at once, `threads` each; two runs of one task x encoder never overlap
    (they share an output dir). Seed-major order, so a cut-short run still has whole seeds."""
    keep = log.parent / f"predictions_{log.stem}"  # each run's predictions and times, so a rerun resumes
    keep.mkdir(exist_ok=True)
    jobs, preds = [], {}
    for job in ((task, enc, seed) for seed in seeds for task in tasks for enc in ("base", "adapted")):
        saved = keep / "{}.{}.seed{}.jsonl".format(*job)
        if saved.exists() and saved.with_suffix(".time.json").exists():
            preds[job] = _read_preds(saved)
            times["finetune/{}/{}/seed{}".format(*job)] = json.loads(saved.with_suffix(".time.json").read_text())
        else:
            jobs.append(job)
    busy: set = set()
    cond = threading.Condition()
    failed: list = []

    def worker() -> None:
        while True:
            with cond:
                while True:
                    if failed or not jobs:
                        return
                    job = next((j for j in jobs if j[:2] not in busy), None)
                    if job:
                        jobs.remove(job)
                        busy.add(job[:2])
                        break
                    cond.wait()
            task, encoder, seed = job
            wall, cpu, rc = run_cli(project, ["finetune", "--task", task, "--encoder", encoder, "--force"],
                                    {**sets, "finetune.train.seeds": f"[{seed}]", "finetune.train.num_threads": threads},
                                    log, threads)
            out = Path(sets["paths.work"]) / "finetune" / task / encoder
            with cond:
                if rc:
                    failed.append(f"finetune {task}/{encoder} seed {seed} failed (see {log})")
                else:
                    saved = keep / f"{task}.{encoder}.seed{seed}.jsonl"
                    shutil.copyfile(out / "predictions_test.jsonl", saved)
                    preds[job] = _read_preds(saved)
                    t = times[f"finetune/{task}/{encoder}/seed{seed}"] = {"wall_s": round(wall, 1),
                                                                          "cpu_s": round(cpu, 1)}
                    saved.with_suffix(".time.json").write_text(json.dumps(t))
                    print(f"[evidence] {task}/{encoder} seed {seed}: {wall:.0f} s wall, {cpu:.0f} CPU s "
                          f"({time.strftime('%H:%M:%S')}, load {os.getloadavg()[0]:.1f})", file=sys.stderr, flush=True)
                busy.discard(job[:2])
                cond.notify_all()

    pool = [threading.Thread(target=worker) for _ in range(max(1, workers))]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    if failed:
        raise SystemExit(failed[0])
    return preds


def summarise_task(task: str, ttype: str, seeds: list[int], preds: dict, train, test, n_boot: int) -> dict:
    first = preds[(task, "base", seeds[0])]
    ids = sorted(first)
    gold_by_id, _ = B.gold_pred(ttype, list(first.values()))
    gold = [gold_by_id[i] for i in ids]
    fn = B.METRIC_FNS[ttype]
    by_id = {e.id: e for e in test}
    missing = [i for i in ids if i not in by_id]
    if missing:
        raise SystemExit(f"{task}: {len(missing)} test ids of the finetune are not in the test split read here")
    base_lines = baseline_predictions(train, [by_id[i] for i in ids])
    stacked = {}
    for enc in ("base", "adapted"):
        per = [B.gold_pred(ttype, list(preds[(task, enc, s)].values()))[1] for s in seeds]
        stacked[enc] = [[p[i] for p in per] for i in ids]
    per_seed = {enc: [fn(gold, [row[k] for row in stacked[enc]]) for k in range(len(seeds))] for enc in stacked}
    out = {"type": ttype, "primary": "f1" if ttype == "ner" else "macro_f1", "test_examples": len(ids),
           "train_examples": len(train), "seeds": seeds,
           "baselines": {name: fn(gold, p) for name, p in base_lines.items()},
           **{enc: {"mean": statistics.fmean(v), "std": statistics.stdev(v) if len(v) > 1 else 0.0, "values": v}
              for enc, v in per_seed.items()}}
    sfn = Stacked(fn)
    out["adapted_minus_base"] = B.paired_bootstrap(gold, stacked["base"], stacked["adapted"], sfn, n_boot, 0)
    strong = "lexicon" if ttype == "ner" else "tfidf"
    out["strong_baseline"] = strong
    rep = [[p] * len(seeds) for p in base_lines[strong]]
    out["adapted_minus_baseline"] = B.paired_bootstrap(gold, rep, stacked["adapted"], sfn, n_boot, 1)
    return out


def encoder_comparison(project: Path, sets: dict, n_boot: int) -> dict:
    """NLL per masked character of both encoders on the same windows of the domain test split (what evaluate
    reports), with a paired bootstrap interval over windows, and register's gate score for each."""
    from bertpipe.config import load_config
    from bertpipe.evaluate.encoder_gate import encoder_gate_score
    from bertpipe.evaluate.fair_mlm import compare_encoders, test_texts
    from bertpipe.pipeline import adapted_model, base_model, corpus_dir

    cfg = load_config(str(project / "params.yaml"), None, [f"{k}={v}" for k, v in sets.items()])
    e = cfg.params.evaluate
    models = {"base": base_model(cfg), "adapted": adapted_model(cfg)}
    texts = test_texts(corpus_dir(cfg, "domain"), e.mlm_max_texts, e.mlm_seed)
    res = compare_encoders(models, texts, e, n_boot=n_boot, boot_seed=0)
    res["texts"] = len(texts)
    res["gate"] = {enc: dict([encoder_gate_score(d, cfg)]) for enc, d in models.items()}
    return res


def _ci(x: dict | None) -> str:
    return f"{x['mean']:+.3f} [{x['ci95'][0]:+.3f}, {x['ci95'][1]:+.3f}]" if x else "—"


def table(res: dict) -> str:
    lines = [f"profile `{res['profile']}`, seeds {res['seeds']}, {res['when']}, load {res['load']:.1f} at the end", "",
             "| task | metric | test ex | majority | TF-IDF / lexicon | base | adapted | adapted − base (95% CI) | "
             "adapted − TF-IDF / lexicon (95% CI) |", "|---|---|---|---|---|---|---|---|---|"]
    for task, t in res["tasks"].items():
        b = t["baselines"]
        lines.append(f"| {task} | {t['primary']} | {t['test_examples']} | {b['majority']:.3f} | "
                     f"{b[t['strong_baseline']]:.3f} ({t['strong_baseline']}) | "
                     f"{t['base']['mean']:.3f} ± {t['base']['std']:.3f} | "
                     f"{t['adapted']['mean']:.3f} ± {t['adapted']['std']:.3f} | {_ci(t['adapted_minus_base'])} | "
                     f"{_ci(t['adapted_minus_baseline'])} |")
    ec = res.get("encoder_comparison")
    if ec and "delta" in ec:
        d = ec["delta"]
        lines += ["", f"Encoder comparison (domain test split, {ec['texts']} texts, {ec['base']['masked_chars']} "
                      f"masked characters): NLL per masked character base {ec['base']['nll_per_char']:.4f}, adapted "
                      f"{ec['adapted']['nll_per_char']:.4f}, adapted − base {d['nll_per_char']:+.4f} "
                      f"[{d['ci95'][0]:+.4f}, {d['ci95'][1]:+.4f}] (lower is better; {d['ci_method']})"]
    lines += ["", "| stage | wall s | CPU s |", "|---|---|---|"]
    lines += [f"| {k} | {v['wall_s']} | {v['cpu_s']} |" for k, v in res["times"].items()]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--profile", default="evidence")
    ap.add_argument("--quick", action="store_true", help="demo profile at a few steps, 2 seeds: a smoke run")
    ap.add_argument("--seeds", type=int, nargs="+", default=None, help="default: 1 2 3 (--quick: 1 2)")
    ap.add_argument("--tasks", nargs="+", default=["law_department", "sentiment", "msra_ner"])
    ap.add_argument("--set", dest="extra", action="append", default=[], metavar="KEY=VALUE",
                    help="more params overrides for every stage (e.g. a smaller budget)")
    ap.add_argument("--threads", type=int, default=int(os.environ.get("OMP_NUM_THREADS", "1") or 1),
                    help="cores to use: the serial stages get all, each finetune worker threads/workers "
                         "(default: $OMP_NUM_THREADS, else 1)")
    ap.add_argument("--workers", type=int, default=None, help="finetunes at once (default: --threads)")
    ap.add_argument("--bootstrap", type=int, default=1000)
    ap.add_argument("--project", type=Path, default=Path("/tmp/bertpipe-evidence"))
    ap.add_argument("--raw", type=Path, default=REPO / ".bertpipe" / "test-raw")
    ap.add_argument("--params", type=Path, default=None,
                    help="another params file with its own domain and tasks (examples/evidence_climate/params.yaml), "
                         "run with its own profiles (--quick: its `smoke` profile as it is); default: the repo's "
                         "params.yaml and profiles.yaml")
    args = ap.parse_args()
    profile = ("smoke" if args.params else "demo") if args.quick else args.profile
    seeds = args.seeds or ([1, 2] if args.quick else [1, 2, 3])
    workers = args.workers or args.threads
    tag = "quick" if args.quick else profile
    own: dict = {}
    if args.params:  # its paths point at --raw and into the project; outputs named after its folder
        args.project.mkdir(parents=True, exist_ok=True)
        shutil.copy(args.params, args.project / "params.yaml")
        (args.project / "profiles.yaml").unlink(missing_ok=True)
        if (args.params.parent / "profiles.yaml").exists():
            shutil.copy(args.params.parent / "profiles.yaml", args.project / "profiles.yaml")
        tag = f"{args.params.resolve().parent.name}-{tag}"
        own = {"paths.raw": str(args.raw.resolve()), "paths.state": str(args.project / ".bertpipe")}
    else:
        setup_project(args.project, args.raw.resolve())
    sets = {"profile": profile, **own, "paths.work": str(args.project / f"work_{tag}"),
            **(QUICK_SETS if args.quick and not args.params else {}), **dict(kv.split("=", 1) for kv in args.extra)}
    log = args.project / f"{tag}.log"
    # A rerun resumes: stages still fresh are skipped by bertpipe (their first build's times kept here), finetunes
    # whose predictions were kept are read back.
    times_file = args.project / f"{tag}.stage_times.json"
    built = json.loads(times_file.read_text()) if times_file.exists() else {}
    times: dict = {}
    t_start = time.perf_counter()
    # tasks first: prepare leaves the tasks' dev/test texts out of the pretraining corpora and reads work/tasks
    for stage in ("tasks", "prepare", "base", "start", "vocab", "pretrain"):
        manifest = Path(sets["paths.work"]) / stage / "manifest.json"
        before = manifest.read_text() if manifest.exists() else None
        wall, cpu, rc = run_cli(args.project, [stage], sets, log, args.threads)
        if rc:
            raise SystemExit(f"bertpipe {stage} failed (see {log})")
        cached = before is not None and manifest.read_text() == before
        times[stage] = built[stage] if cached and stage in built else {"wall_s": round(wall, 1), "cpu_s": round(cpu, 1)}
        times_file.write_text(json.dumps(times))
        print(f"[evidence] {stage}: {wall:.0f} s wall, {cpu:.0f} CPU s ({time.strftime('%H:%M:%S')}, "
              f"load {os.getloadavg()[0]:.1f})", file=sys.stderr, flush=True)
    ft_threads = max(1, args.threads // workers)
    preds = run_finetunes(args.project, sets, args.tasks, seeds, log, times, workers, ft_threads)
    from bertpipe.config import load_config

    cfg = load_config(str(args.project / "params.yaml"), None, [f"{k}={v}" for k, v in sets.items()])
    res = {"profile": tag, "seeds": seeds, "sets": sets, "threads": args.threads, "workers": workers,
           "tasks": {}, "times": times}
    for task in args.tasks:
        train, test = task_splits(args.project, sets, task)
        res["tasks"][task] = summarise_task(task, cfg.params.finetune.tasks[task].type, seeds, preds, train, test,
                                            args.bootstrap)
    t0, c0 = time.perf_counter(), time.process_time()
    res["encoder_comparison"] = encoder_comparison(args.project, sets, args.bootstrap)
    times["encoder comparison"] = {"wall_s": round(time.perf_counter() - t0, 1),
                                   "cpu_s": round(time.process_time() - c0, 1)}
    times["total"] = {"wall_s": round(time.perf_counter() - t_start, 1),
                      "cpu_s": round(sum(v["cpu_s"] for v in times.values()), 1)}
    res["when"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    res["load"] = os.getloadavg()[0]
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / f"adaptation_{tag}.json").write_text(json.dumps(res, indent=1, ensure_ascii=False, default=list))
    text = table(res)
    (OUT / f"adaptation_{tag}.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
