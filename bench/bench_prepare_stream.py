"""Peak RSS (whole process tree) and wall time of `bertpipe prepare` on generated corpora, two code trees side by side.

    python bench/bench_prepare_stream.py --mb 50 150 --workers 1 2 [--before /path/to/old/checkout]

Each corpus is unique documents (shuffled sentences of the bundled laws) with planted exact, near and task-leak
copies (tests/gen_prepare.py), as one jsonl source of the domain corpus, general corpus off. Every run is the real
CLI in a fresh project; ``--before`` runs the same command with another checkout first on PYTHONPATH (e.g. main
before streaming). Prints one row per run: code, MB, workers, wall s, peak RSS MB, RSS/corpus, MB/s, kept docs, and
the per-document phase (ingest, cleaning, task exclusion, keys and sketches: what the workers share) in wall and CPU
seconds: the parent's (stats.json) plus the worker processes' (start-up included, polled by bertpipe.infra.proctree).
Then, per corpus, 2 workers against 1: the phase's wall ratio under the machine's load, and the ratio the CPU seconds
allow on 2 free cores (the phase ends when the busier of the parent and the workers does). Say the load beside them.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bertpipe.infra.proctree import TreeMonitor  # noqa: E402
from tests.gen_prepare import generate  # noqa: E402


def run(code: Path, corpus: Path, workers: int, tmp: Path) -> dict:
    proj = Path(tempfile.mkdtemp(dir=tmp))
    params = {
        "paths": {"work": str(proj / "work"), "state": str(proj / "state"), "raw": str(proj)},
        "prepare": {"domain": {"sources": [{"path": str(corpus), "format": "jsonl", "id_field": "id",
                                            "group_field": "group"}]}, "general": {"enabled": False}},
        "finetune": {"tasks": {}},
        "flow": {"prepare_shards": workers},
    }
    (proj / "params.yaml").write_text(yaml.safe_dump(params, allow_unicode=True), encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(code), "MLFLOW_DISABLE_TELEMETRY": "true"}
    t = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "bertpipe", "prepare", "--params", str(proj / "params.yaml")],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    mon = TreeMonitor(proc.pid, every=0.05)
    _, err = proc.communicate()  # reads stderr as it comes (a full pipe would stall the stage)
    wall = time.perf_counter() - t
    mon.stop()
    if proc.returncode:
        raise SystemExit(f"{code}: exit {proc.returncode}\n{err[-2000:]}")
    stats = json.loads((proj / "work" / "prepare" / "stats.json").read_text())
    dom = stats["corpora"]["domain"]
    tm = dom["timings"]
    return {"wall_s": round(wall, 1), "prepare_s": stats["duration_s"], "peak_mb": round(mon.peak / 2**20),
            "mb_in": stats["mb_in"], "kept": dom["kept"], "phase_s": tm["ingest_clean_s"],
            "parent_cpu_s": tm.get("ingest_clean_cpu_s"), "batch_cpu_s": tm.get("batch_cpu_s"),
            "workers_cpu_s": mon.descendants_cpu_s, "tree_cpu_s": mon.cpu_s}


def phase_cpu(r: dict) -> float:
    """CPU seconds of the per-document phase: the parent's, plus the worker processes' (start-up included)."""
    return r["parent_cpu_s"] + (r["workers_cpu_s"] if r["workers"] > 1 else 0.0)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=float, nargs="+", default=[50, 150])
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--before", type=Path, default=None, help="another checkout to run first (e.g. main)")
    args = ap.parse_args()
    print(f"load: {os.getloadavg()}")
    print("| code | MB | workers | wall s | prepare s | per-doc phase s | phase CPU s | CPU s / MB | peak RSS MB | "
          "RSS / corpus | MB/s | kept |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    ratios = []
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        for mb in args.mb:
            corpus = tmp / f"corpus{mb:g}.jsonl"
            generate(corpus, mb)
            for label, code in ([("before", args.before)] if args.before else []) + [("this", ROOT)]:
                runs = {}
                for w in args.workers:
                    runs[w] = r = {**run(code, corpus, w, tmp), "workers": w}
                    cpu = phase_cpu(r) if r["parent_cpu_s"] is not None else float("nan")
                    print(f"| {label} | {r['mb_in']:.0f} | {w} | {r['wall_s']} | {r['prepare_s']} | "
                          f"{r['phase_s']:.1f} | {cpu:.1f} | {cpu / r['mb_in']:.3f} | {r['peak_mb']} | "
                          f"{r['peak_mb'] / r['mb_in']:.1f}x | {r['mb_in'] / r['prepare_s']:.2f} | {r['kept']} |",
                          flush=True)
                if 1 in runs and 2 in runs and runs[1]["parent_cpu_s"] is not None:
                    a, b = runs[1], runs[2]
                    # on 2 free cores the phase ends when the busier of the parent and the two workers does
                    bound = phase_cpu(a) / max(b["parent_cpu_s"], phase_cpu(b) / 2)
                    ratios.append((label, a["mb_in"], a["phase_s"] / b["phase_s"], bound,
                                   phase_cpu(b) / phase_cpu(a), b["parent_cpu_s"] / phase_cpu(b)))
    print(f"load: {os.getloadavg()}")
    if ratios:
        print("\n| code | MB | 2 workers / 1: per-doc phase, wall (under this load) | from CPU s on 2 free cores | "
              "CPU s 2 workers / 1 | parent's share of the CPU s |")
        print("|---|---:|---:|---:|---:|---:|")
        for label, mb, wall, bound, cpu, share in ratios:
            print(f"| {label} | {mb:.0f} | {wall:.2f}x | {bound:.2f}x | {cpu:.2f} | {share:.2f} |")


if __name__ == "__main__":
    main()
