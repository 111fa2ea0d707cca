"""The throughput benches time the matmul peak of the precision their run computes in, and no other: on a CPU without
bf16 units a bf16 matmul is emulated, and timing it at 4096² stalled a bench for 10+ minutes before its first step.
Quick: the peak is measured for real, on tiny matrices; no bench runs."""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

import pytest
import torch

from bertpipe.infra.device import Caps, choose_precision

BENCH = Path(__file__).resolve().parents[1] / "bench"
TIMING_BENCHES = ("bench_pretrain.py", "bench_finetune.py")


def _bench_pretrain():
    spec = importlib.util.spec_from_file_location("bench_pretrain", BENCH / "bench_pretrain.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("requested, cpu_bf16, dtype", [
    ("auto", False, torch.float32),  # a CPU without bf16 units: fp32, and only its peak
    ("auto", True, torch.bfloat16),
    ("fp32", True, torch.float32),
])
def test_the_peak_is_timed_in_the_runs_precision_only(requested, cpu_bf16, dtype):
    bench = _bench_pretrain()
    real, asked = bench.matmul_peak, []

    def timed(d, sizes=bench.SIZES, seconds=1.5):
        asked.append(d)
        return real(d, sizes=(32,), seconds=0.001)  # real matmuls, tiny ones

    bench.matmul_peak = timed
    peak, per = bench.precision_peak(choose_precision(requested, Caps("cpu", cpu_bf16=cpu_bf16)))
    assert asked == [dtype] and peak > 0 and list(per) == [32]


def test_the_benches_time_a_peak_only_through_the_runs_precision():
    """Every call of ``matmul_peak`` in the benches that report MFU is the one in ``precision_peak``."""
    callers = []
    for name in TIMING_BENCHES:
        tree = ast.parse((BENCH / name).read_text(encoding="utf-8"))
        for fn in ast.walk(tree):
            if isinstance(fn, ast.FunctionDef):
                callers += [(name, fn.name) for node in ast.walk(fn) if isinstance(node, ast.Call)
                            and getattr(node.func, "id", getattr(node.func, "attr", None)) == "matmul_peak"]
    assert callers == [("bench_pretrain.py", "precision_peak")], callers
