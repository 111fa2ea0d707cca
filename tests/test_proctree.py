"""bertpipe.infra.proctree: the process-tree peak RSS that the benches and the bounded-memory tests read."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytest.importorskip("psutil")

from bertpipe.infra.proctree import TreeMonitor, peak_rss  # noqa: E402

# The root holds little; its child (a grandchild of the test) holds ~300 MB and burns CPU for a moment.
TREE = r"""
import subprocess, sys
child = '''
import time
x = bytearray(300 * 2**20)
for i in range(0, len(x), 4096):
    x[i] = 1  # touch every page: RSS, not just address space
t = time.process_time()
while time.process_time() - t < 0.4:
    pass
time.sleep(0.6)
'''
subprocess.run([sys.executable, "-c", child], check=True)
"""


def test_peak_rss_counts_the_descendants_memory():
    proc = subprocess.Popen([sys.executable, "-c", TREE])
    peak = peak_rss(proc, every=0.02)
    assert proc.returncode == 0
    # the root alone is a bare interpreter (~10-20 MB); only the grandchild's buffer gets the sum past 300 MB
    assert peak > 300 * 2**20


def test_monitor_sums_the_cpu_seconds_of_the_tree():
    proc = subprocess.Popen([sys.executable, "-c", TREE])
    mon = TreeMonitor(proc.pid, every=0.02)
    proc.wait()
    mon.stop()
    assert mon.peak > 300 * 2**20
    assert mon.cpu_s > 0.3  # the grandchild's 0.4 s busy loop (seen at its last poll, before its 0.6 s sleep)
