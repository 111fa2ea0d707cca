"""A registered version's model card (its MLflow description) and what the transformers flavor needs to log it."""

from __future__ import annotations

import json
from pathlib import Path

from bertpipe.core.stage import read_manifest
from bertpipe.infra.errors import BertpipeError
from bertpipe.lib.training.heads import pipeline_task_of


def pipeline_task(model_dir: Path) -> str:
    try:
        arch = (json.loads((model_dir / "config.json").read_text()).get("architectures") or [""])[0]
    except (OSError, ValueError) as e:
        raise BertpipeError(f"{model_dir}/config.json: not a readable model config ({e})") from None
    task = pipeline_task_of(arch)
    if task is not None:
        return task
    raise BertpipeError(f"{model_dir}/config.json: architecture {arch!r} has no pipeline task bertpipe can register")


def input_example(task: str, language: str, mask_token: str = "[MASK]"):
    """A small input the registered model answers (its MLmodel example); fill-mask's holds the model's own mask
    token (``<mask>`` for RoBERTa-style tokenizers)."""
    text = "本法所称的发明创造是指发明、实用新型和外观设计。" if language == "zh" else "The court shall hear the case."
    if task == "question-answering":
        q = "发明创造是指什么？" if language == "zh" else "What shall the court do?"
        return {"question": q, "context": text}
    if task == "fill-mask":
        return [text[:6] + mask_token + text[7:]]
    return [text]


def eval_table(evaluate_dir: Path, task: str | None) -> str:
    """Baselines | base | adapted for one task (or all) from work/evaluate/metrics.json, as markdown."""
    try:
        ev = json.loads((evaluate_dir / "metrics.json").read_text())
    except (OSError, ValueError):
        return ""
    lines = ["| task | metric | baselines | base | adapted | delta |", "|---|---|---|---|---|---|"]
    for t, res in (ev.get("tasks") or {}).items():
        if task and t != task:
            continue
        for metric, base in (res.get("base") or {}).items():
            ad = (res.get("adapted") or {}).get(metric)
            if not isinstance(base, dict) or not isinstance(ad, dict):
                continue
            bl = ", ".join(f"{k} {v[metric]:.4f}" for k, v in (res.get("baselines") or {}).items()
                           if isinstance(v, dict) and isinstance(v.get(metric), (int, float))) or "-"
            lines.append(f"| {t} | {metric} | {bl} | {base.get('mean', float('nan')):.4f} ± {base.get('std', 0):.4f} "
                         f"| {ad.get('mean', float('nan')):.4f} ± {ad.get('std', 0):.4f} | "
                         f"{ad.get('mean', 0) - base.get('mean', 0):+.4f} |")
    return "\n".join(lines) if len(lines) > 2 else ""


def card_lineage(cfg, ft_dir: Path | None) -> dict:
    from bertpipe.infra.tracking import git_commit

    out = {"git commit": git_commit(cfg.root) or "(not a git checkout)", "base model": cfg.params.model.base,
           "profile": cfg.params.profile or "(none)"}
    for stage in ("prepare", "base", "vocab", "pretrain", "evaluate"):
        m = read_manifest(cfg.work / stage)
        if m:
            out[f"{stage} fingerprint"] = m["fingerprint"]
    if ft_dir is not None and read_manifest(ft_dir):
        out["finetune fingerprint"] = read_manifest(ft_dir)["fingerprint"]
    sources = cfg.raw / "SOURCES.json"
    if sources.exists():
        for name, rec in json.loads(sources.read_text()).items():
            out[f"data {name}"] = rec.get("package", "")
    dvc_file = cfg.raw.with_suffix(".dvc") if cfg.raw.name else None
    if dvc_file is not None and dvc_file.exists():
        for line in dvc_file.read_text().splitlines():
            if "md5:" in line:
                out["data DVC md5"] = line.split("md5:")[1].strip()
                break
    return out


def model_card(name: str, task: str, metric: str, value: float, lineage: dict, table: str, decision_md: str) -> str:
    rows = "\n".join(f"| {k} | `{v}` |" for k, v in lineage.items())
    return (
        f"# {name}\n\nbertpipe {task} model. Primary test metric (the registered seed's own) "
        f"**{metric} = {value:.4f}**.\n\n## Decision\n\n{decision_md}\n\n## Baselines, base vs adapted\n\n"
        f"{table or '(no evaluate report)'}\n\n## Lineage\n\n| what | value |\n|---|---|\n{rows}\n"
    )


def registered_description(name: str, pipeline_task: str, task: str | None) -> str:
    """The registered model's own description (versions carry their card and decision)."""
    what = f"the finetuned `{task}` model ({pipeline_task})" if task else "the domain-adapted encoder (fill-mask)"
    return (f"{name}: {what} built by bertpipe. Alias `champion` is the version serving should use, `challenger` "
            "the latest candidate; each version's description holds its evaluation, lineage and the gate's "
            "decision, and its source run is the run that trained it (params, curves, datasets).")
