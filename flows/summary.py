"""The end-of-run summary every door prints: per stage what actually happened, then where to look.

    built    the stage ran and wrote its output
    cached   its output was already fresh (Prefect reported Cached, or the fingerprint matched): nothing ran
    skipped  not run in this invocation (e.g. after `--until`)

Imports neither Prefect nor torch, so the per-stage CLI commands use it too.
"""

from __future__ import annotations

from typing import Any

STATUSES = ("built", "cached", "skipped")


def status_of(result: dict) -> str:
    """A stage result's status: built, cached or skipped (a result that names none of them was built)."""
    return result["status"] if result.get("status") in STATUSES else "built"


def stage_line(name: str, status: str, out: Any) -> str:
    return f"{name:40s} {status:8s} {out}"


def registry_lines(cfg) -> list[str]:
    """What the register stage did, decision included (new champion, below the floor, not promoted and why): the
    register stage's own lines (``bertpipe.stages.register.decision.summary_lines``), so the two never drift."""
    from bertpipe.stages.register.decision import summary_lines

    return summary_lines(cfg.work / "register" / "registry.json")


def summary(results: dict[str, dict], cfg) -> str:
    """What a person wants at the end: per stage built / cached / skipped, the report, the registry, the UI."""
    from bertpipe.infra.tracking import display_uri, tracking_uri

    lines = [stage_line(name, status_of(r), r.get("out", "")) for name, r in results.items()]
    counts = {s: sum(status_of(r) == s for r in results.values()) for s in STATUSES}
    lines.append(", ".join(f"{n} {s}" for s, n in counts.items()))
    # The report and the registry's lines belong to this run only when its evaluate / register stage was part of it
    # (built or found fresh): a `--until tasks` run names no report or version an earlier run left.
    ran = {name for name, r in results.items() if status_of(r) != "skipped"}
    report = cfg.work / "evaluate" / "report.md"
    if "evaluate" in ran and report.exists():
        lines.append(f"report: {report}")
    if "register" in ran:
        lines += registry_lines(cfg)
    lines.append(f"browse: mlflow ui --backend-store-uri {display_uri(tracking_uri(cfg))} --host 127.0.0.1 --port 5000")
    return "\n".join(lines)
