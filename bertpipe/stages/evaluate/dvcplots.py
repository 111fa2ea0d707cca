"""What `dvc metrics` and `dvc plots` read, under the evaluate output.

The generated dvc.yaml declares one summary metrics file and the image folder (top-level ``metrics:`` and
``plots:``, bertpipe.doors.dvc.dvcfile): the summary holds the few numbers a run is judged by, so `dvc metrics show` is
one short row and `dvc exp show` a column per task, metric and encoder rather than one per interval end and baseline;
`dvc metrics diff` / `dvc plots diff` compare two commits or experiments without knowing bertpipe's nested
metrics.json. The rest is written beside it for whoever wants it, not declared:

    work/evaluate/summary.json                        {"<task>": {"<primary metric>": {"<encoder|delta|delta_x>": v}},
                                                       "encoder": {"bits_per_char": {"<encoder>": v}}}
    work/evaluate/plots/images/confusion_<task>_<enc>.svg   the test confusion matrix, class names on both axes
    work/evaluate/plots/images/curves_<task>_<enc>.png      the finetune's train loss and dev curves
    work/evaluate/metrics/<task>.json                 {"<base|adapted|delta|baseline_x>": {"<metric>": value}}
    work/evaluate/scores.json                         {"<task>.<base|adapted|delta|baseline_x>.<metric>": value, ...}
    work/evaluate/plots/confusion/<task>_<enc>.json   [{"actual": label, "predicted": label}, ...]  (one per example)
    work/evaluate/plots/train_loss/<task>_<enc>.json  [{"step", "loss", "seed"}, ...]
    work/evaluate/plots/dev/<task>_<enc>.json         [{"step", "<primary metric>", "seed"}, ...]

Only images are declared as plots: DVC's HTML loads Vega from a CDN, so its data plots are blank offline, while an
image renders anywhere. The confusion matrices are SVG with their text kept as text (``svg.fonttype: none``): the
viewer's fonts draw the class names, Chinese ones included, where a PNG drawn without a CJK font could only show
indices. The JSON rows stay for whoever wants the data (`dvc plots show work/evaluate/plots/dev/...` with a
network).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

SCORES = "scores.json"
SUMMARY = "summary.json"  # the one metrics file dvc.yaml declares
METRICS = "metrics"
PLOTS = "plots"
IMAGES = "images"  # under PLOTS: the image plots dvc.yaml declares


def _write(path: Path, rows) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(rows, ensure_ascii=False, indent=0) + "\n", encoding="utf-8")


def confusion_rows(labels: list[str], matrix: list[list[int]]) -> list[dict]:
    """The matrix back as one row per example (DVC's confusion template counts rows)."""
    return [{"actual": labels[i], "predicted": labels[j]}
            for i, row in enumerate(matrix) for j, n in enumerate(row) for _ in range(int(n))]


def per_task(flat: dict[str, float]) -> dict[str, dict]:
    """``{"<task>.<part>.<metric>": v}`` as ``{task: {part: {metric: v}}}`` (task names hold no dot)."""
    out: dict[str, dict] = {}
    for key, v in flat.items():
        task, _, rest = key.partition(".")
        part, _, metric = rest.partition(".")
        node = out.setdefault(task, {})
        if metric:
            node.setdefault(part, {})[metric] = v
        else:
            node[part] = v
    return out


def summary(flat: dict[str, float], primary: dict[str, str]) -> dict[str, dict]:
    """The numbers a run is judged by, from the flat scores: each task's primary metric on every encoder and every
    encoder's difference from base (means over seeds; no interval ends, no baselines), and the encoders' bits per
    masked character."""
    out: dict[str, dict] = {}
    for task, parts in per_task(flat).items():
        metric = primary.get(task, "bits_per_char" if task == "encoder" else "")
        row = {part: scores[metric] for part, scores in parts.items()
               if not part.startswith("baseline_") and isinstance(scores, dict) and metric in scores}
        if row:
            out[task] = {metric: row}
    return out


def confusion_svg(path: Path, labels: list[str], matrix: list[list[int]], title: str) -> Path:
    """The report's confusion matrix drawn as SVG, its text kept as text so the viewer's fonts draw every label."""
    import warnings

    from matplotlib import rc_context

    from bertpipe.stages.evaluate.report import confusion_png

    path.parent.mkdir(parents=True, exist_ok=True)
    with rc_context({"svg.fonttype": "none", "svg.hashsalt": "bertpipe"}), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Glyph missing": the layout font lacks CJK; the SVG viewer's has it
        return confusion_png(path, labels, matrix, title, names=True)


def write(out: Path, flat: dict[str, float], primary: dict[str, str], confusions: dict[str, tuple[list, list]],
          curve_dirs: dict[str, Path]):
    """``flat``: the scores; ``primary``: task -> its primary metric; ``confusions``: name -> (labels, matrix);
    ``curve_dirs``: name -> finetune output."""
    (out / SCORES).write_text(json.dumps(flat, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    (out / SUMMARY).write_text(json.dumps(summary(flat, primary), indent=1, sort_keys=True) + "\n", encoding="utf-8")
    for task, scores in per_task(flat).items():
        _write(out / METRICS / f"{task}.json", scores)
    for name, (labels, matrix) in sorted(confusions.items()):
        _write(out / PLOTS / "confusion" / f"{name}.json", confusion_rows(labels, matrix))
        confusion_svg(out / PLOTS / IMAGES / f"confusion_{name}.svg", labels, matrix, f"{name} (test)")
    for name, d in sorted(curve_dirs.items()):
        if (Path(d) / "curves.png").is_file():
            shutil.copy(Path(d) / "curves.png", out / PLOTS / IMAGES / f"curves_{name}.png")
        f = Path(d) / "curves.json"
        if not f.is_file():  # a finetune output from before curves.json existed
            continue
        curves = json.loads(f.read_text(encoding="utf-8"))
        for kind in ("train_loss", "dev"):
            if curves.get(kind):
                _write(out / PLOTS / kind / f"{name}.json", curves[kind])
