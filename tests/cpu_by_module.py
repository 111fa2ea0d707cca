"""A pytest plugin that says where the suite's CPU goes: each test module's CPU seconds (the worker's own and its
reaped children's: the stage processes, servers and DVC commands a test waits on) and wall seconds, one JSON line per
module and worker, appended to $CPU_BY_MODULE (default cpu_by_module.jsonl). CPU seconds hold up under load where wall
times do not (docs/testing.md).

    CPU_BY_MODULE=/tmp/cpu.jsonl python -m pytest -p tests.cpu_by_module -n 3 --dist loadfile
    python -m tests.cpu_by_module /tmp/cpu.jsonl        # the modules by CPU seconds, largest first
"""

from __future__ import annotations

import json
import os
import sys
import time

import pytest

_modules: dict[str, dict] = {}


def _cpu() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    name = getattr(getattr(item, "module", None), "__name__", "?")
    wall, cpu = time.time(), _cpu()
    yield
    m = _modules.setdefault(name, {"wall": 0.0, "cpu": 0.0, "tests": 0})
    m["wall"] += time.time() - wall
    m["cpu"] += _cpu() - cpu
    m["tests"] += 1


def pytest_sessionfinish(session):
    if not _modules:
        return
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    with open(os.environ.get("CPU_BY_MODULE", "cpu_by_module.jsonl"), "a", encoding="utf-8") as f:
        for name, m in _modules.items():
            f.write(json.dumps({"module": name, "worker": worker, **m}) + "\n")


def table(path: str) -> str:
    rows = [json.loads(line) for line in open(path, encoding="utf-8")]
    rows.sort(key=lambda r: -r["cpu"])
    total = sum(r["cpu"] for r in rows) or 1.0
    lines, running = [f"{'module':45s} {'CPU s':>7s} {'wall s':>7s} tests  share"], 0.0
    for r in rows:
        running += r["cpu"]
        lines.append(f"{r['module']:45s} {r['cpu']:7.1f} {r['wall']:7.1f} {r['tests']:5d}  {running / total:5.0%}")
    return "\n".join(lines + [f"{'all':45s} {total:7.1f}"])


if __name__ == "__main__":
    print(table(sys.argv[1] if len(sys.argv) > 1 else "cpu_by_module.jsonl"))
