"""The base-vs-adapted report: comparison table (mean ± std over seeds, difference), bar chart, confusion matrices."""

from __future__ import annotations

from pathlib import Path


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def bar_chart(path: Path, tasks: dict, encoders: list[str]) -> Path:
    """Each task's primary metric per encoder, with the std over seeds as error bars."""
    plt = _plt()
    names = list(tasks)
    fig, ax = plt.subplots(figsize=(max(4.0, 1.6 * len(names) + 1.5), 3.6))
    width = 0.8 / max(len(encoders), 1)
    for j, enc in enumerate(encoders):
        means = [tasks[t].get(enc, {}).get(tasks[t]["primary"], {}).get("mean", 0.0) for t in names]
        stds = [tasks[t].get(enc, {}).get(tasks[t]["primary"], {}).get("std", 0.0) for t in names]
        xs = [i + (j - (len(encoders) - 1) / 2) * width for i in range(len(names))]
        bars = ax.bar(xs, means, width, yerr=stds, capsize=3, label=enc)
        for b, m in zip(bars, means):
            ax.text(b.get_x() + b.get_width() / 2, m, f"{m:.3f}", ha="center", va="bottom", fontsize=7)
    ax.set_xticks(range(len(names)))
    ax.set_xticklabels([f"{t}\n({tasks[t]['primary']})" for t in names], fontsize=8)
    ax.set_ylim(0, 1.08)
    ax.set_title("primary metric, mean ± std over seeds")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def confusion_png(path: Path, labels: list[str], matrix: list[list[int]], title: str) -> Path:
    """Row-normalised confusion matrix (recall per true class) with the counts written in the cells."""
    import numpy as np

    plt = _plt()
    from matplotlib import font_manager

    # Chinese labels need a CJK font; without one, label indices keep the picture readable.
    has_cjk = any("CJK" in f.name or "Noto Sans SC" in f.name for f in font_manager.fontManager.ttflist)
    shown = labels if has_cjk or all(lab.isascii() for lab in labels) else [str(i) for i in range(len(labels))]
    m = np.asarray(matrix, dtype=float)
    norm = m / np.maximum(m.sum(axis=1, keepdims=True), 1)
    n = len(labels)
    fig, ax = plt.subplots(figsize=(1.2 + 0.55 * n, 1.0 + 0.5 * n))
    ax.imshow(norm, cmap="Blues", vmin=0, vmax=1)
    for i in range(n):
        for j in range(n):
            ax.text(j, i, int(m[i, j]), ha="center", va="center", fontsize=7,
                    color="white" if norm[i, j] > 0.5 else "black")
    ax.set_xticks(range(n))
    ax.set_yticks(range(n))
    ax.set_xticklabels(shown, rotation=45, ha="right", fontsize=7)
    ax.set_yticklabels(shown, fontsize=7)
    ax.set(xlabel="predicted", ylabel="true", title=title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _fmt(stat: dict | None) -> str:
    if not stat:
        return "–"
    return f"{stat['mean']:.4f} ± {stat['std']:.4f}" if len(stat.get("values", [])) > 1 else f"{stat['mean']:.4f}"


def _delta(stat: dict | None) -> str:
    if not stat:
        return "–"
    s = f"{stat['mean']:+.4f}"
    return s + (f" ± {stat['std']:.4f}" if len(stat.get("values", [])) > 1 else "")


def markdown(result: dict, figures: dict[str, list[str]], label_keys: dict[str, list[str]]) -> str:
    encoders = result["encoders"]
    lines = ["# Base vs adapted encoder", ""]
    lines += [
        f"Every task is finetuned from each encoder with the same data, seeds and hyperparameters; the table shows the "
        f"**{result['split']}** split, mean ± std over seeds, and the difference adapted − base (paired by seed). "
        "Metrics are in [0, 1]; higher is better.",
        "",
    ]
    head = ["task", "metric", *encoders] + (["Δ adapted − base"] if len(encoders) == 2 else [])
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for task, t in result["tasks"].items():
        metrics = [t["primary"]] + sorted({m for e in encoders for m in t.get(e, {})} - {t["primary"]})
        for m in metrics:
            name = f"**{m}**" if m == t["primary"] else m
            row = [task if m == t["primary"] else "", name] + [_fmt(t.get(e, {}).get(m)) for e in encoders]
            if len(encoders) == 2:
                row.append(_delta(t.get("delta", {}).get(m)))
            lines.append("| " + " | ".join(row) + " |")
    lines.append("")
    seeds = {task: t.get("seeds") for task, t in result["tasks"].items()}
    lines += [f"Seeds per task: {seeds}.", ""]
    if figures.get("bar"):
        lines += ["![primary metric per task](" + figures["bar"][0] + ")", ""]
    mlm = result.get("mlm") or {}
    if mlm:
        lines += ["## Masked-LM perplexity on the held-out domain split", "",
                  "| encoder | perplexity | loss | masked tokens |", "|---|---|---|---|"]
        for e in encoders:
            if e in mlm:
                r = mlm[e]
                lines.append(f"| {e} | {r['perplexity']:.2f} | {r['loss']:.4f} | {r['masked_tokens']} |")
        if "delta" in mlm:
            lines.append(f"| Δ adapted − base | {mlm['delta']['perplexity']:+.2f} | {mlm['delta']['loss']:+.4f} | |")
        if mlm.get("note"):
            lines += ["", mlm["note"]]
        lines.append("")
    if figures.get("confusion"):
        lines += ["## Confusion matrices (best seed, rows: true class)", ""]
        for task, keys in label_keys.items():
            lines.append(f"{task}: " + ", ".join(f"{i} = {lab}" for i, lab in enumerate(keys)))
            lines.append("")
        lines += [f"![{p}]({p})" for p in figures["confusion"]] + [""]
    if figures.get("curves"):
        lines += ["## Training curves", ""] + [f"![{p}]({p})" for p in figures["curves"]] + [""]
    return "\n".join(lines)
