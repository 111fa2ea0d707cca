"""Did domain adaptation make a better model? Base vs adapted vs baselines per task, over seeds, with paired intervals.

    OMP_NUM_THREADS=2 python bench/bench_adaptation.py   # profile `evidence` (params.yaml): ~35-60 min on 2 cores
    python bench/bench_adaptation.py --quick             # the demo profile at a few steps: proves the script end to end
    python bench/bench_adaptation.py --seeds 1 2 3 4 5 --project /tmp/evidence --raw data/raw --set KEY=VALUE
    python bench/bench_adaptation.py --params examples/evidence_climate/params.yaml --tasks is_climate --raw data/raw \
        --project /tmp/evidence-climate              # another domain, its own profiles (docs/evidence.md)

Runs every stage alone through the CLI in a throwaway project over the real sample data (splits, prepare, base, vocab,
pretrain on every core, `--threads`; tapt/<task> when `finetune.encoders` names tapt; then each task x encoder as its
own `bertpipe finetune`, as the pipeline runs it: its search chooses the hyperparameters on dev, every seed trains
with them and keeps its test predictions; `--workers` at once with the cores divided among them), then per task:

- baselines trained on the task's capped train split and scored on the same test examples the finetunes saw, from
  `bertpipe.lib.measures.baselines` (what evaluate reports): majority and TF-IDF + logistic regression (classification),
  no entity and the train lexicon (NER);
- every encoder (base, adapted, tapt): the primary test metric per seed (mean, std), and whether the finetune found
  every run degenerate on dev (then no difference is computed with it);
- each encoder − base and the best encoder − TF-IDF/lexicon: `bertpipe.lib.measures.bootstrap.paired_bootstrap` over
  test examples, the statistic being the mean over seeds of the per-seed metric (every seed's predictions resampled on
  the same draw), so the interval covers the test set's chance; the seeds' spread is in the ± columns, and a
  difference whose seeds disagree in sign says so;
- the encoder comparison per masked character (`bertpipe.lib.measures.fair_mlm.compare_encoders`, as evaluate) of the
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

from common import run_cli, setup_project  # noqa: E402  (one way to run a stage alone and time it)

from bertpipe.lib.measures import baselines as BL  # noqa: E402
from bertpipe.lib.measures import bootstrap as B  # noqa: E402

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
    """The capped train and test splits exactly as the `splits` stage materialises them for finetune."""
    from bertpipe.graph.pipeline import load_config
    from bertpipe.stages.splits.stage import materialise

    cfg = load_config(str(project / "params.yaml"), None, [f"{k}={v}" for k, v in params_sets.items()])
    fp = cfg.params.finetune
    data, *_ = materialise(task, fp.tasks[task], fp.train, cfg.path, cfg.params.prepare.dedup, cfg.root)
    return data["train"], data["test"]


# ---------------------------------------------------------------- the run

def _read_preds(path: Path) -> dict[str, dict]:
    return {r["id"]: r for r in (json.loads(x) for x in path.read_text(encoding="utf-8").splitlines() if x.strip())}


def run_finetunes(project: Path, sets: dict, tasks: list[str], encoders: list[str], seeds: list[int], log: Path,
                  times: dict, workers: int, threads: int) -> dict:
    """{(task, encoder, seed): {id: prediction record}}: one `bertpipe finetune` per task x encoder, as the pipeline
    runs it (its search chooses the hyperparameters on dev on the first seed, then every seed trains with them; a
    degenerate seed is retrained), every seed's test predictions read from its ``predictions/seed<N>.jsonl``.
    `workers` run at once, `threads` each; a fresh finetune (a rerun) is read back, not run again."""
    jobs = [(task, enc) for task in tasks for enc in encoders]
    preds: dict = {}
    lock = threading.Lock()
    failed: list = []
    built = times.setdefault("_built", {})

    def worker() -> None:
        while True:
            with lock:
                if failed or not jobs:
                    return
                task, encoder = jobs.pop(0)
            wall, cpu, rc = run_cli(project, ["finetune", "--task", task, "--encoder", encoder],
                                    {**sets, "finetune.train.seeds": "[" + ",".join(map(str, seeds)) + "]",
                                     "finetune.train.num_threads": threads}, log, threads)
            out = Path(sets["paths.work"]) / "finetune" / task / encoder
            with lock:
                if rc:
                    failed.append(f"finetune {task}/{encoder} failed (see {log})")
                    continue
                for seed in seeds:
                    preds[(task, encoder, seed)] = _read_preds(out / "predictions" / f"seed{seed}.jsonl")
                key = f"finetune/{task}/{encoder}"
                fp = json.loads((out / "manifest.json").read_text())["fingerprint"]
                if built.get(key, {}).get("fingerprint") != fp:  # built now, not found fresh
                    built[key] = {"fingerprint": fp, "wall_s": round(wall, 1), "cpu_s": round(cpu, 1)}
                times[key] = {k: built[key][k] for k in ("wall_s", "cpu_s")}
                print(f"[evidence] {task}/{encoder}: {wall:.0f} s wall, {cpu:.0f} CPU s "
                      f"({time.strftime('%H:%M:%S')}, load {os.getloadavg()[0]:.1f})", file=sys.stderr, flush=True)

    pool = [threading.Thread(target=worker) for _ in range(max(1, workers))]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    if failed:
        raise SystemExit(failed[0])
    return preds


def summarise_task(task: str, ttype: str, encoders: list[str], seeds: list[int], preds: dict, train, test,
                   n_boot: int, finetunes: dict) -> dict:
    first = preds[(task, encoders[0], seeds[0])]
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
    for enc in encoders:
        per = [B.gold_pred(ttype, list(preds[(task, enc, s)].values()))[1] for s in seeds]
        stacked[enc] = [[p[i] for p in per] for i in ids]
    per_seed = {enc: [fn(gold, [row[k] for row in stacked[enc]]) for k in range(len(seeds))] for enc in stacked}
    out = {"type": ttype, "primary": "f1" if ttype == "ner" else "macro_f1", "test_examples": len(ids),
           "train_examples": len(train), "seeds": seeds, "encoders": encoders,
           "baselines": {name: fn(gold, p) for name, p in base_lines.items()},
           **{enc: {"mean": statistics.fmean(v), "std": statistics.stdev(v) if len(v) > 1 else 0.0, "values": v}
              for enc, v in per_seed.items()},
           # what the finetune stage found: runs degenerate on dev (never a result) and the configuration it chose
           "degenerate": {enc: m.get("degenerate_reason") for enc, m in finetunes.items() if m.get("degenerate")},
           "chosen": {enc: (m.get("search") or {}).get("chosen") for enc, m in finetunes.items()}}
    sfn = Stacked(fn)
    strong = "lexicon" if ttype == "ner" else "tfidf"
    out["strong_baseline"] = strong
    rep = [[p] * len(seeds) for p in base_lines[strong]]
    for enc in encoders[1:]:
        if {"base", enc} & set(out["degenerate"]):
            continue  # a comparison with a model that learned nothing says nothing
        d = B.paired_bootstrap(gold, stacked["base"], stacked[enc], sfn, n_boot, 0)
        deltas = [a - b for a, b in zip(per_seed[enc], per_seed["base"])]
        d["seeds_agree"] = all(x > 0 for x in deltas) or all(x < 0 for x in deltas)
        out[f"{enc}_minus_base"] = d
    best = max((e for e in encoders if e not in out["degenerate"]), key=lambda e: out[e]["mean"], default=None)
    if best:
        out["best"] = best
        out["best_minus_baseline"] = B.paired_bootstrap(gold, rep, stacked[best], sfn, n_boot, 1)
    return out


def encoder_comparison(project: Path, sets: dict, n_boot: int) -> dict:
    """NLL per masked character of both encoders on the same windows of the domain test split (what evaluate
    reports), with a paired bootstrap interval over windows, and register's gate score for each."""
    from bertpipe.graph.pipeline import load_config
    from bertpipe.lib.layout import adapted_model, base_model, corpus_dir
    from bertpipe.lib.measures.encoder_gate import encoder_gate_score
    from bertpipe.lib.measures.fair_mlm import compare_encoders
    from bertpipe.lib.measures.windows import test_texts

    cfg = load_config(str(project / "params.yaml"), None, [f"{k}={v}" for k, v in sets.items()])
    e = cfg.params.evaluate
    models = {"base": base_model(cfg), "adapted": adapted_model(cfg)}
    texts = test_texts(corpus_dir(cfg, "domain"), e.mlm_max_texts, e.mlm_seed)
    res = compare_encoders(models, texts, e, n_boot=n_boot, boot_seed=0)
    res["texts"] = len(texts)
    res["gate"] = {enc: dict([encoder_gate_score(d, cfg)]) for enc, d in models.items()}
    return res


def _ci(x: dict | None) -> str:
    if not x:
        return "—"
    s = f"{x['mean']:+.3f} [{x['ci95'][0]:+.3f}, {x['ci95'][1]:+.3f}]"
    return s + ("" if x.get("seeds_agree", True) else " (seeds disagree)")


def table(res: dict) -> str:
    encoders = next(iter(res["tasks"].values()))["encoders"] if res["tasks"] else ["base", "adapted"]
    others = encoders[1:]
    lines = [f"profile `{res['profile']}`, seeds {res['seeds']}, {res['when']}, load {res['load']:.1f} at the end, "
             f"precision {res.get('precision', '?')}", "",
             "| task | metric | test ex | majority | TF-IDF / lexicon | " + " | ".join(encoders) + " | "
             + " | ".join(f"{e} − base (95% CI)" for e in others) + " | best − TF-IDF / lexicon (95% CI) |",
             "|---|---|---|---|---|" + "---|" * (len(encoders) + len(others) + 1)]
    for task, t in res["tasks"].items():
        b = t["baselines"]
        cells = [("degenerate " if e in t["degenerate"] else "") + f"{t[e]['mean']:.3f} ± {t[e]['std']:.3f}"
                 for e in encoders]
        lines.append(f"| {task} | {t['primary']} | {t['test_examples']} | {b['majority']:.3f} | "
                     f"{b[t['strong_baseline']]:.3f} ({t['strong_baseline']}) | " + " | ".join(cells) + " | "
                     + " | ".join(_ci(t.get(f"{e}_minus_base")) for e in others)
                     + f" | {t.get('best', '—')}: {_ci(t.get('best_minus_baseline'))} |")
    lines += ["", "Hyperparameters chosen on dev: " + "; ".join(
        f"{task}/{e} {c}" for task, t in res["tasks"].items() for e, c in t["chosen"].items() if c)]
    ec = res.get("encoder_comparison")
    if ec and "delta" in ec:
        d = ec["delta"]
        lines += ["", f"Encoder comparison (domain test split, {ec['texts']} texts, {ec['base']['masked_chars']} "
                      f"masked characters): NLL per masked character base {ec['base']['nll_per_char']:.4f}, adapted "
                      f"{ec['adapted']['nll_per_char']:.4f}, adapted − base {d['nll_per_char']:+.4f} "
                      f"[{d['ci95'][0]:+.4f}, {d['ci95'][1]:+.4f}] (lower is better; {d['ci_method']})"]
    lines += ["", "| stage | wall s | CPU s |", "|---|---|---|"]
    lines += [f"| {k} | {v['wall_s']} | {v['cpu_s']} |" for k, v in res["times"].items() if not k.startswith("_")]
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
    # splits first: prepare leaves the tasks' dev/test texts out of the pretraining corpora and reads work/splits
    from bertpipe.graph.pipeline import load_config

    cfg = load_config(str(args.project / "params.yaml"), None, [f"{k}={v}" for k, v in sets.items()])
    encoders = list(cfg.params.finetune.encoders)
    if encoders[0] != "base":
        raise SystemExit(f"finetune.encoders {encoders}: the evidence compares every encoder with base, listed first")
    stages = [[s] for s in ("splits", "prepare", "base", "start", "vocab", "pretrain")]
    stages += [["tapt", "--task", t] for t in args.tasks] if "tapt" in encoders else []
    for cmd in stages:
        stage = "/".join(c for c in cmd if not c.startswith("--"))
        manifest = Path(sets["paths.work"]) / stage / "manifest.json"
        before = manifest.read_text() if manifest.exists() else None
        wall, cpu, rc = run_cli(args.project, cmd, sets, log, args.threads)
        if rc:
            raise SystemExit(f"bertpipe {stage} failed (see {log})")
        cached = before is not None and manifest.read_text() == before
        times[stage] = built[stage] if cached and stage in built else {"wall_s": round(wall, 1), "cpu_s": round(cpu, 1)}
        times_file.write_text(json.dumps(times))
        print(f"[evidence] {stage}: {wall:.0f} s wall, {cpu:.0f} CPU s ({time.strftime('%H:%M:%S')}, "
              f"load {os.getloadavg()[0]:.1f})", file=sys.stderr, flush=True)
    ft_threads = max(1, args.threads // workers)
    times["_built"] = built.get("_built", {})
    preds = run_finetunes(args.project, sets, args.tasks, encoders, seeds, log, times, workers, ft_threads)
    times_file.write_text(json.dumps(times))
    res = {"profile": tag, "seeds": seeds, "sets": sets, "threads": args.threads, "workers": workers,
           "tasks": {}, "times": times}
    for task in args.tasks:
        train, test = task_splits(args.project, sets, task)
        finetunes = {e: json.loads((Path(sets["paths.work"]) / "finetune" / task / e / "metrics.json").read_text())
                     for e in encoders}
        res["precision"] = next(iter(finetunes.values()))["per_seed"][str(seeds[0])].get("bf16") and "bf16" or "fp32"
        res["tasks"][task] = summarise_task(task, cfg.params.finetune.tasks[task].type, encoders, seeds, preds,
                                            train, test, args.bootstrap, finetunes)
    t0, c0 = time.perf_counter(), time.process_time()
    res["encoder_comparison"] = encoder_comparison(args.project, sets, args.bootstrap)
    times["encoder comparison"] = {"wall_s": round(time.perf_counter() - t0, 1),
                                   "cpu_s": round(time.process_time() - c0, 1)}
    times["total"] = {"wall_s": round(time.perf_counter() - t_start, 1),
                      "cpu_s": round(sum(v["cpu_s"] for k, v in times.items() if not k.startswith("_")), 1)}
    res["when"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    res["load"] = os.getloadavg()[0]
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / f"adaptation_{tag}.json").write_text(json.dumps(res, indent=1, ensure_ascii=False, default=list))
    text = table(res)
    (OUT / f"adaptation_{tag}.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
