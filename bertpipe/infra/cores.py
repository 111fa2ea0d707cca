"""How many cores this machine lends, and how many torch threads a stage that computes recorded numbers (pretrain,
tapt, finetune, distill, evaluate, export) computes with.

``training_threads`` is the one rule every door follows (the CLI, DVC, the flow in its own process or in a child
process beside other stages): CPU kernels split their reductions by thread count, so another count gives other
weights (a tiny pretrain: eval_loss 7.856784 with 1 thread, 7.856831 with 2) under one fingerprint. The count is a
function of the stage's params and the machine only, never of the door or of what runs beside the stage. Its
default is the share the flow gives a stage that runs beside others, so the flow's side-by-side stages lose nothing
(they ran with that share); a stage run alone uses no more than that share.
"""

from __future__ import annotations

import os


def usable_cores() -> int:
    """Cores this process may use: the affinity mask (taskset, cpusets), narrowed by a cgroup v2 CPU quota
    (`docker --cpus`), which the mask does not show."""
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        n = os.cpu_count() or 1
    try:
        quota, period = open("/sys/fs/cgroup/cpu.max").read().split()[:2]
        if quota != "max":
            n = min(n, max(1, int(quota) // int(period)))
    except (OSError, ValueError):
        pass
    return max(1, n)


def auto_workers(n_cores: int) -> int:
    """``flow.max_parallel: auto``. On 2 cores two 1-thread finetunes beat one 2-thread finetune after another
    (bench/bench_flow.py: in-flow / alone ratio > 1); tiny models stop scaling past a few threads, so bigger
    machines run up to 4 stages of >= 2 threads each."""
    if n_cores < 2:
        return 1
    if n_cores < 8:
        return 2
    return 4


def training_threads(setting: int, processes: int = 1, alone: bool = False) -> int:
    """Torch intra-op threads for a training stage: ``setting`` when > 0 (the stage's ``threads`` param), else the
    machine's cores (``alone``: a stage the graph never runs beside other work, as the flow gives it every core) or
    their share beside others (divided by ``auto_workers``), divided by the ``processes`` a torchrun launch starts
    on this machine."""
    if setting > 0:
        return setting
    n = usable_cores()
    return max(1, n // (1 if alone else auto_workers(n)) // max(1, processes))


def use_training_threads(setting: int, processes: int = 1, alone: bool = False) -> int:
    """Set this process's torch intra-op threads to ``training_threads(...)``, whatever the door left them at (a
    flow's child starts with OMP_NUM_THREADS at its slot's share, the CLI with every core); returns the count."""
    import torch

    threads = training_threads(setting, processes, alone)
    torch.set_num_threads(threads)
    return threads
