"""Did domain adaptation make a better model? Base vs adapted vs baselines per task, over seeds, with paired intervals.

    python bench/bench_adaptation.py                  # profile `evidence` (params.yaml): about an hour on 2 cores
    python bench/bench_adaptation.py --quick          # the demo profile at a few steps: proves the script end to end
    python bench/bench_adaptation.py --seeds 1 2 3 4 5 --project /tmp/evidence --raw data/raw

Runs every stage alone through the CLI in a throwaway project over the real sample data (prepare, base, vocab,
pretrain, then each task x encoder x seed as its own `bertpipe finetune`, so every seed's test predictions are kept),
then per task:

- baselines on the same capped train split, scored on the same test examples the finetunes saw: majority class and
  char n-gram TF-IDF + logistic regression (classification); for NER the majority (all-O) predictor scores 0;
- base and adapted: the primary test metric per seed (mean, std);
- adapted − base and adapted − TF-IDF: paired bootstrap over test examples, the statistic being the mean over seeds of
  the per-seed difference (so the interval covers both example and seed variation), 95% percentile interval;
- the encoder comparison per character (`bertpipe.evaluate.fair_mlm`) of the base and adapted encoders.

Writes bench/out/adaptation_<profile>.json and .md and prints the table; docs/evidence.md explains how to read it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

from sweep_demo import run_cli, setup_project  # noqa: E402  (one way to run a stage alone and time it)

OUT = REPO / "bench" / "out"
QUICK_SETS = {  # --quick: the demo profile shrunk until the whole chain takes a few minutes under load
    "base.max_steps": 30, "pretrain.max_steps": 30, "vocab.head_fit_steps": 10, "vocab.eval_texts": 8,
    "finetune.train.max_train_examples": 400, "finetune.train.max_eval_examples": 150, "finetune.train.epochs": 1,
    # per task too: a profile's per-task override (law_department 12,000, NER 6,000) would win over the shared cap
    **{f"finetune.tasks.{t}.train_overrides.max_train_examples": 400
       for t in ("law_department", "sentiment", "msra_ner")},
}


# ---------------------------------------------------------------- statistics (h2's module when present)

def _paired_bootstrap_local(gold, pred_a, pred_b, metric_fn, n: int, seed: int) -> dict:
    """LOCAL FALLBACK until bertpipe.evaluate.bootstrap lands: percentile interval of metric(b) − metric(a)."""
    import numpy as np

    rng = np.random.default_rng(seed)
    m = len(gold)
    diffs = []
    for _ in range(n):
        idx = rng.integers(0, m, m)
        g = [gold[i] for i in idx]
        diffs.append(metric_fn(g, [pred_b[i] for i in idx]) - metric_fn(g, [pred_a[i] for i in idx]))
    lo, hi = np.percentile(diffs, [2.5, 97.5])
    return {"delta": metric_fn(gold, pred_b) - metric_fn(gold, pred_a), "ci95": [float(lo), float(hi)],
            "ci_method": f"paired bootstrap over {m} test examples, {n} resamples (local fallback)"}


try:  # h2's shared implementation; the fallback above goes when it has landed
    from bertpipe.evaluate.bootstrap import paired_bootstrap  # type: ignore
except ImportError:  # pragma: no cover
    paired_bootstrap = _paired_bootstrap_local


def macro_f1(gold, pred) -> float:
    from bertpipe.evaluate.metrics import classification_metrics

    return classification_metrics(list(gold), list(pred), sorted(set(gold) | set(pred)))[0]["macro_f1"]


def span_f1(gold, pred) -> float:
    """Entity F1 over exact (start, end, type) spans; gold/pred items are sets of spans per sentence."""
    tp = sum(len(g & p) for g, p in zip(gold, pred))
    ng, np_ = sum(len(g) for g in gold), sum(len(p) for p in pred)
    return 2 * tp / (ng + np_) if ng + np_ else 0.0


class Stacked:
    """Per-seed predictions stacked into one 'prediction' per example, so a single paired bootstrap over examples
    resamples the same examples for every seed and scores the mean over seeds of metric(seed's predictions)."""

    def __init__(self, metric_fn):
        self.metric_fn = metric_fn

    def __call__(self, gold, stacked) -> float:
        seeds = len(stacked[0])
        return statistics.fmean(self.metric_fn(gold, [s[k] for s in stacked]) for k in range(seeds))


# ---------------------------------------------------------------- baselines (h2's module when present)

def baseline_predictions(train, test) -> dict[str, list[str]]:
    """Majority class and char 1-3-gram TF-IDF + logistic regression, trained on `train`, predicting `test`."""
    try:
        from bertpipe.evaluate import baselines as B  # type: ignore  # h2

        return {"majority": B.majority_predict(train, test), "tfidf": B.tfidf_predict(train, test)}
    except (ImportError, AttributeError):
        pass
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression

    top = Counter(e.label for e in train).most_common(1)[0][0]
    vec = TfidfVectorizer(analyzer="char", ngram_range=(1, 3), min_df=2, sublinear_tf=True, max_features=200_000)
    x = vec.fit_transform([e.text for e in train])
    clf = LogisticRegression(max_iter=1000, C=10.0).fit(x, [e.label for e in train])
    return {"majority": [top] * len(test), "tfidf": list(clf.predict(vec.transform([e.text for e in test])))}


def task_splits(project: Path, params_sets: dict, task: str):
    """The capped train split and the test split exactly as the finetune stage draws them."""
    from bertpipe.config import load_config
    from bertpipe.finetune import data as D

    from bertpipe.taskdata import read_task, task_dir

    cfg = load_config(str(project / "params.yaml"), None, [f"{k}={v}" for k, v in params_sets.items()])
    fp = cfg.params.finetune
    p = fp.tasks[task]
    tp = p.train_params(fp.train)
    tdir = task_dir(cfg, task)  # the `tasks` stage's materialised splits when it has run, else the raw files
    data = read_task(tdir) if (tdir / "splits.json").exists() else D.load_task(p, cfg.path, Counter())
    return D.cap(data["train"], tp.max_train_examples, p.split_seed), D.cap(data["test"], tp.max_eval_examples,
                                                                               p.split_seed)


# ---------------------------------------------------------------- the run

def _read_preds(path: Path) -> dict[str, dict]:
    return {r["id"]: r for r in (json.loads(x) for x in path.read_text(encoding="utf-8").splitlines() if x.strip())}


def run_finetunes(project: Path, sets: dict, tasks: list[str], seeds: list[int], log: Path, times: dict) -> dict:
    """{(task, encoder, seed): {id: prediction record}} with each seed its own finetune run."""
    preds: dict = {}
    for task in tasks:
        for encoder in ("base", "adapted"):
            for seed in seeds:
                wall, cpu, rc = run_cli(project, ["finetune", "--task", task, "--encoder", encoder, "--force"],
                                        {**sets, "finetune.train.seeds": f"[{seed}]"}, log)
                if rc:
                    raise SystemExit(f"finetune {task}/{encoder} seed {seed} failed (see {log})")
                out = Path(sets["paths.work"]) / "finetune" / task / encoder
                preds[(task, encoder, seed)] = _read_preds(out / "predictions_test.jsonl")
                times[f"finetune/{task}/{encoder}/seed{seed}"] = {"wall_s": round(wall, 1), "cpu_s": round(cpu, 1)}
                print(f"[evidence] {task}/{encoder} seed {seed}: {wall:.0f}s", file=sys.stderr, flush=True)
    return preds


def summarise_task(task: str, ttype: str, seeds: list[int], preds: dict, train, test, n_boot: int) -> dict:
    ids = sorted(preds[(task, "base", seeds[0])])
    if ttype == "ner":
        gold = [frozenset((a, b, t) for a, b, t, *_ in preds[(task, "base", seeds[0])][i]["gold"]) for i in ids]
        fn = span_f1
        pick = lambda r: frozenset((a, b, t) for a, b, t, *_ in r["pred"])  # noqa: E731
        base_lines = {"majority": [frozenset()] * len(ids)}  # predicts O everywhere
    else:
        gold = [preds[(task, "base", seeds[0])][i]["label"] for i in ids]
        fn = macro_f1
        pick = lambda r: r["pred"]  # noqa: E731
        by_id = {e.id: e for e in test}
        missing = [i for i in ids if i not in by_id]
        if missing:
            raise SystemExit(f"{task}: {len(missing)} test ids of the finetune are not in the test split read here")
        bl = baseline_predictions(train, [by_id[i] for i in ids])
        base_lines = bl
    stacked = {enc: [[pick(preds[(task, enc, s)][i]) for s in seeds] for i in ids] for enc in ("base", "adapted")}
    per_seed = {enc: [fn(gold, [row[k] for row in stacked[enc]]) for k in range(len(seeds))] for enc in stacked}
    out = {"type": ttype, "primary": "f1" if ttype == "ner" else "macro_f1", "test_examples": len(ids),
           "train_examples": len(train), "seeds": seeds,
           "baselines": {name: fn(gold, p) for name, p in base_lines.items()},
           **{enc: {"mean": statistics.fmean(v), "std": statistics.stdev(v) if len(v) > 1 else 0.0, "values": v}
              for enc, v in per_seed.items()}}
    sfn = Stacked(fn)
    out["adapted_minus_base"] = paired_bootstrap(gold, stacked["base"], stacked["adapted"], sfn, n_boot, 0)
    if "tfidf" in base_lines:
        tf = [[p] * len(seeds) for p in base_lines["tfidf"]]
        out["adapted_minus_tfidf"] = paired_bootstrap(gold, tf, stacked["adapted"], sfn, n_boot, 1)
    return out


def encoder_comparison(project: Path, sets: dict) -> dict:
    from bertpipe.config import load_config
    from bertpipe.evaluate.fair_mlm import encoder_gate_score
    from bertpipe.pipeline import adapted_model, base_model

    cfg = load_config(str(project / "params.yaml"), None, [f"{k}={v}" for k, v in sets.items()])
    res = {}
    for enc, d in (("base", base_model(cfg)), ("adapted", adapted_model(cfg))):
        name, value = encoder_gate_score(d, cfg)
        res[enc] = {name: value}
    res["metric"] = name
    res["delta"] = res["adapted"][name] - res["base"][name]
    return res


def table(res: dict) -> str:
    lines = [f"profile `{res['profile']}`, seeds {res['seeds']}, {res['when']}", "",
             "| task | metric | majority | TF-IDF | base | adapted | adapted − base (95% CI) | adapted − TF-IDF (95% CI) |",
             "|---|---|---|---|---|---|---|---|"]
    for task, t in res["tasks"].items():
        b = t["baselines"]
        d = t["adapted_minus_base"]
        dt = t.get("adapted_minus_tfidf")
        fmt = lambda x: f"{x['delta']:+.3f} [{x['ci95'][0]:+.3f}, {x['ci95'][1]:+.3f}]" if x else "—"  # noqa: E731
        tfidf = f"{b['tfidf']:.3f}" if "tfidf" in b else "—"
        lines.append(f"| {task} | {t['primary']} | {b['majority']:.3f} | {tfidf} | "
                     f"{t['base']['mean']:.3f} ± {t['base']['std']:.3f} | "
                     f"{t['adapted']['mean']:.3f} ± {t['adapted']['std']:.3f} | {fmt(d)} | {fmt(dt)} |")
    ec = res.get("encoder_comparison")
    if ec:
        lines += ["", f"Encoder comparison ({ec['metric']}, higher is better): base {ec['base'][ec['metric']]:.4f}, "
                      f"adapted {ec['adapted'][ec['metric']]:.4f}, delta {ec['delta']:+.4f}"]
    lines += ["", "| stage | wall s | CPU s |", "|---|---|---|"]
    lines += [f"| {k} | {v['wall_s']} | {v['cpu_s']} |" for k, v in res["times"].items()]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--profile", default="evidence")
    ap.add_argument("--quick", action="store_true", help="demo profile at a few steps, 2 seeds: a smoke run")
    ap.add_argument("--seeds", type=int, nargs="+", default=None, help="default: 1 2 3 (--quick: 1 2)")
    ap.add_argument("--tasks", nargs="+", default=["law_department", "sentiment", "msra_ner"])
    ap.add_argument("--bootstrap", type=int, default=1000)
    ap.add_argument("--project", type=Path, default=Path("/tmp/bertpipe-evidence"))
    ap.add_argument("--raw", type=Path, default=REPO / ".bertpipe" / "test-raw")
    args = ap.parse_args()
    profile = "demo" if args.quick else args.profile
    seeds = args.seeds or ([1, 2] if args.quick else [1, 2, 3])
    tag = "quick" if args.quick else profile
    setup_project(args.project, args.raw.resolve())
    sets = {"profile": profile, "paths.work": str(args.project / f"work_{tag}"), "finetune.train.num_threads": 1,
            **(QUICK_SETS if args.quick else {})}
    log = args.project / f"{tag}.log"
    times: dict = {}
    for stage in ("prepare", "base", "vocab", "pretrain"):
        wall, cpu, rc = run_cli(args.project, [stage], sets, log)
        if rc:
            raise SystemExit(f"bertpipe {stage} failed (see {log})")
        times[stage] = {"wall_s": round(wall, 1), "cpu_s": round(cpu, 1)}
        print(f"[evidence] {stage}: {wall:.0f}s", file=sys.stderr, flush=True)
    preds = run_finetunes(args.project, sets, args.tasks, seeds, log, times)
    from bertpipe.config import load_config

    cfg = load_config(str(args.project / "params.yaml"), None, [f"{k}={v}" for k, v in sets.items()])
    res = {"profile": tag, "seeds": seeds, "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
           "load": os.getloadavg()[0], "tasks": {}, "times": times}
    for task in args.tasks:
        ttype = cfg.params.finetune.tasks[task].type
        train, test = task_splits(args.project, sets, task) if ttype != "ner" else ([], [])
        res["tasks"][task] = summarise_task(task, ttype, seeds, preds, train, test, args.bootstrap)
    res["encoder_comparison"] = encoder_comparison(args.project, sets)
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / f"adaptation_{tag}.json").write_text(json.dumps(res, indent=1, ensure_ascii=False, default=list))
    text = table(res)
    (OUT / f"adaptation_{tag}.md").write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
