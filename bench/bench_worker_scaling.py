"""The ceiling of 2 workers on this machine: the token store's worker function on the same chunks, one process at a
time and then two processes at once, in CPU and wall seconds each.

    python bench/bench_worker_scaling.py [--chunks 4] [--raw .bertpipe/test-raw]

If two at once cost each process more CPU seconds than one alone, the cores are not independent (shared caches,
memory bandwidth, a host's hyperthreads); if they cost the same but take longer in wall, other load holds the cores.
Either caps any 2-worker stage whatever its code does. bench_tokstore.py and bench_prepare_stream.py give the
stages' own figures; this one separates the machine from the code. Say the load beside the figures.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import random
import sqlite3
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def run(chunks: list[list[str]]) -> tuple[float, float]:
    from bertpipe.stages.pretrain import tokstore

    c, t = time.process_time(), time.perf_counter()
    for ch in chunks:
        tokstore._work(ch)
    return time.process_time() - c, time.perf_counter() - t


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--chunks", type=int, default=4, help="chunks of 512 documents per process")
    ap.add_argument("--raw", type=Path, default=REPO / ".bertpipe" / "test-raw")
    args = ap.parse_args()
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    from tokenizers import Tokenizer

    from bertpipe.stages.pretrain import tokstore

    backend = Tokenizer.from_file(str(args.raw / "bert-base-chinese" / "tokenizer.json"))
    with sqlite3.connect(args.raw / "china_law" / "laws.db") as c:
        arts = [r[0] for r in c.execute("select article_text from articles where length(article_text) > 20")]
    rng = random.Random(0)
    chunks = [["".join(rng.choice(arts) for _ in range(4)) for _ in range(512)] for _ in range(args.chunks)]
    print(f"load before: {os.getloadavg()}; {args.chunks} chunks of 512 documents per process", flush=True)
    with mp.get_context("spawn").Pool(2, initializer=tokstore._init_worker, initargs=(backend, "zh")) as pool:
        pool.map(run, [[chunks[0][:20]]] * 2)  # both workers load jieba's dictionary first
        alone = [pool.apply(run, (chunks,)) for _ in range(2)]
        both = pool.map(run, [chunks, chunks])
        alone += [pool.apply(run, (chunks,)) for _ in range(2)]
    cpu_alone = sum(c for c, _ in alone) / len(alone)
    cpu_both = sum(c for c, _ in both) / len(both)
    wall_alone = sum(w for _, w in alone) / len(alone)
    wall_both = max(w for _, w in both)
    print("| runs | CPU s per process | wall s |")
    print("|---|---|---|")
    print(f"| one at a time (mean of {len(alone)}) | {cpu_alone:.2f} | {wall_alone:.2f} |")
    print(f"| two at once | {cpu_both:.2f} | {wall_both:.2f} |")
    print(f"CPU s per process, two at once / alone: {cpu_both / cpu_alone:.3f}; "
          f"throughput of two at once / one: {2 * wall_alone / wall_both:.2f}x (the wall; 2.0 on 2 free cores)")
    print(f"load after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
