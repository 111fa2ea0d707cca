"""Every GPU used, tested without GPUs: the slot pool's device assignment as a pure function
(N concurrent stages x M GPUs -> disjoint CUDA_VISIBLE_DEVICES), concurrent holders of a real pool getting disjoint
sets, base/pretrain's process count and the torchrun command it relaunches with (`nproc: 2` end to end, two gloo
ranks: tests/test_pretrain_resume.py::test_two_gloo_processes)."""

from __future__ import annotations

import threading

import pytest

from bertpipe.stages.pretrain.run import resolve_nproc, torchrun_command
from bertpipe_prefect.tasks import parallel


@pytest.mark.parametrize("n, m", [(n, m) for n in range(1, 7) for m in range(0, 9)])
def test_device_sets_disjoint_and_balanced(n, m):
    devices = [str(i) for i in range(m)]
    sets = parallel.device_sets(n, devices)
    assert len(sets) == n
    if m == 0:
        assert sets == [[]] * n
    elif n <= m:  # disjoint, every GPU used, sizes within one
        flat = [d for s in sets for d in s]
        assert sorted(flat, key=int) == devices and len(set(flat)) == m
        assert max(map(len, sets)) - min(map(len, sets)) <= 1
    else:  # more stages than GPUs: one GPU each, none shared by more than ceil(n / m)
        assert all(len(s) == 1 for s in sets)
        load = {d: sum(s == [d] for s in sets) for d in devices}
        assert max(load.values()) <= -(-n // m) and min(load.values()) >= n // m


def test_device_sets_examples():
    assert parallel.device_sets(2, ["0", "1", "2", "3", "4"]) == [["0", "1", "2"], ["3", "4"]]
    assert parallel.device_sets(4, ["0", "1"]) == [["0"], ["1"], ["0"], ["1"]]
    assert parallel.device_sets(2, ["4", "6"]) == [["4"], ["6"]]  # ids kept (a narrowed CUDA_VISIBLE_DEVICES)


def test_visible_devices_follow_cuda_visible_devices(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2, 3")
    assert parallel.visible_devices() == ["2", "3"]
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert parallel.visible_devices() == []


def test_concurrent_stages_get_disjoint_gpus_in_their_child_env():
    """Four stages at once on a 4-slot pool over 4 GPUs: each child environment has a different one; after them a
    stage gets a released slot's GPU; outside a slot nothing is set."""
    parallel.open_pool("t", 4, devices=["0", "1", "2", "3"])
    seen, barrier = {}, threading.Barrier(4)

    def stage(name):
        with parallel.slot("t", 0, name) as devs:
            barrier.wait(timeout=10)  # all four hold a slot at the same time
            seen[name] = (devs, parallel.child_env(1).get("CUDA_VISIBLE_DEVICES"))

    try:
        threads = [threading.Thread(target=stage, args=(f"s{i}",)) for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(v[1] for v in seen.values()) == ["0", "1", "2", "3"]
        assert all(",".join(devs) == env for devs, env in seen.values())
        with parallel.slot("t", 0, "later") as devs:
            assert devs in (["0"], ["1"], ["2"], ["3"])
    finally:
        parallel.close_pool("t")
    import os

    assert parallel.child_env(1).get("CUDA_VISIBLE_DEVICES") == os.environ.get("CUDA_VISIBLE_DEVICES")


def test_no_gpu_changes_nothing(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    parallel.open_pool("cpu", 2, devices=[])
    try:
        with parallel.slot("cpu", 0, "a") as devs:
            assert devs == [] and "CUDA_VISIBLE_DEVICES" not in parallel.child_env(1)
    finally:
        parallel.close_pool("cpu")


@pytest.mark.parametrize("setting, gpus, n", [("auto", 0, 1), ("auto", 1, 1), ("auto", 4, 4), (2, 0, 2), (1, 8, 1)])
def test_resolve_nproc(setting, gpus, n):
    assert resolve_nproc(setting, gpus) == n


def test_torchrun_command_keeps_the_params():
    cmd = torchrun_command("pretrain", 4, ("/p/params.yaml", "full", ["pretrain.lr=1e-4"]), force=True, tracking=False)
    assert cmd[1:5] == ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node=4"]
    assert cmd[cmd.index("--params") + 1] == "/p/params.yaml" and cmd[cmd.index("--profile") + 1] == "full"
    assert cmd[cmd.index("--set") + 1] == "pretrain.lr=1e-4" and "--force" in cmd and "--no-tracking" in cmd
