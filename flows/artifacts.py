"""What a flow run shows in the Prefect UI besides its logs: artifacts (Prefect 3 ``prefect.artifacts``).

- ``stages``: a table, one row per stage: built / cached / skipped / failed, fingerprint, output;
- ``evaluation-report``: the evaluate stage's report.md (base vs adapted vs baselines, intervals, verdicts);
- ``registry-decisions``: the register stage's decision.md (each challenger against its champion and the floor);
- ``stage-progress``: a progress artifact the flow moves as its stages finish.

Keys are stable, so the UI groups every run's artifacts of one kind under one key. Each is best effort: once the
Prefect API stops answering none is asked for again (``lost_api``), and the stages go on. Images are referenced relative to
the report and do not resolve in the UI; the tables carry the numbers.
"""

from __future__ import annotations

import re
from pathlib import Path

from prefect.artifacts import create_markdown_artifact, create_progress_artifact, create_table_artifact, \
    update_progress_artifact

from .lost_api import best_effort
from .summary import status_of

MAX_MD = 200_000  # keep one artifact within what the API stores comfortably


def _md(path: Path) -> str | None:
    if not path.is_file():
        return None
    text = path.read_text(encoding="utf-8")
    text = re.sub(r"!\[[^\]]*\]\([^)]*\)\n?", "", text)  # figures: files beside the report, not in the UI
    return text[:MAX_MD]


def publish(results: dict[str, dict], cfg) -> None:
    """The stage table, and the report and decisions of the stages that produced them in this run's graph."""
    rows = [{"stage": n, "status": r.get("status") or status_of(r), "fingerprint": (r.get("fingerprint") or "")[:12],
             "output": str(r.get("out", ""))} for n, r in results.items()]
    best_effort(create_table_artifact, rows, key="stages", description="What each stage did in this run (bertpipe)")
    for stage, key, title in (("evaluate", "evaluation-report", "Evaluation report"),
                              ("register", "registry-decisions", "Registry decisions")):
        r = results.get(stage)
        if not r or r.get("status") not in ("built", "cached"):
            continue
        md = _md(Path(r["out"]) / ("report.md" if stage == "evaluate" else "decision.md"))
        if md:
            best_effort(create_markdown_artifact, md, key=key, description=f"{title} ({r['out']})")


class Progress:
    """The share of the run's stages that have finished, as a Prefect progress artifact."""

    def __init__(self, total: int):
        self.total, self.done = max(1, total), 0
        self.id = best_effort(create_progress_artifact, 0.0, key="stage-progress",
                              description=f"stages finished of {total}")

    def step(self, name: str) -> None:
        self.done += 1
        if self.id is not None:
            best_effort(update_progress_artifact, self.id, 100.0 * self.done / self.total,
                        description=f"{self.done}/{self.total} stages finished (last: {name})")
