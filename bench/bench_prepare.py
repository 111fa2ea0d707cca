"""Benchmark the prepare stage on the laws corpus (laws.db) and on it replicated N times.

    .venv/bin/python bench/bench_prepare.py [--db data/raw/china_law/laws.db] [--scales 1,10] [--skip-baseline]

1. The full prepare stage (ingest, clean, exact + near dedup, split, parquet) on the domain corpus at each scale, in a
   fresh process: wall time, MB/s of raw UTF-8 text, peak RSS.
2. Near-duplicate detection alone on the largest scale's cleaned, exact-deduplicated texts: bertpipe's vectorised
   numpy MinHash against a straightforward baseline that builds a ``datasketch.MinHash`` per document in a Python
   loop and queries a ``datasketch.MinHashLSH``. Both verify candidates against the true Jaccard, so their pair sets
   are comparable; the script prints both counts and their overlap.

Replicas are not copies (copies would just be exact duplicates): replica r maps every CJK ideograph c to
U+4E00 + (c - U+4E00 + 997 r) mod 20992, a different text with the same structure, so each replica holds the same
near-duplicate pairs as the original and none across replicas. Law names are shifted too, so groups stay distinct.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CJK0, CJK_N = 0x4E00, 20992


def shift_table(r: int) -> dict[int, int]:
    return {c: CJK0 + (c - CJK0 + 997 * r) % CJK_N for c in range(CJK0, CJK0 + CJK_N)} if r else {}


def replicate_db(src: Path, dst: Path, times: int) -> None:
    """laws.db with its ``laws`` and ``articles`` rows repeated ``times`` times, each replica CJK-shifted."""
    con_in = sqlite3.connect(src)
    con = sqlite3.connect(dst)
    for (sql,) in con_in.execute("SELECT sql FROM sqlite_master WHERE sql IS NOT NULL"):
        con.execute(sql)
    laws = con_in.execute("SELECT * FROM laws").fetchall()
    arts = con_in.execute("SELECT * FROM articles").fetchall()
    n_art = len(arts)
    for r in range(times):
        tab = shift_table(r)

        def tr(v):
            return v.translate(tab) if isinstance(v, str) and tab else v

        con.executemany(
            "INSERT INTO laws VALUES (?,?,?,?,?,?,?,?,?,?)",
            [(f"{row[0]}-{r}", tr(row[1]), *row[2:]) for row in laws],
        )
        con.executemany(
            "INSERT INTO articles VALUES (?,?,?,?,?,?,?,?,?,?,?,?)",
            [(row[0] + r * n_art, f"{row[1]}-{r}", tr(row[2]), *row[3:10], tr(row[10]), row[11]) for row in arts],
        )
    con.commit()
    con.close()
    con_in.close()


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# ------------------------------------------------------------------ children (fresh processes, so peak RSS is theirs)


def child_prepare(db: str, work: str) -> dict:
    import contextlib

    import yaml

    from bertpipe.core.stage import run_stage
    from bertpipe.graph.pipeline import load_config
    from bertpipe.stages.prepare.declare import prepare_stage
    from bertpipe.stages.prepare.params import LAWS_QUERY

    params = {
        "paths": {"work": f"{work}/work", "state": f"{work}/state"},
        "prepare": {
            "domain": {
                "sources": [
                    {
                        "path": db,
                        "format": "sqlite",
                        "query": LAWS_QUERY,
                        "id_field": "id",
                        "group_field": "law_name",
                        "meta_fields": ["law_id", "publish_date", "status", "law_department"],
                        "name": "china_law",
                    }
                ]
            },
            "general": {"enabled": False},
        },
    }
    pfile = Path(work) / "params.yaml"
    pfile.write_text(yaml.safe_dump(params, allow_unicode=True))
    cfg = load_config(pfile)
    t = time.perf_counter()
    res = run_stage(prepare_stage(), cfg, force=True, tracker_factory=lambda *a: contextlib.nullcontext())
    wall = time.perf_counter() - t
    stats = json.loads((res.out / "stats.json").read_text())["corpora"]["domain"]
    return {"wall_s": wall, "peak_rss_mb": peak_rss_mb(), "stats": stats}


def child_dedup(method: str, texts_file: str, pairs_out: str, n: int, num_perm: int, threshold: float) -> dict:
    import numpy as np

    texts = json.loads(Path(texts_file).read_text(encoding="utf-8"))
    t = time.perf_counter()
    if method == "bertpipe":
        from bertpipe.lib.cleaning.dedup import near_duplicates

        pairs = near_duplicates(texts, n, num_perm, threshold, seed=1, verify=True, recall_weight=0.9).pairs
    elif method == "rensa":
        pairs = rensa_loop(texts, n, num_perm, threshold)
    else:
        pairs = datasketch_loop(texts, n, num_perm, threshold)
    wall = time.perf_counter() - t
    np.save(pairs_out, np.asarray(pairs, dtype=np.int64).reshape(-1, 2))
    return {"wall_s": wall, "peak_rss_mb": peak_rss_mb(), "pairs": int(len(pairs))}


def datasketch_loop(texts: list[str], n: int, num_perm: int, threshold: float):
    """The straightforward way: one datasketch MinHash per document, an LSH index, a query per document, and the
    candidates checked against the true Jaccard of the n-gram sets."""
    from datasketch import MinHash, MinHashLSH

    def grams(t: str) -> set[str]:
        return {t[i : i + n] for i in range(len(t) - n + 1)} if len(t) >= n else ({t} if t else set())

    lsh = MinHashLSH(threshold=threshold, num_perm=num_perm, weights=(0.1, 0.9))  # the stage's recall_weight
    sigs = []
    for i, t in enumerate(texts):
        m = MinHash(num_perm=num_perm, seed=1)
        m.update_batch([g.encode("utf-8") for g in grams(t)])
        lsh.insert(i, m)
        sigs.append(m)
    pairs = []
    for i, m in enumerate(sigs):
        for j in lsh.query(m):
            if j > i:
                a, b = grams(texts[i]), grams(texts[j])
                if len(a & b) / len(a | b) >= threshold:
                    pairs.append((i, j))
    return sorted(pairs)


def rensa_loop(texts: list[str], n: int, num_perm: int, threshold: float):
    """The same loop with rensa's Rust MinHash and LSH (same bands as the stage), for the choice of implementation."""
    from rensa import RMinHash, RMinHashLSH

    from bertpipe.lib.cleaning.dedup import lsh_params

    def grams(t: str) -> set[str]:
        return {t[i : i + n] for i in range(len(t) - n + 1)} if len(t) >= n else ({t} if t else set())

    bands, rows = lsh_params(threshold, num_perm, 0.9)
    used = bands * rows  # rensa wants num_perm = bands x rows; the stage's banding reads exactly these rows too
    lsh = RMinHashLSH(threshold=threshold, num_perm=used, num_bands=bands)
    sigs = []
    for i, t in enumerate(texts):
        m = RMinHash(num_perm=used, seed=1)
        m.update(list(grams(t)))
        lsh.insert(i, m)
        sigs.append(m)
    pairs = []
    for i, m in enumerate(sigs):
        for j in lsh.query(m):
            if j > i:
                a, b = grams(texts[i]), grams(texts[j])
                if len(a & b) / len(a | b) >= threshold:
                    pairs.append((i, j))
    return sorted(pairs)


# ------------------------------------------------------------------ driver


def run_child(*args: str) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, __file__, *args], capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise SystemExit(f"{args[0]} {args[1]} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def cleaned_texts(db: Path) -> list[str]:
    """The texts near-dup detection sees in the stage: cleaned, exact duplicates removed."""
    from bertpipe.lib.cleaning.clean import Cleaner
    from bertpipe.lib.cleaning.dedup import exact_key
    from bertpipe.lib.cleaning.params import CleanParams

    cleaner = Cleaner(CleanParams())
    seen, out = set(), []
    con = sqlite3.connect(db)
    for (raw,) in con.execute("SELECT article_text FROM articles ORDER BY id"):
        t = cleaner(raw or "")
        if t is not None and (k := exact_key(t)) not in seen:
            seen.add(k)
            out.append(t)
    return out


def labelled_precision(threshold: float, ngram: int, num_perm: int) -> str:
    """Precision of the detector's pairs on the hand-labelled laws.db sample in tests/data/prepare."""
    from bertpipe.lib.cleaning.dedup import near_duplicates

    lines = (REPO / "tests/data/prepare/labelled_near_dup_pairs.jsonl").read_text(encoding="utf-8").splitlines()
    pairs = [json.loads(x) for x in lines[1:]]
    texts, index = [], {}
    for p in pairs:
        for side in ("a", "b"):
            index.setdefault(p[f"{side}_id"], len(texts))
            if len(texts) < len(index):
                texts.append(p[side])
    found = {tuple(sorted(x)) for x in near_duplicates(texts, ngram, num_perm, threshold).pairs.tolist()}
    hits = [p for p in pairs if tuple(sorted((index[p["a_id"]], index[p["b_id"]]))) in found]
    good = sum(p["label"] for p in hits)
    return f"{len(pairs)} labelled pairs, {len(hits)} detected, {good} of them real near-duplicates: precision {good / len(hits):.3f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--db", default=str(REPO / "data/raw/china_law/laws.db"))
    ap.add_argument("--scales", default="1,10")
    ap.add_argument("--skip-baseline", action="store_true")
    ap.add_argument("--skip-prepare", action="store_true", help="only the near-dup comparison on the largest scale")
    ap.add_argument("--methods", default="bertpipe,datasketch", help="near-dup implementations to compare "
                    "(bertpipe, datasketch, rensa); the first is the reference for pair agreement")
    ap.add_argument("--ngram", type=int, default=5)
    ap.add_argument("--num-perm", type=int, default=128)
    ap.add_argument("--threshold", type=float, default=0.7)
    args = ap.parse_args()
    import numpy as np

    scales = [int(s) for s in args.scales.split(",")]
    print("hand-labelled sample: " + labelled_precision(args.threshold, args.ngram, args.num_perm), flush=True)
    print(f"load average at start: {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores", flush=True)
    with tempfile.TemporaryDirectory(prefix="bench-prepare-") as tmp:
        tmp = Path(tmp)
        rows = []
        for k in scales:
            db = tmp / f"laws_x{k}.db"
            replicate_db(Path(args.db), db, k)
            if args.skip_prepare:
                continue
            work = tmp / f"work_x{k}"
            work.mkdir()
            r = run_child("--child-prepare", str(db), str(work))
            s = r["stats"]
            con = sqlite3.connect(db)
            mb_exact = con.execute("SELECT sum(length(CAST(article_text AS BLOB))) FROM articles").fetchone()[0] / 1e6
            con.close()
            rows.append((k, s["ingested"], mb_exact, r["wall_s"], r["peak_rss_mb"], s["near"]["pairs"], s["timings"]))
            print(
                f"prepare laws x{k}: {s['ingested']:,} docs, {mb_exact:.1f} MB UTF-8, {r['wall_s']:.1f} s, "
                f"{mb_exact / r['wall_s']:.2f} MB/s, peak RSS {r['peak_rss_mb']:.0f} MB, near pairs "
                f"{s['near']['pairs']:,}, kept {s['kept']:,}, phases {s['timings']}",
                flush=True,
            )
        if len(rows) > 1 and not args.skip_prepare:
            (k0, _, mb0, w0, *_), (k1, _, mb1, w1, *_) = rows[0], rows[-1]
            print(f"scaling x{k0}->x{k1}: data x{mb1 / mb0:.1f}, time x{w1 / w0:.1f} "
                  f"(linear = {mb1 / mb0:.1f})", flush=True)

        if args.skip_baseline:
            return
        k = scales[-1]
        texts = cleaned_texts(tmp / f"laws_x{k}.db")
        tf = tmp / "texts.json"
        tf.write_text(json.dumps(texts, ensure_ascii=False), encoding="utf-8")
        common = [str(args.ngram), str(args.num_perm), str(args.threshold)]
        res = {}
        methods = args.methods.split(",")
        for method in methods:
            res[method] = run_child("--child-dedup", method, str(tf), str(tmp / f"{method}.npy"), *common)
            print(f"near-dup {method} on laws x{k} ({len(texts):,} docs): {res[method]['wall_s']:.1f} s, "
                  f"peak RSS {res[method]['peak_rss_mb']:.0f} MB, {res[method]['pairs']:,} pairs", flush=True)
        ref = methods[0]
        a = {tuple(p) for p in np.load(tmp / f"{ref}.npy").tolist()}
        for other in methods[1:]:
            b = {tuple(p) for p in np.load(tmp / f"{other}.npy").tolist()}
            both = len(a & b)
            print(f"{ref} vs {other}: {res[other]['wall_s'] / res[ref]['wall_s']:.1f}x faster; pairs {ref} {len(a):,}, "
                  f"{other} {len(b):,}, both {both:,} (agreement {both / max(1, len(a | b)):.3f} Jaccard)", flush=True)
    print(f"load average at end: {os.getloadavg()[0]:.2f}", flush=True)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child-prepare":
        sys.path.insert(0, str(REPO))
        print(json.dumps(child_prepare(sys.argv[2], sys.argv[3])))
    elif len(sys.argv) > 1 and sys.argv[1] == "--child-dedup":
        m, tf, out, n, p, t = sys.argv[2:8]
        print(json.dumps(child_dedup(m, tf, out, int(n), int(p), float(t))))
    else:
        main()
