"""The encoder report: baselines | base | adapted | tapt table with intervals and verdicts, per-class recall, the
hyperparameters chosen on dev, the encoder comparison, bar chart, confusion matrices."""

from __future__ import annotations

import functools
from pathlib import Path


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


# Baseline columns: a task has at most one baseline of each group (TF-IDF for classification, lexicon for NER).
BASELINE_GROUPS = {"majority / all-O": ("majority",), "TF-IDF + LR / lexicon": ("tfidf", "lexicon")}


def _baseline_columns(tasks: dict) -> list[str]:
    have = {n for t in tasks.values() for n in t.get("baselines", {})}
    return [g for g, members in BASELINE_GROUPS.items() if have & set(members)]


def _baseline(task: dict, group: str, metric: str) -> float | None:
    for name in BASELINE_GROUPS[group]:
        if metric in task.get("baselines", {}).get(name, {}):
            return task["baselines"][name][metric]
    return None


def bar_chart(path: Path, tasks: dict, encoders: list[str]) -> Path:
    """Left: each task's primary metric for the baselines and each encoder (whiskers: std over seeds). Right: the
    adapted − base difference with its 95% interval, against zero."""
    plt = _plt()
    names = list(tasks)
    series = [("baseline", b) for b in _baseline_columns(tasks)] + [("encoder", e) for e in encoders]
    deltas = [tasks[t].get("delta", {}).get(tasks[t]["primary"]) for t in names]
    with_delta = any(deltas)
    fig, axes = plt.subplots(1, 2 if with_delta else 1, figsize=(max(5.0, 1.9 * len(names) + 2.0) + (3.5 if with_delta
                             else 0), 3.8), gridspec_kw={"width_ratios": [3, 1.4]} if with_delta else None)
    ax = axes[0] if with_delta else axes
    width = 0.8 / max(len(series), 1)
    for j, (kind, name) in enumerate(series):
        means, errs = [], []
        for t in names:
            task = tasks[t]
            if kind == "baseline":
                means.append(_baseline(task, name, task["primary"]) or 0.0)
                errs.append(0.0)
            else:
                stat = task.get(name, {}).get(task["primary"], {})
                means.append(stat.get("mean", 0.0))
                errs.append(stat.get("std", 0.0))
        xs = [i + (j - (len(series) - 1) / 2) * width for i in range(len(names))]
        style = {"hatch": "//", "color": ["#bbbbbb", "#888888"][j % 2]} if kind == "baseline" else {}
        bars = ax.bar(xs, means, width, yerr=errs if kind == "encoder" else None, capsize=3, label=name, **style)
        for b, m in zip(bars, means):
            ax.text(b.get_x() + b.get_width() / 2, m, f"{m:.2f}", ha="center", va="bottom", fontsize=6)
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels([f"{t}\n({tasks[t]['primary']})" for t in names], fontsize=8)
    ax.set_ylim(0, 1.1)
    has_baselines = any(kind == "baseline" for kind, _ in series)
    ax.set_title("primary metric: baselines (hatched) and encoders" if has_baselines else "primary metric per encoder",
                 fontsize=9)
    ax.legend(fontsize=7, ncol=2)
    if with_delta:
        dx = axes[1]
        for i, d in enumerate(deltas):
            if not d:
                continue
            lo, hi = d.get("ci95") or (d["mean"], d["mean"])
            dx.errorbar([i], [d["mean"]], yerr=[[d["mean"] - lo], [hi - d["mean"]]], fmt="o", capsize=4, color="C1")
        dx.axhline(0, color="grey", lw=0.8, ls="--")
        dx.set_xticks(range(len(names)))
        dx.set_xticklabels(names, fontsize=8, rotation=20)
        dx.set_xlim(-0.6, len(names) - 0.4)
        dx.set_title("adapted − base, 95% CI", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


# Fonts that map every character to a placeholder box (matplotlib ships Last Resort): they name nothing
_PLACEHOLDER_FONTS = ("Last Resort",)


@functools.lru_cache(maxsize=None)
def _charmap(font_file: str) -> frozenset[int]:
    from matplotlib.ft2font import FT2Font

    try:
        return frozenset(FT2Font(font_file).get_charmap())
    except (OSError, RuntimeError):  # a font file FreeType cannot read draws nothing
        return frozenset()


def label_font(labels: list[str]) -> str | None:
    """The family of an installed font with a glyph for every character of ``labels`` (matplotlib's own DejaVu Sans
    first, then any other: a CJK font is found by what it draws, whatever its name), or None where no font has them
    all."""
    from matplotlib import font_manager

    chars = {ord(c) for lab in labels for c in lab if not c.isspace()}
    fonts = sorted((f for f in font_manager.fontManager.ttflist if not f.name.startswith(_PLACEHOLDER_FONTS)),
                   key=lambda f: (f.name != "DejaVu Sans", f.name, f.fname))
    return next((f.name for f in fonts if chars <= _charmap(f.fname)), None)


def confusion_png(path: Path, labels: list[str], matrix: list[list[int]], title: str, names: bool = False) -> Path:
    """``confusion_figure`` saved to ``path`` (its suffix picks the format) with a tight bounding box: the canvas
    grows to hold the title and every label, however long, so none is cut."""
    fig = confusion_figure(labels, matrix, title, names)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    _plt().close(fig)
    return path


def confusion_figure(labels: list[str], matrix: list[list[int]], title: str, names: bool = False):
    """Row-normalised confusion matrix (recall per true class) with the counts written in the cells, the class names
    on both axes in a font that draws them. Where no installed font does, the axes show class indices (their key is
    in report.md) unless ``names``: the names whatever the fonts (for an SVG whose text stays text, drawn by the
    viewer's fonts: bertpipe.stages.evaluate.dvcplots)."""
    import numpy as np

    plt = _plt()
    family = label_font(labels)
    readable = names or family is not None
    shown = labels if readable else [str(i) for i in range(len(labels))]
    m = np.asarray(matrix, dtype=float)
    norm = m / np.maximum(m.sum(axis=1, keepdims=True), 1)
    n = len(labels)
    fig, ax = plt.subplots(figsize=(max(3.0, 1.2 + 0.55 * n), max(3.0, 1.0 + 0.5 * n)))
    ax.imshow(norm, cmap="Blues", vmin=0, vmax=1)
    for i in range(n):
        for j in range(n):
            ax.text(j, i, int(m[i, j]), ha="center", va="center", fontsize=7,
                    color="white" if norm[i, j] > 0.5 else "black")
    ax.set_xticks(range(n))
    ax.set_yticks(range(n))
    font = {"fontsize": 7, **({"fontfamily": family} if family else {})}
    ax.set_xticklabels(shown, rotation=45, ha="right", **font)
    ax.set_yticklabels(shown, **font)
    key = "" if readable else " (class index: the key in report.md)"
    ax.set_xlabel(f"predicted{key}", fontsize=8)
    ax.set_ylabel("true", fontsize=8)
    ax.set_title(title, fontsize=9)
    fig.tight_layout()
    return fig


def _fmt(stat: dict | None) -> str:
    if not stat:
        return "–"
    return f"{stat['mean']:.4f} ± {stat['std']:.4f}" if len(stat.get("values", [])) > 1 else f"{stat['mean']:.4f}"


def _delta(stat: dict | None) -> str:
    if not stat:
        return "–"
    s = f"{stat['mean']:+.4f}"
    if len(stat.get("values", [])) > 1:
        s += f" ± {stat['std']:.4f}"
    if stat.get("ci95"):
        s += f" ({stat['ci95'][0]:+.4f}..{stat['ci95'][1]:+.4f})"
    return s


def _encoder_section(ec: dict, encoders: list[str]) -> list[str]:
    lines = ["## Encoders: masked-word NLL per character on the domain test split", ""]
    if ec.get("skipped"):
        return lines + [f"Not scored: {ec['skipped']}.", ""]
    windows = next((ec[e]["windows"] for e in encoders if e in ec), "?")
    lines += [
        f"Both encoders read the same {windows} windows of up to {ec['window_chars']} characters from "
        f"{ec.get('texts', '?')} test texts, with the same jieba words masked (chosen by seed, not by a tokenizer); "
        "each masks every one of its own tokens that overlaps a chosen word and is scored by the negative "
        "log-likelihood of the gold tokens per masked character. Lower is better. Per-token perplexities of encoders "
        "with different vocabularies are not comparable; these numbers are (see docs/evaluation.md).",
        "",
        "| encoder | NLL / char (nats) | bits / char | masked chars | masked tokens | words |",
        "|---|---|---|---|---|---|",
    ]
    for e in encoders:
        if e in ec:
            r = ec[e]
            lines.append(f"| {e} | {r['nll_per_char']:.4f} | {r['bits_per_char']:.4f} | {r['masked_chars']} | "
                         f"{r['masked_tokens']} | {r['spans']} |")
    if "delta" in ec:
        d = ec["delta"]
        ci = f" (95% CI {d['ci95'][0]:+.4f}..{d['ci95'][1]:+.4f})" if d.get("ci95") else ""
        lines.append(f"| Δ adapted − base | {d['nll_per_char']:+.4f}{ci} | {d['bits_per_char']:+.4f} | | | |")
    if ec.get("verdict"):
        lines += ["", f"**Verdict**: {ec['verdict']}"]
    if ec.get("dropped_windows"):
        lines += ["", f"{ec['dropped_windows']} windows did not fit an encoder and were dropped for both."]
    return lines + [""]


def _recall_section(tasks: dict, encoders: list[str], recalls: dict) -> list[str]:
    """Per-class recall of each encoder's saved model on the test split, for the classification tasks: a class the
    model hardly ever predicts shows here, whatever the averages say."""
    lines: list[str] = []
    for task, per_enc in recalls.items():
        classes = list(next(iter(per_enc.values())))
        if not classes:
            continue
        lines += [f"### {task}", "", "| class | support | " + " | ".join(e for e in encoders if e in per_enc) + " |",
                  "|---|---|" + "---|" * sum(e in per_enc for e in encoders)]
        for c in classes:
            support = next(iter(per_enc.values()))[c]["support"]
            lines.append(f"| {c} | {support} | " + " | ".join(f"{per_enc[e][c]['recall']:.3f}" for e in encoders
                                                             if e in per_enc) + " |")
        lines.append("")
    return (["## Per-class recall (test, saved seed)", ""] + lines) if lines else []


def _search_section(tasks: dict) -> list[str]:
    rows = [(task, enc, s) for task, t in tasks.items() for enc, s in t.get("search", {}).items()]
    if not rows:
        return []
    lines = ["## Hyperparameters chosen on dev", "",
             "Each encoder got the same search space and budget; trials ran on the first seed and were scored on dev "
             "(never test); degenerate trials were discarded. Details and curves: each finetune's metrics.json.", "",
             "| task | encoder | chosen | trials complete / run |", "|---|---|---|---|"]
    for task, enc, s in rows:
        chosen = ", ".join(f"{k} {v}" for k, v in sorted(s["chosen"].items())) or "the given hyperparameters"
        lines.append(f"| {task} | {enc} | {chosen} | {s['complete']} / {s['trials']} |")
    return lines + [""]


def markdown(result: dict, figures: dict[str, list[str]], label_keys: dict[str, list[str]],
             recalls: dict | None = None) -> str:
    encoders = result["encoders"]
    tasks = result["tasks"]
    baselines = _baseline_columns(tasks)
    others = [e for e in encoders if e != "base"] if "base" in encoders else []
    lines = [f"# {' vs '.join(encoders)} encoder{'s' if len(encoders) > 1 else ''}, against baselines", ""]
    lines += [
        f"Every task is finetuned from each encoder with the same data, seeds, search space and budget and scored on "
        f"the **{result['split']}** split (mean ± std over seeds). The baselines are trained on the same train split "
        "and scored on the same examples with the same metric functions. Δ is an encoder − base, paired by seed, "
        "with its 95% bootstrap interval over test examples (and seeds) in brackets; a verdict says \"beats\" only "
        "when the interval excludes 0 and every seed agrees. A degenerate model (one class, no entity, or not above "
        "the majority baseline on dev) gets no Δ. Metrics are in [0, 1]; higher is better.",
        "",
    ]
    head = ["task", "metric", *baselines, *encoders] + [f"Δ {e} − base (95% CI)" for e in others]
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for task, t in tasks.items():
        metrics = [t["primary"]] + sorted({m for e in encoders for m in t.get(e, {})} - {t["primary"]})
        for m in metrics:
            name = f"**{m}**" if m == t["primary"] else m
            row = [task if m == t["primary"] else "", name]
            row += ["–" if _baseline(t, b, m) is None else f"{_baseline(t, b, m):.4f}" for b in baselines]
            row += [("degenerate: " if e in t.get("degenerate", {}) and m == t["primary"] else "")
                    + _fmt(t.get(e, {}).get(m)) for e in encoders]
            row += [_delta(t.get("deltas", {}).get(e, {}).get(m)) for e in others]
            lines.append("| " + " | ".join(row) + " |")
    lines.append("")
    lines += ["## Verdicts", ""] + [f"- **{task}**: {t['verdict']}" for task, t in tasks.items() if t.get("verdict")]
    lines.append("")
    for task, t in tasks.items():
        for e in others:
            d = t.get("deltas", {}).get(e, {}).get(t["primary"])
            if d and len(d["values"]) > 1:
                per = ", ".join(f"seed {s} {v:+.4f}" for s, v in zip(d.get("seeds") or [], d["values"]))
                lines.append(f"- {task}, {e} − base per seed: {per} (spread {min(d['values']):+.4f}.."
                             f"{max(d['values']):+.4f})")
    lines.append("")
    lines += _search_section(tasks)
    lines += _recall_section(tasks, encoders, recalls or {})
    seeds = {task: t.get("seeds") for task, t in tasks.items()}
    lines += [f"Seeds per task: {seeds}. Intervals:", ""]
    lines += [f"- {task}, {e}: {d[t['primary']].get('ci_method')}" for task, t in tasks.items()
              for e, d in t.get("deltas", {}).items() if d.get(t["primary"])]
    lines.append("")
    shas = {task: t["test_sha256"][:12] for task, t in tasks.items() if t.get("test_sha256")}
    if shas:
        lines += [f"Test sets (sha256 of the split file): {shas}.", ""]
    if figures.get("bar"):
        lines += ["![primary metric per task](" + figures["bar"][0] + ")", ""]
    ec = result.get("encoder_comparison") or {}
    if ec:
        lines += _encoder_section(ec, encoders)
    if figures.get("confusion"):
        lines += ["## Confusion matrices (saved seed, rows: true class)", ""]
        for task, keys in label_keys.items():
            lines.append(f"{task}: " + ", ".join(f"{i} = {lab}" for i, lab in enumerate(keys)))
            lines.append("")
        lines += [f"![{p}]({p})" for p in figures["confusion"]] + [""]
    if figures.get("curves"):
        lines += ["## Training curves", ""] + [f"![{p}]({p})" for p in figures["curves"]] + [""]
    return "\n".join(lines)
