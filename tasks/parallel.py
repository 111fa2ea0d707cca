"""How the flow spends the machine's cores.

Measured cause: two finetunes in parallel child processes, each with torch's default intra-op threads
(= every core), plus the temporary Prefect server, ran ~6x slower on 2 cores than one finetune alone. So concurrent
stages divide the cores: ``workers`` stages run at once, each with ``cores // workers`` threads, set before torch
starts its pools (OMP_NUM_THREADS/MKL_NUM_THREADS in the child's environment). A stage the graph never lets overlap
another (prepare, register, ...), or only light ones (base, beside the start decision), runs in the flow's own
process on every core.

Why a slot pool rather than only the task runner's ``max_workers``: a submitted task waits for its upstream futures
*inside* a runner thread, so a bounded thread pool fills with waiting tasks while cores idle. Every stage gets a
thread; a stage takes one of ``workers`` slots only once its inputs exist, longest remaining path first.

GPUs: each slot owns a set of the visible GPUs (``device_sets``), disjoint while there are at least as many GPUs as
slots, and a stage's child process sees only its slot's (``CUDA_VISIBLE_DEVICES``), so concurrent finetunes land on
different GPUs instead of all on ``cuda:0``, and base/pretrain (``nproc: auto``) start one process per GPU of their
slot. With no GPU nothing is set.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import os
import threading
import time
from typing import Iterator

from bertpipe.infra.cores import auto_workers, usable_cores  # noqa: F401 (auto_workers: used here and imported from here)

# The graph as {stage: [upstream stages]}, in a topological order (bertpipe.graph.pipeline.all_stages's order).
Graph = dict[str, list[str]]


def cores() -> int:
    """Cores this process may use (``bertpipe.infra.cores.usable_cores``: affinity mask and cgroup quota)."""
    return usable_cores()


def plan(max_parallel: int | str, width: int, n_cores: int | None = None) -> tuple[int, int]:
    """(workers, threads per worker) when at most ``width`` stages can run at once (``len(overlapping(graph))``
    bounds it)."""
    n = n_cores or cores()
    wanted = auto_workers(n) if max_parallel == "auto" else int(max_parallel)
    workers = max(1, min(wanted, width))
    return workers, max(1, n // workers)


def ancestors(graph: Graph, name: str) -> set[str]:
    seen: set[str] = set()
    todo = list(graph[name])
    while todo:
        n = todo.pop()
        if n not in seen:
            seen.add(n)
            todo += graph[n]
    return seen


def select(graph: Graph, until: list[str] | None) -> Graph:
    """The part of the graph needed for ``until`` (those stages and everything upstream); all of it for None."""
    if until is None:
        return graph
    keep = set(until)
    for n in until:
        keep |= ancestors(graph, n)
    return {n: [u for u in ups if u in keep] for n, ups in graph.items() if n in keep}


def overlapping(graph: Graph, light: set[str] | frozenset[str] = frozenset()) -> set[str]:
    """Stages that may run at the same time as another one that needs cores: those with some stage neither up- nor
    downstream, not counting the ``light`` ones (which do no work worth a core). So base, whose only such stage is
    the start decision, runs alone on every core (it ran on one of two, the other idle, for ~2 minutes of the
    demo); the start decision itself still counts as beside base, and runs in its own process."""
    anc = {n: ancestors(graph, n) for n in graph}
    return {a for a in graph for b in graph
            if a != b and b not in light and a not in anc[b] and b not in anc[a]}


def remaining(graph: Graph) -> dict[str, int]:
    """Stages on the longest path from each stage to the end: the scheduling priority (critical path first)."""
    down: dict[str, list[str]] = {n: [] for n in graph}
    for n, ups in graph.items():
        for u in ups:
            down[u].append(n)
    out: dict[str, int] = {}
    for n in reversed(list(graph)):
        out[n] = 1 + max((out[d] for d in down[n]), default=0)
    return out


def visible_devices() -> list[str]:
    """The GPU ids this process may hand out: CUDA_VISIBLE_DEVICES's entries when it is set, else 0..count-1;
    none without CUDA."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return [d.strip() for d in env.split(",") if d.strip() and d.strip() != "-1"]
    try:
        import torch

        return [str(i) for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []
    except ImportError:
        return []


def device_sets(n_slots: int, devices: list[str]) -> list[list[str]]:
    """The GPUs of each of ``n_slots`` slots. With at least as many GPUs as slots the sets are disjoint and cover
    every GPU (contiguous, sizes differing by at most one: 5 GPUs, 2 slots -> 3 + 2). With fewer GPUs than slots no
    disjoint cover exists; each slot gets one GPU, round robin, so no GPU serves more than ceil(slots / GPUs) stages.
    No GPUs: every set is empty (nothing changes)."""
    m = len(devices)
    if m == 0:
        return [[] for _ in range(n_slots)]
    if n_slots <= m:
        base, extra = divmod(m, n_slots)
        out, at = [], 0
        for i in range(n_slots):
            k = base + (1 if i < extra else 0)
            out.append(devices[at : at + k])
            at += k
        return out
    return [[devices[i % m]] for i in range(n_slots)]


class Slots:
    """A counting semaphore that admits the highest-priority waiter first (FIFO among equals).

    Priority alone only orders stages already waiting. When a stage finishes, the stages it unblocks reach the pool
    one by one (each task thread first loads its config), so the first to arrive took a free slot whatever its
    priority: in the demo the base encoder's finetunes took both slots before vocab, on the critical path, arrived
    (~1.5 min lost). Given the graph, the pool sees that coming: a stage whose upstream stages have all released their
    slots is *expected*, and a waiter is admitted only while free slots outnumber the expected stages that outrank
    it. An expected stage that never arrives (its task was answered from a cache) holds nothing back for more than
    ``grace_s`` after its last upstream finished.
    """

    def __init__(self, n: int, graph: Graph | None = None, priority: dict[str, int] | None = None,
                 grace_s: float = 3.0, devices: list[str] | None = None):
        self.free = n
        self._ids = list(range(n))  # free slot ids, lowest first; slot i owns devices[i]
        self.devices = device_sets(n, devices or [])
        self._cond = threading.Condition()
        self._queue: list[tuple[int, int]] = []
        self._seq = itertools.count()
        self._graph = graph or {}
        self._priority = priority if priority is not None else remaining(self._graph)
        self._grace = grace_s
        self._arrived: set[str] = set()
        self._finished: dict[str, float] = {}  # stage -> when it released its slot (monotonic)

    def _outranking(self, priority: int, now: float) -> tuple[int, float | None]:
        """(how many expected, not yet arrived stages outrank ``priority``, the earliest time one stops counting)."""
        count, until = 0, None
        for name, ups in self._graph.items():
            if name in self._arrived or not ups or self._priority.get(name, 0) <= priority:
                continue
            if all(u in self._finished for u in ups):
                deadline = max(self._finished[u] for u in ups) + self._grace
                if deadline > now:
                    count += 1
                    until = deadline if until is None else min(until, deadline)
        return count, until

    @contextlib.contextmanager
    def hold(self, priority: int = 0, name: str = "") -> Iterator[list[str]]:
        """Wait for a slot; yields the GPUs it owns (empty without GPUs)."""
        with self._cond:
            if name:
                self._arrived.add(name)
            ticket = (-priority, next(self._seq))
            heapq.heappush(self._queue, ticket)
            while True:
                if self.free > 0 and self._queue[0] == ticket:
                    ahead, until = self._outranking(priority, time.monotonic())
                    if self.free > ahead:
                        break
                    self._cond.wait(timeout=until - time.monotonic())
                else:
                    self._cond.wait()
            heapq.heappop(self._queue)
            self.free -= 1
            sid = self._ids.pop(0)
            self._cond.notify_all()
        try:
            yield self.devices[sid]
        finally:
            with self._cond:
                self.free += 1
                self._ids.append(sid)
                self._ids.sort()
                if name:
                    self._finished[name] = time.monotonic()
                self._cond.notify_all()


_POOLS: dict[str, Slots] = {}


def open_pool(key: str, n: int, graph: Graph | None = None, devices: list[str] | None = None) -> None:
    """The flow run's pool of ``n`` slots; with its ``graph`` the pool keeps slots for critical stages about to
    arrive (see Slots). ``devices``: the GPUs the slots share out (default: the visible ones)."""
    _POOLS[key] = Slots(n, graph, devices=visible_devices() if devices is None else devices)


def close_pool(key: str) -> None:
    _POOLS.pop(key, None)


# The GPUs of the slot this thread holds: child_env, called by the same task thread inside ``slot``, gives them to
# the stage's process (a thread-local, so the task code between the two needs no new argument).
_held = threading.local()


@contextlib.contextmanager
def slot(key: str, priority: int, name: str = "") -> Iterator[list[str]]:
    """Hold a slot of the flow run's pool as stage ``name``; without a pool (a task called on its own) run at once.
    Yields the slot's GPUs (empty: no GPU, or no pool)."""
    pool = _POOLS.get(key)
    if pool is None:
        yield []
        return
    with pool.hold(priority, name) as devices:
        _held.devices = devices
        try:
            yield devices
        finally:
            _held.devices = None


def child_env(threads: int, devices: list[str] | None = None) -> dict[str, str]:
    """The environment of a stage's child process: its share of the cores, set before torch starts its pools, and
    its slot's GPUs (``devices``, default: those of the slot this thread holds; none held: unchanged). A stage that
    computes recorded numbers then sets torch's count itself (``bertpipe.infra.cores``), as it does in every door."""
    env = dict(os.environ)
    devices = devices if devices is not None else getattr(_held, "devices", None)
    if devices:
        env["CUDA_VISIBLE_DEVICES"] = ",".join(devices)
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        env[var] = str(threads)
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    return env


def use_threads(n: int) -> None:
    """This process's torch pools: ``n`` intra-op threads; inter-op threads too while torch still allows it."""
    import torch

    torch.set_num_threads(n)
    with contextlib.suppress(RuntimeError):  # only settable before the first inter-op parallel work
        torch.set_num_interop_threads(n)
