"""What `dvc metrics` and `dvc plots` read: a flat scores file and row-per-point plot files under the evaluate output.

The generated dvc.yaml declares them (top-level ``metrics:`` and ``plots:``, bertpipe.dvcfile), so `dvc metrics
diff` and `dvc plots diff` compare two commits or experiments without knowing bertpipe's nested metrics.json:

    work/evaluate/scores.json                         {"<task>.<base|adapted|delta|baseline_x>.<metric>": value, ...}
    work/evaluate/plots/confusion/<task>_<enc>.json   [{"actual": label, "predicted": label}, ...]  (one per example)
    work/evaluate/plots/train_loss/<task>_<enc>.json  [{"step", "loss", "seed"}, ...]
    work/evaluate/plots/dev/<task>_<enc>.json         [{"step", "<primary metric>", "seed"}, ...]
"""

from __future__ import annotations

import json
from pathlib import Path

SCORES = "scores.json"
PLOTS = "plots"
# (folder, dvc.yaml plot properties); the dev folder's y is each task's primary metric, so DVC picks the last column
PLOT_DIRS = {
    "confusion": {"template": "confusion", "x": "predicted", "y": "actual", "title": "test confusion (rows: true)"},
    "train_loss": {"x": "step", "y": "loss", "title": "finetune train loss"},
    "dev": {"x": "step", "title": "finetune dev primary metric"},
}


def _write(path: Path, rows) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(rows, ensure_ascii=False, indent=0) + "\n", encoding="utf-8")


def confusion_rows(labels: list[str], matrix: list[list[int]]) -> list[dict]:
    """The matrix back as one row per example (DVC's confusion template counts rows)."""
    return [{"actual": labels[i], "predicted": labels[j]}
            for i, row in enumerate(matrix) for j, n in enumerate(row) for _ in range(int(n))]


def write(out: Path, flat: dict[str, float], confusions: dict[str, tuple[list, list]], curve_dirs: dict[str, Path]):
    """``flat``: the scores; ``confusions``: name -> (labels, matrix); ``curve_dirs``: name -> finetune output."""
    (out / SCORES).write_text(json.dumps(flat, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    for name, (labels, matrix) in sorted(confusions.items()):
        _write(out / PLOTS / "confusion" / f"{name}.json", confusion_rows(labels, matrix))
    for name, d in sorted(curve_dirs.items()):
        f = Path(d) / "curves.json"
        if not f.is_file():  # a finetune output from before curves.json existed
            continue
        curves = json.loads(f.read_text(encoding="utf-8"))
        for kind in ("train_loss", "dev"):
            if curves.get(kind):
                _write(out / PLOTS / kind / f"{name}.json", curves[kind])
