"""The slot pool keeps a slot for a critical stage that is about to arrive (tasks.parallel.Slots with the graph).

A little flow of real threads: each stage waits for its upstream stages, then takes a moment to reach the pool (the
flow's task threads load their config first), holds a slot while it sleeps, and releases it. In the demo this race let
the base encoder's finetunes take both slots before vocab, on the critical path, arrived."""

from __future__ import annotations

import threading
import time

from bertpipe_prefect.tasks import parallel

# root -> vocab -> pretrain -> adapted, and root -> two side stages: vocab is on the longest path.
GRAPH: parallel.Graph = {"root": [], "vocab": ["root"], "side1": ["root"], "side2": ["root"],
                         "pretrain": ["vocab"], "adapted": ["pretrain"]}
ARRIVE = {"side1": 0.0, "side2": 0.03, "vocab": 0.25}  # seconds from the upstream's end to reaching the pool


def run_flow(slots: parallel.Slots, graph: parallel.Graph, work_s: float = 0.4) -> list[tuple[str, float]]:
    """Start every stage's thread at once, as the flow submits every task at once; returns (stage, start) in order."""
    prio = parallel.remaining(graph)
    done = {n: threading.Event() for n in graph}
    starts: list[tuple[str, float]] = []
    lock = threading.Lock()
    t0 = time.monotonic()

    def stage(name: str) -> None:
        for u in graph[name]:
            done[u].wait(10)
        time.sleep(ARRIVE.get(name, 0.0))
        with slots.hold(prio[name], name):
            with lock:
                starts.append((name, time.monotonic() - t0))
            time.sleep(0.05 if name == "root" else work_s)
        done[name].set()

    threads = [threading.Thread(target=stage, args=(n,)) for n in graph]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    return starts


def test_a_slot_waits_for_the_critical_stage_about_to_arrive():
    with_graph = [n for n, _ in run_flow(parallel.Slots(2, GRAPH), GRAPH)]
    # vocab arrives last of the three but starts beside the first side stage; the second side stage waits.
    assert with_graph[:3] == ["root", "side1", "vocab"], with_graph
    assert with_graph.index("side2") > with_graph.index("vocab")
    # The same flow on a pool that does not know the graph: whoever arrives first takes the free slots.
    without = [n for n, _ in run_flow(parallel.Slots(2), GRAPH)]
    assert without[:3] == ["root", "side1", "side2"], without


def test_an_expected_stage_that_never_comes_holds_a_slot_back_only_for_the_grace():
    # vocab's task was answered from a cache: it never reaches the pool, pretrain and adapted never become ready.
    graph = {n: ups for n, ups in GRAPH.items() if n not in ("pretrain", "adapted")}
    slots = parallel.Slots(2, GRAPH, grace_s=0.5)
    starts = dict(run_flow(slots, {n: ups for n, ups in graph.items() if n != "vocab"}, work_s=1.5))
    root_end = starts["root"] + 0.05
    assert starts["side1"] - root_end < 0.3  # a slot was free beyond the one kept for vocab
    assert 0.4 < starts["side2"] - root_end < 1.2  # kept for vocab for the grace, then given up (side1 still runs)
