"""Peak RSS (whole process tree) and wall time of `bertpipe prepare` on generated corpora, two code trees side by side.

    python bench/bench_prepare_stream.py --mb 50 150 --workers 1 2 [--before /path/to/old/checkout]

Each corpus is unique documents (shuffled sentences of the bundled laws) with planted exact, near and task-leak
copies (tests/gen_prepare.py), as one jsonl source of the domain corpus, general corpus off. Every run is the real
CLI in a fresh project; ``--before`` runs the same command with another checkout first on PYTHONPATH (e.g. main
before streaming). Prints one row per run: code, MB, workers, wall s, peak RSS MB, RSS/corpus, MB/s, kept docs.
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

from bertpipe.proctree import peak_rss  # noqa: E402
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
    proc = subprocess.Popen([sys.executable, "-m", "bertpipe.cli", "prepare", "--params", str(proj / "params.yaml")],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    peak = peak_rss(proc)
    wall = time.perf_counter() - t
    err = proc.stderr.read()
    if proc.returncode:
        raise SystemExit(f"{code}: exit {proc.returncode}\n{err[-2000:]}")
    stats = json.loads((proj / "work" / "prepare" / "stats.json").read_text())
    dom = stats["corpora"]["domain"]
    return {"wall_s": round(wall, 1), "prepare_s": stats["duration_s"], "peak_mb": round(peak / 2**20),
            "mb_in": stats["mb_in"], "kept": dom["kept"]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=float, nargs="+", default=[50, 150])
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--before", type=Path, default=None, help="another checkout to run first (e.g. main)")
    args = ap.parse_args()
    print(f"load: {os.getloadavg()}")
    print("| code | MB | workers | wall s | prepare s | peak RSS MB | RSS / corpus | MB/s | kept |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        for mb in args.mb:
            corpus = tmp / f"corpus{mb:g}.jsonl"
            generate(corpus, mb)
            for label, code in ([("before", args.before)] if args.before else []) + [("this", ROOT)]:
                for w in args.workers:
                    r = run(code, corpus, w, tmp)
                    print(f"| {label} | {r['mb_in']:.0f} | {w} | {r['wall_s']} | {r['prepare_s']} | {r['peak_mb']} | "
                          f"{r['peak_mb'] / r['mb_in']:.1f}x | {r['mb_in'] / r['prepare_s']:.2f} | {r['kept']} |",
                          flush=True)
    print(f"load: {os.getloadavg()}")


if __name__ == "__main__":
    main()
