"""Serving throughput and latency: `bertpipe models serve` with dynamic batching on vs off, and MLflow's own scoring
server, on the same registered model, driven over 127.0.0.1 with a bounded load in one run.

    python bench/bench_serve.py                       # builds a demo-sized registry (2 layers x 128) in a temp dir
    python bench/bench_serve.py --layers 6 --hidden 512   # a model where compute, not HTTP, dominates
    python bench/bench_serve.py --project . --model bertpipe-sentiment@champion   # a real project's registry

Prints examples/s and p50/p99 latency at concurrency 1, 8 and 32 (a fixed number of requests each), and the ratio
batching-on / batching-off at concurrency 32 (target >= 3x), plus p99 against "batch wait + one batch's compute".
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
BIN = Path(sys.executable).parent
TEXTS = ["这个产品质量很好，物流也快，下次还会再来买。", "包装破损，客服态度差，非常失望。", "性价比一般，凑合用吧。",
         "屏幕清晰，电池耐用，推荐购买！"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(url: str, proc: subprocess.Popen, timeout: float = 180) -> None:
    import urllib.request

    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise SystemExit(f"server exited with {proc.returncode}")
        try:
            urllib.request.urlopen(url, timeout=2)
            return
        except OSError:
            time.sleep(0.5)
    raise SystemExit(f"{url} never answered")


async def drive(url: str, payload, concurrency: int, n: int) -> dict:
    """n requests, at most ``concurrency`` at a time; returns examples/s and latency percentiles (ms)."""
    import httpx

    lat: list[float] = []
    errors = 0
    sem = asyncio.Semaphore(concurrency)
    async with httpx.AsyncClient(timeout=60, limits=httpx.Limits(max_connections=concurrency)) as client:
        async def one(i: int) -> None:
            nonlocal errors
            async with sem:
                t = time.perf_counter()
                r = await client.post(url, content=json.dumps(payload(i), ensure_ascii=False).encode(),
                                      headers={"Content-Type": "application/json"})
                lat.append(time.perf_counter() - t)
                errors += r.status_code != 200

        t0 = time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(n)))
        wall = time.perf_counter() - t0
    lat.sort()
    pct = lambda q: 1000 * lat[min(len(lat) - 1, int(q * len(lat)))]  # noqa: E731
    return {"ex_s": n / wall, "p50_ms": pct(0.50), "p99_ms": pct(0.99), "errors": errors}


def start(cmd: list[str], cwd: Path, env: dict) -> subprocess.Popen:
    return subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def stop(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(60)
    except subprocess.TimeoutExpired:
        proc.kill()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--project", type=Path, help="a bertpipe project whose registry holds --model")
    ap.add_argument("--model", default="bertpipe-sentiment@champion")
    ap.add_argument("--requests", type=int, default=256, help="requests per concurrency level")
    ap.add_argument("--concurrency", default="1,8,32")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--wait-ms", type=float, default=10.0)
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads of each server's model process (the same for every server measured)")
    ap.add_argument("--hidden", type=int, default=128, help="size of the built model (without --project)")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--skip-mlflow", action="store_true")
    a = ap.parse_args()
    from e2e_project import env_for

    if a.project is None:
        from serve_registry import build_registry

        a.project = Path(tempfile.mkdtemp(prefix="bench-serve-")) / "project"
        tok = REPO / ".bertpipe" / "test-raw" / "bert-base-chinese"
        if not tok.is_dir():
            from bertpipe.lib.samples import DEFAULT_SAMPLES, fetch_samples

            fetch_samples(tok.parent, REPO / ".bertpipe", DEFAULT_SAMPLES, log=lambda *_: None)
        print(f"building a registry ({a.layers} layers x {a.hidden} hidden) in {a.project}", file=sys.stderr)
        build_registry(a.project, tok, versions=1, hidden=a.hidden, layers=a.layers)
    env = env_for(a.project)
    env.update(OMP_NUM_THREADS=str(a.threads), MKL_NUM_THREADS=str(a.threads))
    levels = [int(c) for c in a.concurrency.split(",")]
    payload = lambda i: {"text": TEXTS[i % len(TEXTS)]}  # noqa: E731
    rows = []
    configs = [("bertpipe models serve, batching on", a.batch), ("bertpipe models serve, batching off", 1)]
    for label, batch in configs:
        port = free_port()
        proc = start([str(BIN / "bertpipe"), "models", "serve", a.model, "--port", str(port), "--max-batch-size",
                      str(batch), "--set", f"serve.batch_wait_ms={a.wait_ms if batch > 1 else 0}",
                      "--set", f"serve.num_threads={a.threads}"], a.project, env)
        try:
            wait_ready(f"http://127.0.0.1:{port}/health", proc)
            asyncio.run(drive(f"http://127.0.0.1:{port}/predict", payload, 4, 16))  # warm-up
            for c in levels:
                rows.append((label, c, asyncio.run(drive(f"http://127.0.0.1:{port}/predict", payload, c, a.requests))))
        finally:
            stop(proc)
    if not a.skip_mlflow:
        port = free_port()
        name, _, alias = a.model.partition("@")
        env_m = dict(env, MLFLOW_TRACKING_URI=f"sqlite:///{(a.project / '.bertpipe' / 'mlflow.db').resolve()}")
        proc = start([str(BIN / "mlflow"), "models", "serve", "-m", f"models:/{name}@{alias or 'champion'}",
                      "--env-manager", "local", "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
                     a.project, env_m)
        try:
            wait_ready(f"http://127.0.0.1:{port}/ping", proc)
            mpayload = lambda i: {"inputs": [TEXTS[i % len(TEXTS)]]}  # noqa: E731
            for c in levels:
                rows.append(("mlflow models serve", c,
                             asyncio.run(drive(f"http://127.0.0.1:{port}/invocations", mpayload, c, a.requests))))
        finally:
            stop(proc)

    load = os.getloadavg()[0]
    print(f"\n{a.requests} requests per level, {a.threads} torch thread(s) per server, load average {load:.1f} on "
          f"{os.cpu_count()} cores\n")
    print("| server | concurrency | examples/s | p50 ms | p99 ms | errors |\n|---|---|---|---|---|---|")
    for label, c, r in rows:
        print(f"| {label} | {c} | {r['ex_s']:.1f} | {r['p50_ms']:.0f} | {r['p99_ms']:.0f} | {r['errors']} |")
    get = {(label, c): r for label, c, r in rows}
    top = max(levels)
    on, off = get.get((configs[0][0], top)), get.get((configs[1][0], top))
    if on and off:
        print(f"\nbatching on / off at concurrency {top}: {on['ex_s'] / off['ex_s']:.2f}x throughput (target >= 3x)")
        batch_compute = 1000 * min(a.batch, top) / max(on["ex_s"], 1e-9)
        print(f"p99 {on['p99_ms']:.0f} ms vs batch wait {a.wait_ms:.0f} ms + one batch's compute ~{batch_compute:.0f} "
              f"ms: bound 2x = {2 * (a.wait_ms + batch_compute):.0f} ms")
    return 0


if __name__ == "__main__":
    sys.exit(main())
