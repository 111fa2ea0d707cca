"""Benchmark: pretrain's data build — the in-memory builder vs the token store (1 and 2 workers) vs a restart.

    .venv/bin/python bench/bench_tokstore.py [--mb 50] [--seq 128] [--raw .bertpipe/test-raw]

Generates a corpus of unique documents (the bundled law articles' sentences, shuffled into new documents) of about
``--mb`` MB as sharded parquet, then runs each case in its own process: ``memory`` is what every start did before
the store (``read_texts`` + ``build_examples``); ``store-1w`` / ``store-2w`` build the store with 1 or 2 tokenizer
processes into an empty state dir; ``restart`` opens the store ``store-2w`` built (what a resume, a rerun with other
training params or another torchrun rank does) and collates a first batch. Prints wall and CPU seconds (the
process tree's), peak RSS of the whole process tree (sampled every 50 ms), tokens/s, and the ratios: restart /
first start, 2 workers / 1 worker throughput. Say the machine's load beside the figures.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def make_corpus(raw: Path, out: Path, mb: float, seed: int = 0) -> int:
    """Unique documents of 3-12 sentences drawn from the law articles, ~``mb`` MB of UTF-8, in 4 shards."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from bertpipe.lib.textseg import split_sentences

    with sqlite3.connect(raw / "china_law" / "laws.db") as c:
        arts = [r[0] for r in c.execute("select article_text from articles where length(article_text) > 20")]
    sents = [s for a in arts for s in split_sentences(a)]
    rng = random.Random(seed)
    docs, size = [], 0
    while size < mb * 1e6:
        d = "".join(rng.choice(sents) for _ in range(rng.randint(3, 12)))
        docs.append(d)
        size += len(d.encode())
    (out / "train").mkdir(parents=True)
    for i in range(4):
        part = docs[i::4]
        pq.write_table(pa.table({"id": [f"d{i}-{j}" for j in range(len(part))], "text": part}),
                       out / "train" / f"part-{i:05d}.parquet")
    pq.write_table(pa.table({"text": docs[:200]}), out / "valid.parquet")
    return size


def child(args) -> dict:
    """One case, in this process (and its workers)."""
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    import torch
    from transformers import AutoTokenizer

    from bertpipe.lib.mlm import data

    from bertpipe.lib.mlm.params import PretrainParams
    from bertpipe.stages.pretrain import tokstore

    torch.set_num_threads(1)
    tok = AutoTokenizer.from_pretrained(args.tokenizer)
    p = PretrainParams(max_seq_len=args.seq)
    import resource

    def cpu() -> float:  # this process and its finished children (the tokenizer processes, once shut down)
        s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime

    t0, c0 = time.perf_counter(), cpu()
    parent = None
    if args.case == "memory":
        ex = data.build_examples(data.read_texts(args.corpus, "train"), tok, "zh", p, 0, p.seed)
        n, tokens = len(ex), sum(len(e) for e in ex)
        first = data.collate(ex[:32], tok.pad_token_id)
    else:
        workers = 2 if args.case == "store-2w" else 1
        store, rec = tokstore.open_or_build(args.corpus, "train", tok, "zh", p, 0, p.seed, args.state,
                                            workers=workers, log=lambda m: print(m, file=sys.stderr))
        n, tokens = len(store), store.tokens
        first = data.collate(store[:32], tok.pad_token_id)
        assert rec["built"] == (args.case != "restart"), rec
        parent = store.meta["parent_cpu_s"] if rec["built"] else None
    wall = time.perf_counter() - t0
    return {"wall_s": wall, "data_cpu_s": cpu() - c0, "parent_cpu_s": parent, "examples": n, "tokens": int(tokens),
            "first_batch": list(first["input_ids"].shape)}


def run_case(case: str, corpus: Path, state: Path, args) -> dict:
    from bertpipe.infra.proctree import TreeMonitor

    cmd = [sys.executable, __file__, "--child", case, "--corpus", str(corpus), "--state", str(state),
           "--tokenizer", str(args.tokenizer), "--seq", str(args.seq)]
    out = tempfile.NamedTemporaryFile("r", suffix=".json", delete=False)
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd + ["--result", out.name], cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    mon = TreeMonitor(proc.pid, every=0.05)
    proc.wait()
    wall = time.perf_counter() - t0
    mon.stop()
    if proc.returncode:
        raise SystemExit(f"case {case} failed ({proc.returncode})")
    res = json.loads(Path(out.name).read_text())
    return {**res, "process_wall_s": wall, "cpu_s": mon.cpu_s, "peak_rss_mb": mon.peak / 2**20}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=float, default=50)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--raw", type=Path, default=REPO / ".bertpipe" / "test-raw")
    ap.add_argument("--tokenizer", type=Path, default=None)
    ap.add_argument("--cases", default="memory,store-1w,store-2w,restart")
    ap.add_argument("--child", default=None)
    ap.add_argument("--corpus", type=Path)
    ap.add_argument("--state", type=Path)
    ap.add_argument("--result", type=Path)
    args = ap.parse_args()
    if args.child:
        args.case = args.child
        args.result.write_text(json.dumps(child(args)))
        return
    args.tokenizer = args.tokenizer or args.raw / "bert-base-chinese"
    with tempfile.TemporaryDirectory(prefix="bench-tokstore-") as tmp:
        tmp = Path(tmp)
        size = make_corpus(args.raw, tmp / "corpus", args.mb)
        print(f"corpus: {size / 1e6:.1f} MB of text, max_seq_len {args.seq}; load {os.getloadavg()}", flush=True)
        res = {}
        for case in args.cases.split(","):
            state = tmp / ("state-2w" if case in ("store-2w", "restart") else f"state-{case}")
            res[case] = r = run_case(case, tmp / "corpus", state, args)
            print(f"{case:9s} wall {r['process_wall_s']:8.1f} s (data {r['wall_s']:8.1f} s)  cpu {r['cpu_s']:8.1f} s "
                  f"(data {r['data_cpu_s']:7.1f} s, packing parent {r['parent_cpu_s'] or 0:6.1f} s)  "
                  f"peak RSS {r['peak_rss_mb']:7.0f} MB  {r['tokens'] / r['wall_s']:10,.0f} tokens/s  "
                  f"{r['tokens'] / max(r['data_cpu_s'], 1e-9):9,.0f} tokens/CPU-s  {r['examples']:,} examples", flush=True)
        if "restart" in res and "store-2w" in res:
            print(f"restart / first start (data build): {res['restart']['wall_s'] / res['store-2w']['wall_s']:.4f}; "
                  f"process wall {res['restart']['process_wall_s'] / res['store-2w']['process_wall_s']:.3f}")
        if "store-1w" in res and "store-2w" in res:
            a, b = res["store-1w"], res["store-2w"]
            # on an idle machine 2 workers finish when the busier of parent and each worker does: the CPU bound
            bound = a["data_cpu_s"] / max(b["parent_cpu_s"] or 0, (b["data_cpu_s"] - (b["parent_cpu_s"] or 0)) / 2)
            print(f"2 workers / 1 worker throughput: {a['wall_s'] / b['wall_s']:.2f}x wall (under this load); "
                  f"{bound:.2f}x from CPU seconds on 2 free cores")
        if "memory" in res and "store-1w" in res:
            print(f"store-1w / in-memory: wall {res['store-1w']['wall_s'] / res['memory']['wall_s']:.2f}x, "
                  f"peak RSS {res['store-1w']['peak_rss_mb'] / res['memory']['peak_rss_mb']:.2f}x")
        print(f"load after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
