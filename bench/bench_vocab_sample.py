"""How many characters must vocab mine? The words found on a sample (``vocab.max_chars``) vs on the whole corpus.

    python bench/bench_vocab_sample.py [--mb 30] [--samples 1e6 3e6 1e7] [--top-k 2000] [--min-freq 20] [--workers 2]

Generates a corpus as bench/bench_scale.py does (shuffled sentences of the bundled laws and news) or reads jsonl
files (``--corpus DIR``), counts it once in the order it would be streamed — tallies are added up chunk by chunk, so
the tally of each prefix is on the way — and ranks the words (the ``full`` profile's ``top_k`` and ``min_freq``) at
each sample size and at the end. Prints, per sample, the share of the whole corpus's top-k words the sample finds,
the same for the 500 best, and the mining time; ``max_chars`` in params.yaml's ``full`` profile comes from this table
(docs/scale.md).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))


def texts_of(corpus: Path):
    for f in sorted(corpus.glob("*.jsonl")):
        with open(f, encoding="utf-8") as fh:
            for line in fh:
                yield json.loads(line)["text"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mb", type=float, default=30)
    ap.add_argument("--corpus", default="", help="a directory of jsonl files with a 'text' field")
    ap.add_argument("--samples", type=float, nargs="+", default=[1e6, 3e6, 1e7])
    ap.add_argument("--top-k", type=int, default=2000)
    ap.add_argument("--min-freq", type=int, default=20)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--raw", default=str(REPO / ".bertpipe" / "test-raw"))
    ap.add_argument("--dir", default="/tmp/bench_vocab_sample")
    args = ap.parse_args()

    from bench_scale import make_corpus, sentences

    from bertpipe.stages.vocab import count, mining
    from bertpipe.stages.vocab.extend import load_tokenizer
    from bertpipe.stages.vocab.params import VocabParams

    raw = Path(args.raw)
    corpus = Path(args.corpus) if args.corpus else Path(args.dir) / f"mb{args.mb:g}" / "corpus"
    if not args.corpus and not corpus.exists():
        make_corpus(corpus.parent, args.mb, sentences(raw))
    tok = load_tokenizer(raw / "bert-base-chinese")
    params = VocabParams(top_k=args.top_k, min_freq=args.min_freq)
    settings = mining.count_settings(tok, "zh", params)
    print(f"load before: {os.getloadavg()}; corpus {corpus}", flush=True)

    total = count.Tally()
    results = []  # (chars, seconds, mined words in rank order)
    stream = texts_of(corpus)
    marks = sorted(int(s) for s in args.samples)
    started = time.perf_counter()
    for mark in marks + [0]:
        # The next stretch of the stream, up to ``mark`` characters in all (0: the rest).
        need = mark - total.n_chars if mark else 0
        if mark and need <= 0:
            continue
        stretch, size = [], 0
        for t in stream:
            stretch.append(t)
            size += len(t)
            if need and size >= need:
                break
        total.add(count.tally([stretch], settings, workers=args.workers))
        r = mining.rank_tally(total, tok, params)
        results.append((total.n_chars, time.perf_counter() - started, [c.word for c in r.candidates]))
        if size < need or not mark:
            break
    full = results[-1][2]
    print(f"\nload after: {os.getloadavg()}\n")
    print(f"| sample chars | share of the whole corpus's top {len(full)} found | of its top 500 | "
          "mining s (cumulative) |")
    print("|---|---|---|---|")
    for chars, secs, words in results:
        top = set(words)
        share = len(top & set(full)) / max(1, len(full))
        share500 = len(top & set(full[:500])) / max(1, min(500, len(full)))
        print(f"| {chars:,} | {share:.3f} | {share500:.3f} | {secs:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
