"""How the flow turns the stage graph into concurrency: edges from inputs, what may overlap, cores per worker, and
the slot pool's order. (The real flow runs in test_front_doors, test_pipeline_e2e and test_own_domain.)"""

from __future__ import annotations

import threading
import time

from bertpipe.graph.pipeline import all_stages, load_config, upstream
from bertpipe_prefect.tasks import parallel
from tests.e2e_project import write_project


def demo_graph(tmp_path, sample_raw, extra: dict | None = None) -> parallel.Graph:
    cfg = load_config(write_project(tmp_path, sample_raw, extra))
    stages = all_stages(cfg)
    return {n: upstream(n, cfg, stages) for n in stages}


def test_edges_come_from_the_stages_inputs(tmp_path, sample_raw):
    g = demo_graph(tmp_path, sample_raw)
    assert g["splits"] == []
    assert g["prepare"] == ["splits"]  # the dev/test texts it keeps out of the pretraining corpora
    assert g["base"] == ["prepare"]
    assert g["start"] == ["prepare"]  # the start decision: the corpus identity, nothing else on disk
    assert g["vocab"] == ["prepare", "base", "start"]
    assert g["pretrain"] == ["prepare", "vocab"]
    assert sorted(g["finetune/sentiment/base"]) == ["base", "splits"]
    assert sorted(g["finetune/sentiment/adapted"]) == ["pretrain", "splits"]
    assert set(g["register"]) >= {"evaluate", "pretrain", "finetune/sentiment/adapted"}
    # A base given as a directory is no stage: its finetunes need nothing upstream.
    enc = tmp_path / "enc"
    enc.mkdir()
    g2 = demo_graph(tmp_path / "p2", sample_raw, {"model": {"base": str(enc)}})
    assert "base" not in g2 and g2["finetune/sentiment/base"] == ["splits"]


def test_tapt_sits_between_pretrain_and_its_finetune(tmp_path, sample_raw):
    g = demo_graph(tmp_path, sample_raw, {"finetune": {"encoders": ["base", "adapted", "tapt"]}})
    assert sorted(g["tapt/sentiment"]) == ["pretrain", "splits"]
    assert sorted(g["finetune/sentiment/tapt"]) == ["splits", "tapt/sentiment"]
    # the task's export (and register) weigh every encoder's finetune of it
    assert {f"finetune/sentiment/{e}" for e in ("base", "adapted", "tapt")} <= set(g["export/sentiment"])
    assert {f"finetune/sentiment/{e}" for e in ("base", "adapted", "tapt")} <= set(g["register"])
    assert not [n for n in demo_graph(tmp_path / "p2", sample_raw) if n.startswith("tapt/")]  # not named: no stage


def test_what_may_overlap_and_until(tmp_path, sample_raw):
    g = demo_graph(tmp_path, sample_raw)
    light = {n for n, st in all_stages(load_config(tmp_path / "params.yaml")).items() if st.light}
    assert light == {"start"}
    side = parallel.overlapping(g, light)
    # splits, prepare and register are each before or after every other stage: they run alone; so does base, whose
    # only neighbour is the (light) start decision; start itself runs beside base. (evaluate may run beside the
    # distill/export stages, which also hang off the finetunes.)
    assert not side & {"splits", "prepare", "register", "base"}
    assert "start" in side
    assert {"vocab", "pretrain", "finetune/sentiment/base", "finetune/msra_ner/adapted", "evaluate",
            "distill/sentiment"} <= side
    assert parallel.overlapping(g) == side | {"base"}  # counting start as work, base would share the cores
    upto = parallel.select(g, ["pretrain"])
    assert list(upto) == ["splits", "prepare", "base", "start", "vocab", "pretrain"]
    assert parallel.overlapping(upto, light) == {"start"}  # the start decision needs only prepare
    assert parallel.plan(2, 1, n_cores=2) == (1, 2)  # one stage that can share: one slot, every core
    prio = parallel.remaining(g)
    assert prio["pretrain"] > prio["finetune/sentiment/base"]  # the critical path goes first


def test_plan_divides_the_cores():
    assert parallel.plan("auto", 6, n_cores=2) == (2, 1)
    assert parallel.plan("auto", 6, n_cores=16) == (4, 4)
    assert parallel.plan("auto", 1, n_cores=16) == (1, 16)  # nothing can overlap: one stage on every core
    assert parallel.plan(1, 6, n_cores=2) == (1, 2)
    assert parallel.plan(3, 6, n_cores=2) == (3, 1)
    assert parallel.plan("auto", 6, n_cores=1) == (1, 1)


def test_slots_admit_by_priority_and_never_exceed_the_count():
    slots = parallel.Slots(1)
    order, running, peak = [], [0], [0]
    lock = threading.Lock()
    release = threading.Event()

    def worker(name: str, prio: int) -> None:
        with slots.hold(prio):
            with lock:
                running[0] += 1
                peak[0] = max(peak[0], running[0])
                order.append(name)
            if name == "first":
                release.wait(5)
            time.sleep(0.01)
            with lock:
                running[0] -= 1

    first = threading.Thread(target=worker, args=("first", 0))
    first.start()
    while not order:
        time.sleep(0.01)
    others = [threading.Thread(target=worker, args=(n, p)) for n, p in (("low", 1), ("high", 5), ("mid", 3))]
    for t in others:
        t.start()
        time.sleep(0.05)  # all three queue while "first" holds the slot
    release.set()
    for t in [first, *others]:
        t.join(10)
    assert order == ["first", "high", "mid", "low"] and peak[0] == 1


def test_a_user_error_in_a_stage_process_stays_one_line(tmp_path, sample_raw):
    import pytest

    from bertpipe.infra.errors import BertpipeError
    from bertpipe_prefect.tasks.stages import _isolated

    params = write_project(tmp_path, sample_raw, {"finetune": {"tasks": {"mine": {
        "type": "classification", "format": "csv", "train": str(tmp_path / "missing.csv")}}}})
    cfg = load_config(params)
    with pytest.raises(BertpipeError, match="missing.csv"):
        _isolated("splits", str(params), None, [], 1, cfg)  # task data is read where it is materialised
    log = (cfg.state / "logs" / "splits.log").read_text()
    assert log.startswith("=== ") and "error: " in log and "Traceback" not in log


def test_a_stage_error_in_the_flow_process_pickles_without_the_cluster_probe_s_error():
    """A stage run in the flow's process runs under ``cluster_executor``; its user error is what Prefect persists as
    the failed flow's result, pickled the way distributed's import (tblib) makes every exception pickle: with its
    traceback and the exception it was raised under. It must not be raised under the probe's 'No worker found'
    (which chains to an unpicklable ContextVar): the flow printed 'Failed to serialize ... BertpipeError'."""
    import cloudpickle
    import distributed  # noqa: F401 (its import installs tblib's exception pickling, as in a flow run)
    import pytest

    from bertpipe.infra.errors import BertpipeError
    from bertpipe_prefect.tasks.cluster import cluster_executor

    with pytest.raises(BertpipeError) as info:
        with cluster_executor() as (executor, workers):
            assert (executor, workers) == (None, 1)
            raise BertpipeError("t.csv: classification needs at least two labels")
    assert info.value.__context__ is None
    assert str(cloudpickle.loads(cloudpickle.dumps(info.value))) == "t.csv: classification needs at least two labels"


def test_an_unknown_until_is_a_one_line_error_before_the_flow_starts(tmp_path, sample_raw):
    from tests.e2e_project import env_for, invoke

    write_project(tmp_path, sample_raw)
    proc = invoke(["run", "--until", "pretrian"], tmp_path, env_for(tmp_path, prefect="ephemeral"))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()] and "--until 'pretrian'" in proc.stderr
    assert not (tmp_path / "work").exists()


def test_base_encoder_only_registers_the_encoder_and_stages_says_why_a_stage_waits(tmp_path, sample_raw):
    """finetune.encoders: [base] finetunes no adapted model: register logs the adapted encoder alone (before, its
    graph asked for finetune/<task>/adapted, which no stage makes, so `bertpipe stages` showed it "waiting for
    inputs" with no reason and `bertpipe run` failed at register); a stage that does wait says on what."""
    from typer.testing import CliRunner

    from bertpipe.doors.cli.commands import app
    from bertpipe.graph.freshness import plan

    g = demo_graph(tmp_path, sample_raw, {"finetune": {"encoders": ["base"]}})
    assert not any(n.endswith("/adapted") for n in g)
    assert sorted(g["register"]) == ["base", "evaluate", "export/encoder", "prepare", "pretrain", "vocab"]
    cfg = load_config(tmp_path / "params.yaml")
    assert plan(cfg)["register"].state == "stale"

    # a task whose data file is missing: the splits stage waits on it, everything below waits on splits; each says so
    params = write_project(tmp_path / "p2", sample_raw, {"finetune": {"tasks": {"mine": {
        "type": "classification", "format": "csv", "train": str(tmp_path / "missing.csv")}}}})
    res = CliRunner().invoke(app, ["stages", "--params", str(params)])
    rows = {line.split()[0]: line for line in res.stdout.splitlines()}
    assert "waiting for inputs" in rows["splits"] and "missing.csv" in rows["splits"], res.stdout
    assert "waiting for inputs" in rows["prepare"] and "(waits for splits)" in rows["prepare"], res.stdout
