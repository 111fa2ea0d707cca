"""prepare in batches on workers (cleaning, task exclusion, exact keys and MinHash per batch, LSH bands merged) gives
byte for byte the output of one worker: through a local process pool (the CLI's way) and through an installed executor
(the flow's way), with exact and near duplicates and task dev/test texts whose matches sit in other batches than
their originals."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import random
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from bertpipe.lib.cleaning.dedup import normal_form
from bertpipe.lib.cleaning.exclude import EvalTexts
from tests import synthetic as S
from bertpipe.core.stage import run_stage
from bertpipe.stages.prepare.corpus import prepare_corpus
from bertpipe.stages.prepare.declare import prepare_stage
from bertpipe.stages.prepare.params import CorpusParams, PrepareParams, SourceParams
from bertpipe.stages.prepare.shard import use_executor
from tests.test_prepare_stage import LAWS, make_config

NO_TRACKER = lambda *a: contextlib.nullcontext()  # noqa: E731


def _changed(text: str, k: int) -> str:
    return text[:k] + ("国" if text[k] != "国" else "民") + text[k + 1 :]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """300 documents; copies of the first ones (exact, whitespace-changed, one character changed) at the end, so with
    any cut into 2-4 shards a duplicate and its original are in different shards."""
    rng = random.Random(3)
    texts = ["".join(rng.choice(S.FILLER) for _ in range(rng.randint(40, 120))) for _ in range(300)]
    texts += [texts[0], " ".join(texts[1][:30]) + texts[1][30:], _changed(texts[2], 20), _changed(texts[3], 60),
              "前言" + texts[4] + "后记。", "短"]  # contains a task text; one too short
    rows = [{"id": f"d{i}", "text": t, "group": f"g{i % 37}", "status": "现行有效" if i % 3 else "历史版本"}
            for i, t in enumerate(texts)]
    path = tmp_path_factory.mktemp("shards") / "docs.jsonl"
    S.write_jsonl(path, rows)
    return path


def _run(corpus: Path, shards, keep_out: EvalTexts, verify: bool, out: Path, batch_bytes: int = 4000) -> dict:
    source = SourceParams(path=str(corpus), format="jsonl", id_field="id", group_field="group", meta_fields=["status"])
    p = PrepareParams(domain=CorpusParams(sources=[source]))
    p.dedup.keep_order = ["id"]
    p.dedup.verify = verify
    p.clean.min_chars = 3
    res = prepare_corpus("domain", p.domain, p, lambda s: Path(s), keep_out=keep_out, shards=shards, out=out,
                         batch_bytes=batch_bytes)
    stats = {k: v for k, v in res.stats.items() if k != "timings"}
    return {"docs": res.read_docs(), "stats": stats, "clusters": res.clusters,
            "workers": res.stats["timings"]["shards"], "batches": res.stats["timings"]["batches"]}


def _keep_out(corpus: Path) -> EvalTexts:
    rows = [json.loads(x) for x in corpus.read_text(encoding="utf-8").splitlines()]
    return EvalTexts([normal_form(rows[i]["text"]) for i in (3, 4, 250)], [{"t"}, {"t"}, {"u"}], ["t", "u"])


@pytest.mark.parametrize("verify", [True, False])
def test_shards_on_an_executor_give_the_one_pass_result(corpus, verify, tmp_path):
    whole = _run(corpus, 1, _keep_out(corpus), verify, tmp_path / "whole", batch_bytes=1 << 30)
    one = _run(corpus, 1, _keep_out(corpus), verify, tmp_path / "one")
    assert whole["batches"] == 1 and one["workers"] == 1 and one["batches"] > 10
    s = one["stats"]
    assert s["exact"]["removed"] >= 2 and s["near"]["removed"] >= 1, s  # the planted copies were found across batches
    assert s["excluded"]["docs"] >= 3 and s["clean"]["removed"]["too_short"] == 1, s
    for key in ("docs", "stats", "clusters"):
        assert whole[key] == one[key], key
    with ThreadPoolExecutor(3) as pool, use_executor(pool, workers=3):
        for shards in ("auto", 2, 4):
            got = _run(corpus, shards, _keep_out(corpus), verify, tmp_path / str(shards))
            assert got["workers"] == (3 if shards == "auto" else shards)
            for key in ("docs", "stats", "clusters"):
                assert got[key] == one[key], (shards, key)


def test_prepare_stage_in_a_process_pool_writes_the_same_files(tmp_path, corpus):
    source = {"path": str(corpus), "format": "jsonl", "id_field": "id", "group_field": "group", "name": "mine"}
    outs = []
    for shards in (1, 3):
        (tmp_path / str(shards)).mkdir()
        cfg = make_config(tmp_path / str(shards), domain=[LAWS, source], overrides=[f"flow.prepare_shards={shards}"])
        outs.append(run_stage(prepare_stage(), cfg, tracker_factory=NO_TRACKER))
    assert outs[0].fingerprint == outs[1].fingerprint  # the shard count is not part of what is built
    files = sorted(p.relative_to(outs[0].out) for p in outs[0].out.rglob("*.parquet"))
    assert len(files) == 5
    for rel in (*files, Path("dedup_clusters.jsonl")):
        assert (outs[0].out / rel).read_bytes() == (outs[1].out / rel).read_bytes(), rel
    stats = [json.loads((o.out / "stats.json").read_text()) for o in outs]
    for s in stats:
        for c in s["corpora"].values():
            c.pop("timings")
        for k in ("duration_s", "mb_per_s"):
            s.pop(k)
    assert stats[0] == stats[1]
    assert stats[0]["corpora"]["domain"]["exact"]["removed"] > 0


def test_shard_results_are_plain_data(tmp_path):
    """What a batch returns crosses process and machine boundaries: dataclasses of numpy arrays and builtins."""
    import pickle

    from bertpipe.stages.prepare.shard import BatchJob, process_batch

    p = PrepareParams()
    docs = [{"id": "a", "text": "第一条 为了规范合同行为，制定本法。", "group": "a", "source": "s"},
            {"id": "b", "text": "x", "group": "b", "source": "s"}]
    r = process_batch(BatchJob(0, docs, p, None, None, tmp_path / "b.parquet", ("id", "text", "group", "source")))
    back = pickle.loads(pickle.dumps(r))
    assert back.kept == 1 and back.near.keys.shape[1] == 1 and back.exact.shape == (1, 16)
    assert dataclasses.is_dataclass(back) and (tmp_path / "b.parquet").is_file()
