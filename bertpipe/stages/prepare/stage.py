"""The prepare stage: raw sources -> cleaned, deduplicated, leakage-free splits of the domain and general corpora.

Output (``ctx.out``): ``{domain,general}/{train,valid,test}/part-NNNNN.parquet`` (columns ``id, text, group, source,
cluster`` plus the sources' meta fields; read them with ``bertpipe.lib.corpusio``), ``stats.json``,
``dedup_clusters.jsonl``, ``report.md`` and ``lengths.png``. ``bertpipe.stages.prepare.corpus`` streams each corpus
through a scratch directory under ``ctx.out`` that is removed before the output is published.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

from bertpipe.infra.errors import BertpipeError
from bertpipe.lib.cleaning.exclude import EvalTexts
from bertpipe.stages.prepare.corpus import CorpusResult, prepare_corpus
from bertpipe.stages.prepare.params import PrepareParams
from bertpipe.stages.prepare.sources import corpora, resolver


def _plot_lengths(results: list[CorpusResult], path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import numpy as np
    except ImportError:  # pragma: no cover
        return False
    fig, axes = plt.subplots(1, len(results), figsize=(5 * len(results), 3.5), squeeze=False)
    for ax, res in zip(axes[0], results):
        for sp in res.splits:
            lens = res.lengths.get(sp, [])
            if len(lens):
                ax.hist(np.log10(lens), bins=40, alpha=0.5, label=f"{sp} ({len(lens)})")
        ax.set_title(f"{res.name}: document length")
        ax.set_xlabel("log10(characters)")
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True


def _excluded_line(ex: dict) -> str:
    """One report line: what matched finetune tasks' dev/test texts, per task and reason."""
    if not ex["by_task"]:
        return "- task dev/test texts: none to exclude (no finetune tasks, or prepare.exclude.tasks: false)"
    per = "; ".join(f"{t}: " + ", ".join(f"{r} {n:,}" for r, n in c.items()) for t, c in ex["by_task"].items())
    return f"- removed {ex['docs']:,} documents matching finetune tasks' dev/test texts ({per})"


def _report(results: list[CorpusResult], stats: dict) -> str:
    lines = ["# prepare", ""]
    for res in results:
        s = res.stats
        lines += [
            f"## {res.name}",
            "",
            f"- ingested {s['ingested']:,} documents ({s['chars_in']:,} chars) from "
            + ", ".join(f"{k} ({v:,})" for k, v in s["sources"].items()),
            "- cleaning removed "
            + (", ".join(f"{k} {v:,}" for k, v in s["clean"]["removed"].items() if v) or "nothing"),
            _excluded_line(s["excluded"]),
            f"- exact duplicates removed {s['exact']['removed']:,} ({s['exact']['clusters']:,} clusters)",
            f"- near duplicates: {s['near']['pairs']:,} pairs over the threshold in {s['near']['clusters']:,} clusters "
            f"({s['near']['candidates']:,} LSH candidates), {s['near']['removed']:,} removed",
            f"- kept {s['kept']:,} documents, {s['chars_out']:,} chars, written to `{res.name}/<split>/part-*.parquet` "
            f"(streamed in {s['timings']['batches']:,} batches on {s['timings']['shards']} worker(s))",
            "",
            "| split | docs | chars | groups |",
            "|---|---:|---:|---:|",
        ]
        for sp, v in s["splits"].items():
            lines.append(f"| {sp} | {v['docs']:,} | {v['chars']:,} | {v['groups']:,} |")
        near = sorted((c for c in res.clusters if c["kind"] == "near"), key=lambda c: -c["size"])[:5]
        if near:
            lines += ["", "Largest near-duplicate clusters (kept member first):", ""]
            for c in near:
                lines.append(f"- {c['size']} × `{c['kept']}` ({', '.join(c['groups'][:3])}): {c['preview']}")
        lines.append("")
    lines.append(
        f"Took {stats['duration_s']:.1f} s for {stats['mb_in']:.1f} MB of UTF-8 text ({stats['mb_per_s']:.2f} MB/s)."
    )
    return "\n".join(lines) + "\n"


def _check_splits(res: CorpusResult) -> None:
    """An empty valid/test split is a failure here, not hours later in pretrain or evaluate."""
    empty = [sp for sp, v in res.stats["splits"].items() if not v["docs"]]
    if empty:
        s = res.stats
        raise BertpipeError(
            f"prepare.{res.name}: {s['kept']:,} of {s['ingested']:,} documents left after cleaning and deduplication "
            f"({s['exact']['removed']:,} exact, {s['near']['removed']:,} near duplicates removed), too few leak groups "
            f"to fill every split ({', '.join(empty)} would be empty); add data or relax prepare.clean/prepare.dedup"
        )


def build(ctx) -> dict:
    p: PrepareParams = ctx.params
    started = time.perf_counter()
    keep_out = EvalTexts.from_inputs(ctx.inputs, p) if p.exclude.tasks else EvalTexts()
    if keep_out.texts:
        ctx.log(f"keeping {len(keep_out.texts):,} dev/test texts of {len(keep_out.tasks)} task(s) out of the corpora")
    results = [_corpus(ctx, name, cp, keep_out) for name, cp in corpora(p)]
    duration = time.perf_counter() - started
    mb_in = sum(r.stats["utf8_bytes_in"] for r in results) / 1e6
    stats = {
        "corpora": {r.name: r.stats for r in results},
        "duration_s": round(duration, 3),
        "mb_in": round(mb_in, 3),
        "mb_per_s": round(mb_in / max(duration, 1e-9), 3),  # UTF-8 text as ingested
    }
    _write(ctx, results, stats)
    metrics: dict[str, float] = {"duration_s": round(duration, 3), "mb_per_s": stats["mb_per_s"]}
    for r in results:
        metrics.update(_corpus_metrics(r))
        ctx.counts[r.name] = _corpus_counts(r.stats)
    ctx.log_metrics(metrics)
    return metrics


def _corpus(ctx, name: str, cp, keep_out: EvalTexts) -> CorpusResult:
    """One corpus prepared into ``ctx.out/<name>/`` (its scratch batches removed however it ends), with a split for
    every part."""
    p: PrepareParams = ctx.params
    ctx.log(f"{name}: {len(cp.sources)} source(s)")
    scratch = ctx.out / f".scratch-{name}"
    try:
        res = prepare_corpus(name, cp, p, resolver(ctx.cfg), with_test=(name == "domain" or p.split.general_test),
                             keep_out=keep_out, shards=ctx.cfg.params.flow.prepare_shards, out=ctx.out,
                             scratch=scratch, batch_bytes=max(1, int(p.batch_mb * (1 << 20))))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    _check_splits(res)
    ctx.log(f"{name}: kept {res.stats['kept']:,} of {res.stats['ingested']:,} documents")
    return res


def _write(ctx, results: list[CorpusResult], stats: dict) -> None:
    """``stats.json``, ``dedup_clusters.jsonl``, ``report.md`` and ``lengths.png``, logged as artifacts."""
    (ctx.out / "stats.json").write_text(json.dumps(stats, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    with open(ctx.out / "dedup_clusters.jsonl", "w", encoding="utf-8") as fh:
        for r in results:
            for c in r.clusters:
                fh.write(json.dumps(c, ensure_ascii=False) + "\n")
    (ctx.out / "report.md").write_text(_report(results, stats), encoding="utf-8")
    for f in ("stats.json", "dedup_clusters.jsonl", "report.md"):
        ctx.log_artifact(ctx.out / f)
    if _plot_lengths(results, ctx.out / "lengths.png"):
        ctx.log_artifact(ctx.out / "lengths.png")


def _corpus_metrics(r: CorpusResult) -> dict[str, float]:
    """A corpus's numbers for MLflow, each named ``<corpus>_<what>``."""
    s, n = r.stats, r.name
    return {
        f"{n}_ingested": s["ingested"],
        f"{n}_kept": s["kept"],
        f"{n}_chars_out": s["chars_out"],
        f"{n}_exact_removed": s["exact"]["removed"],
        f"{n}_task_excluded": s["excluded"]["docs"],
        f"{n}_near_pairs": s["near"]["pairs"],
        f"{n}_near_clusters": s["near"]["clusters"],
        f"{n}_near_removed": s["near"]["removed"],
        **{f"{n}_clean_{k}": v for k, v in s["clean"]["removed"].items()},
        **{f"{n}_{sp}_docs": v["docs"] for sp, v in s["splits"].items()},
    }


def _corpus_counts(s: dict) -> dict:
    """A corpus's counts for the manifest: what each step removed and what each split holds."""
    return {
        "ingested": s["ingested"],
        "removed_by_filter": s["clean"]["removed"],
        "exact_removed": s["exact"]["removed"],
        "task_excluded": {t: sum(c.values()) for t, c in s["excluded"]["by_task"].items()},
        "near_removed": s["near"]["removed"],
        "near_pairs": s["near"]["pairs"],
        "splits": {sp: v["docs"] for sp, v in s["splits"].items()},
    }
