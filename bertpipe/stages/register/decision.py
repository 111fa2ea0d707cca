"""What a person reads about a register decision: the lineage kept as version tags, what changed upstream since the
champion, the decision report (work/register/decision.md and each version's description), and the end-of-run
summary lines."""

from __future__ import annotations

import json
from pathlib import Path

from bertpipe.core.stage import read_manifest

LINEAGE_PREFIX = "bertpipe.lib.lineage."
# (tag key, words) in upstream order; the values are fingerprints (code: the git commit).
LINEAGE = (("data", "data (prepare)"), ("task_data", "task data"), ("vocab", "vocabulary"),
           ("encoder", "encoder (pretrain)"), ("finetune", "finetune"), ("code", "code (git commit)"))


def lineage(cfg, ft_dir: Path | None, task_data: str | None) -> dict[str, str]:
    """This candidate's upstream fingerprints, stored as version tags so a later run can say what changed."""
    from bertpipe.infra.tracking import git_commit

    def fp(path: Path) -> str:
        return (read_manifest(path) or {}).get("fingerprint", "")

    out = {"data": fp(cfg.work / "prepare"), "vocab": fp(cfg.work / "vocab"), "encoder": fp(cfg.work / "pretrain"),
           "code": git_commit(cfg.root)}
    if ft_dir is not None:
        out["finetune"] = fp(ft_dir)
        out["task_data"] = task_data or ""
    return {k: v for k, v in out.items() if v}


def upstream_changes(candidate: dict[str, str], champion_tags: dict | None) -> list[str]:
    """One phrase per lineage item: changed (old -> new), unchanged, or unknown for the champion."""
    if champion_tags is None:
        return []
    out = []
    for key, words in LINEAGE:
        new, old = candidate.get(key), champion_tags.get(LINEAGE_PREFIX + key)
        if new is None:
            continue
        if old is None:
            out.append(f"{words}: not recorded for the champion")
        elif old == new:
            out.append(f"{words}: unchanged")
        else:
            out.append(f"{words}: changed ({old[:12]} -> {new[:12]})")
    return out


def _num(v) -> str:
    return "n/a" if v is None else f"{v:.4f}"


def model_section(rec: dict) -> str:
    """The decision for one model, as markdown (decision.md and the version's description share it)."""
    head = f"## {rec['name']}"
    if not rec.get("registered", True):
        return f"{head}\n\nNot registered: {rec['reason']}\n"
    state = "champion" if rec["promoted"] or rec.get("stays_champion") else "challenger"
    made = "already registered with this content, reused" if rec.get("reused") else "new version"
    lines = [f"{head} v{rec['version']} ({made}) -> {state}", ""]
    changes = rec.get("upstream_changes") or []
    champ = rec.get("champion_before")
    if champ is None:
        lines.append("- Upstream: no champion before this decision")
    elif rec.get("stays_champion"):
        lines.append(f"- Upstream: this version is the champion (v{champ}); nothing to compare")
    else:
        lines.append(f"- Upstream since champion v{champ}: " + ("; ".join(changes) or "nothing recorded"))
    lines.append(f"- Test set: {rec.get('test_set', '')}")
    if champ is not None and not rec.get("stays_champion"):
        how = "re-scored on this test set" if rec.get("champion_rescored") else "its recorded score on this test set"
        # Rounded as the registry records scores (and + 0.0 turns -0.0 into 0.0): a tie reads as +0.0000.
        delta = (round(rec["value"] - rec["champion_value"], 6) + 0.0 if rec.get("champion_value") is not None
                 else None)
        ci = rec.get("ci95")
        interval = f"95% interval [{ci[0]:+.4f}, {ci[1]:+.4f}]" if ci else f"interval: n/a ({rec.get('ci_note', '')})"
        lines.append(f"- Challenger {rec['metric']} {_num(rec['value'])} vs champion v{champ} "
                     f"{_num(rec.get('champion_value'))} ({how}): difference "
                     f"{'n/a' if delta is None else f'{delta:+.4f}'}, {interval}")
    else:
        lines.append(f"- Score: {rec['metric']} {_num(rec['value'])} ({rec.get('score_source', '')})")
    lines.append(f"- Floor: {rec.get('floor', '')}")
    lines.append(f"- Decision: {rec['decision']}")
    return "\n".join(lines) + "\n"


def report(records: list[dict]) -> str:
    body = "\n".join(model_section(r) for r in records)
    return ("# Register decisions\n\nPer model: what changed upstream since the champion, challenger vs champion on "
            "the same test set, the floor, and the decision with its reason.\n\n" + body)


def summary_lines(registry_json_path: Path | str) -> list[str]:
    """Plain end-of-run lines from work/register/registry.json (empty when there is none)."""
    try:
        reg = json.loads(Path(registry_json_path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return []
    out = []
    for m in reg.get("models", []):
        if not m.get("registered", True):
            out.append(f"not registered: {m['name']} ({m['reason']})")
            continue
        aliases = ",".join(m.get("aliases", [])) or "-"
        if m.get("below_floor"):
            what = f"BELOW THE FLOOR, not champion: {m['reason']}"
        elif m.get("promoted"):
            what = f"new champion: {m['reason']}"
        elif m.get("stays_champion"):
            what = "already the champion (same content)"
        else:
            what = f"not promoted: {m['reason']}"
        reused = ", existing version reused" if m.get("reused") else ""
        out.append(f"registered: {m['name']} version {m['version']} aliases [{aliases}]{reused} - {what}")
    return out
