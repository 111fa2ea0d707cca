"""Timing helpers shared by the distill stage's side-by-side throughput and bench/bench_export.py."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Callable, Sequence

import numpy as np


def dir_size(path: Path | str, suffixes: tuple[str, ...] = (".safetensors", ".bin", ".onnx", ".data")) -> int:
    """Bytes of the weight files of a saved model dir (or one file)."""
    p = Path(path)
    if p.is_file():
        return p.stat().st_size
    return sum(f.stat().st_size for f in p.rglob("*") if f.is_file() and f.name.endswith(suffixes))


def n_params(model) -> int:
    return sum(p.numel() for p in model.parameters())


def time_calls(calls: dict[str, Callable[[object], int]], items: Sequence, rounds: int = 3, warmup: int = 1
               ) -> dict[str, dict]:
    """Time ``call(item)`` (returning how many examples it scored) per name over every item, ``rounds`` times,
    interleaved per item so that load changes hit every contestant alike. Returns per name the p50/p99 latency of
    one call (ms) and examples/s over all calls."""
    for fn in calls.values():
        for item in list(items)[:warmup]:
            fn(item)
    times: dict[str, list[float]] = {k: [] for k in calls}
    counts: dict[str, int] = {k: 0 for k in calls}
    for _ in range(rounds):
        for item in items:
            for name, fn in calls.items():
                t = time.perf_counter()
                counts[name] += fn(item)
                times[name].append(time.perf_counter() - t)
    out = {}
    for name, ts in times.items():
        arr = np.array(ts)
        out[name] = {"p50_ms": float(np.percentile(arr, 50) * 1000), "p99_ms": float(np.percentile(arr, 99) * 1000),
                     "examples_per_s": counts[name] / float(arr.sum())}
    return out


def batched(items: Sequence, size: int) -> list[list]:
    return [list(items[i : i + size]) for i in range(0, len(items), size)]
