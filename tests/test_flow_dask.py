"""The domain_adaptation flow on a real Dask cluster (two worker processes on 127.0.0.1, started here and given to the
flow by address) builds what the local runner builds (its stages one after another in one process: here, the
test's): the same fingerprints for every stage, byte-identical prepare parquet files (prepare cut into shards on the
cluster's workers) and the same finetune metrics. Both stop after the finetune (``--until finetune``): evaluate and
register do nothing on a cluster that the stages before them do not (each is one more stage process on a worker,
~10 CPU-s apiece, measured), and their outputs were never compared."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.e2e_project import build_chain, run, write_project
from tests.test_register import examples

pytestmark = pytest.mark.slow

FLOW = r"""
import json, sys
from bertpipe.graph.pipeline import load_config
from bertpipe_prefect.flows.domain_adaptation import domain_adaptation
from bertpipe_prefect.tasks.env import prefect_env
overrides = json.loads(sys.argv[1])
prefect_env(load_config("params.yaml", None, overrides))
results = domain_adaptation("params.yaml", None, overrides, "finetune")
print("RESULTS=" + json.dumps({k: v["status"] for k, v in results.items()}))
"""


def make_project(root: Path, raw: Path, enc: Path, tok: Path) -> Path:
    write_project(root, raw, {
        "model": {"base": str(enc), "continue_from": str(enc), "tokenizer": str(tok)},
        # batches of ~50 KB, so the domain corpus spans several and prepare's shards run on the cluster's workers
        "prepare": {"batch_mb": 0.05},
        "vocab": {"top_k": 20, "min_freq": 3, "head_fit_steps": 0, "eval_texts": 8, "max_chars": 30000, "hmm": False},
        "pretrain": {"arch": {"layers": 1, "hidden": 32, "heads": 2, "intermediate": 64, "max_positions": 128},
                     "max_steps": 8, "save_every": 4, "eval_every": 4, "log_every": 4, "max_seq_len": 64,
                     "batch_size": 8, "eval_examples": 16, "output": "last", "fill_mask_samples": 2},
        "finetune": {"encoders": ["adapted"], "train": {"epochs": 1, "max_seq_len": 32, "batch_size": 16},
                     "tasks": {"sentiment": {"type": "classification", "format": "jsonl", "train": "sentiment.jsonl"}}},
        "evaluate": {"mlm_max_texts": 16, "mlm_max_seq_len": 64},
        "register": {"register_encoder": False, "floor": "none"},
        "distill": {"enabled": False}, "export": {"enabled": False},
    })
    (root / "sentiment.jsonl").write_text("".join(
        json.dumps({"text": e.text, "label": e.label}, ensure_ascii=False) + "\n" for e in examples("s", 120)),
        encoding="utf-8")
    return root


def flow(root: Path, overrides: list[str]) -> dict:
    proc = run([sys.executable, "-c", FLOW, json.dumps(overrides)], root, timeout=900)
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULTS=")][-1]
    return json.loads(line[len("RESULTS="):])


def outputs(root: Path) -> dict:
    work = root / "work"
    fps = {str(m.parent.relative_to(work)): json.loads(m.read_text())["fingerprint"]
           for m in work.rglob("manifest.json")}
    parquet = {str(p.relative_to(work)): p.read_bytes() for p in (work / "prepare").rglob("*.parquet")}
    ft = json.loads((work / "finetune" / "sentiment" / "adapted" / "metrics.json").read_text())
    per_seed = {seed: {k: v for k, v in m.items() if k != "train_seconds"} for seed, m in ft["per_seed"].items()}
    return {"fingerprints": fps, "parquet": parquet, "finetune": per_seed}  # all but the wall time


def test_the_flow_on_a_two_worker_cluster_builds_what_the_local_runner_builds(tmp_path, sample_raw,
                                                                              zh_tokenizer_dir):
    from distributed import Client, LocalCluster

    from tests.synthetic import tiny_encoder

    from bertpipe.graph.freshness import upstream_graph
    from bertpipe.graph.pipeline import all_stages, load_config

    enc = tiny_encoder(tmp_path / "enc", zh_tokenizer_dir, layers=1, hidden=32)
    local = make_project(tmp_path / "local", sample_raw, enc, zh_tokenizer_dir)
    on_dask = make_project(tmp_path / "dask", sample_raw, enc, zh_tokenizer_dir)
    # The reference: what the local runner does with flow.max_parallel 1 (run_stage over the chain in one process),
    # in this process (a flow process of its own adds ~6 CPU-s of imports and Prefect's bookkeeping, and how the
    # reference was built is no part of the claim).
    cfg = load_config(local / "params.yaml")
    built = list(upstream_graph(cfg, "finetune"))
    first = {n: "built" if n in built else "skipped" for n in all_stages(cfg)}
    assert {k: v for k, v in first.items() if v != "built"} == {"evaluate": "skipped", "register": "skipped"}, first
    build_chain(local, "finetune")

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                      dashboard_address=None) as cluster, Client(cluster) as client:
        second = flow(on_dask, ["flow.runner=dask", f"flow.cluster_address={cluster.scheduler_address}"])
        assert second == first
        # Every stage ran as a task on the cluster's workers, and prepare's two shards besides.
        executed = client.run(lambda dask_worker: dask_worker.state.executed_count)
        assert sum(executed.values()) >= len(built) + 2 and all(executed.values()), executed
    stats = json.loads((on_dask / "work" / "prepare" / "stats.json").read_text())
    assert stats["corpora"]["domain"]["timings"]["shards"] == 2  # one per worker

    a, b = outputs(local), outputs(on_dask)
    assert a["fingerprints"] == b["fingerprints"] and len(a["fingerprints"]) == len(built)
    assert a["parquet"].keys() == b["parquet"].keys() and a["parquet"] == b["parquet"]
    assert a["finetune"] == b["finetune"]
