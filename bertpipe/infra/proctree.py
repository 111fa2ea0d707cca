"""Peak RSS and CPU seconds of a whole process tree (a command and every process it starts), polled.

The one helper behind the memory figures of the benches (``bench/bench_scale.py``, ``bench/bench_tokstore.py``,
``bench/bench_prepare_stream.py``) and the bounded-memory tests (``tests/test_prepare_scale.py``): a stage's workers
are child processes, so the parent's own ``ru_maxrss`` says nothing about what the stage needs; summing the tree's
RSS at each poll does. A poll can miss a peak shorter than its interval, so a figure is a lower bound at that
resolution. psutil is a test/bench extra, not a runtime dependency: it is imported here only when a monitor starts.
"""

from __future__ import annotations

import threading


class TreeMonitor:
    """Polls the tree rooted at ``pid`` in a thread every ``every`` seconds until ``stop()`` or the root exits:
    ``peak`` (bytes, the largest sum of the tree's RSS seen at one poll) and ``cpu_s`` (user + system seconds of every
    process seen, each at its last poll: a child that exits between polls loses its last interval)."""

    def __init__(self, pid: int, every: float = 0.05):
        import psutil

        self._psutil = psutil
        self._root = psutil.Process(pid)
        self.every = every
        self.peak = 0
        self._cpu: dict[tuple[int, float], float] = {}  # (pid, create time): a reused pid is another process
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    @property
    def cpu_s(self) -> float:
        return sum(self._cpu.values())

    @property
    def descendants_cpu_s(self) -> float:
        """The CPU seconds of every process but the root (a stage's worker processes, their start-up included)."""
        return sum(v for (pid, _), v in self._cpu.items() if pid != self._root.pid)

    def poll(self) -> None:
        psutil = self._psutil
        try:
            procs = [self._root, *self._root.children(recursive=True)]
        except psutil.Error:  # the root has exited
            return
        rss = 0
        for p in procs:
            try:
                with p.oneshot():
                    rss += p.memory_info().rss
                    t = p.cpu_times()
                    self._cpu[(p.pid, p.create_time())] = t.user + t.system
            except psutil.Error:  # exited between the listing and the read
                pass
        self.peak = max(self.peak, rss)

    def _run(self) -> None:
        while not self._done.is_set():
            self.poll()
            if not self._root.is_running():
                break
            self._done.wait(self.every)

    def stop(self) -> "TreeMonitor":
        self._done.set()
        self._thread.join()
        return self


def peak_rss(proc, every: float = 0.05) -> int:
    """Peak RSS in bytes of ``proc`` (a Popen) and all its descendants together, polled until it exits."""
    mon = TreeMonitor(proc.pid, every)
    proc.wait()
    return mon.stop().peak
