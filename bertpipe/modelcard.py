"""A Hugging Face model card (``README.md``, written with ``huggingface_hub.ModelCard``) in every model directory a
stage saves (base, vocab, pretrain, finetune, distill), so the directory is ready to share as Hub users expect:
YAML metadata (language, library, pipeline tag, base model, tags, metrics) and a body naming the base model, the
data it saw with digests, its evaluation results, the intended use and, where known, the registry gate's decision.

The card is written inside the stage's temp output, next to config.json, so the stage's manifest lists it like any
file it wrote; ``transformers.pipeline()`` ignores it.
"""

from __future__ import annotations

import json
from pathlib import Path

USES = {
    "fill-mask": "A domain-adapted encoder: fill-mask as is, or the starting point for finetuning on domain tasks.",
    "text-classification": "Classifying texts of the domain it was finetuned on into the labels below.",
    "token-classification": "Tagging entities in texts of the domain it was finetuned on (the labels below).",
    "question-answering": "Extractive question answering over passages of the domain it was finetuned on.",
}


def _digest(path: Path) -> str:
    """The content identity of a stage input: its producing stage's fingerprint (the nearest manifest.json), a task
    split's sha256 (splits.json), or "file" for a raw file (the stage fingerprint covers its content)."""
    p = Path(path)
    s = p / "splits.json"
    if s.is_file():
        splits = json.loads(s.read_text(encoding="utf-8")).get("splits", {})
        return ", ".join(f"{k} sha256 {v['sha256'][:16]}" for k, v in splits.items() if v.get("sha256"))
    for d in (p, *list(p.parents)[:2]):
        m = d / "manifest.json"
        if m.is_file():
            try:
                return "stage fingerprint " + json.loads(m.read_text(encoding="utf-8"))["fingerprint"][:16]
            except (ValueError, KeyError, OSError):
                break
    return "file" if p.exists() else "hub id"


def _shown(cfg, v) -> str:
    """A path as the card shows it: relative to the project when it lies inside (so the card, which downstream
    stages hash with the model dir, is the same in every clone of a project), else as given (a hub id, a path
    outside)."""
    try:
        return str(Path(v).resolve().relative_to(Path(cfg.root).resolve()))
    except (ValueError, OSError, TypeError):
        return str(v)


def write(model_dir: Path, ctx, *, pipeline_tag: str, base_model: str, metrics: dict[str, float] | None = None,
          labels: list[str] | None = None, decision: str | None = None, notes: str = "") -> Path:
    """README.md for ``model_dir`` written by stage ``ctx`` (a bertpipe.stage.StageContext)."""
    from huggingface_hub import ModelCard, ModelCardData

    cfg = ctx.cfg
    base_model = _shown(cfg, base_model) if base_model else base_model
    metrics = {k: float(v) for k, v in (metrics or {}).items() if isinstance(v, (int, float))}
    data = ModelCardData(language=cfg.params.model.language, library_name="transformers", pipeline_tag=pipeline_tag,
                         tags=["bertpipe", ctx.name.split("/")[0]], base_model=base_model or None)
    if metrics:
        data.metrics = sorted(metrics)
    inputs = "\n".join(f"- `{k}`: `{_shown(cfg, v)}` "
                       f"({_digest(Path(v)) if not isinstance(v, str) or '/' in v else 'hub id'})"
                       for k, v in sorted(ctx.inputs.items()) if v is not None)
    results = "\n".join(f"| {k} | {v:.4f} |" for k, v in sorted(metrics.items()))
    body = [f"# {ctx.name}", "",
            f"Built by the bertpipe stage `{ctx.name}` (fingerprint `{ctx.fingerprint[:16]}`, profile "
            f"`{cfg.params.profile or '(none)'}`).", "",
            "## Base model", "", f"`{base_model}`", "",
            "## Intended use", "", USES.get(pipeline_tag, pipeline_tag), ""]
    if labels:
        body += [f"Labels: {', '.join(f'`{lab}`' for lab in labels)}.", ""]
    body += ["Limits: trained on the data below only; check it on your own held-out data before relying on it.", "",
             "## Data", "", inputs or "(none)", ""]
    body += ["## Evaluation", ""] + (["| metric | value |", "|---|---|", results] if results else
                                     ["Not evaluated by this stage (see the evaluate stage's report)."]) + [""]
    body += ["## Registry decision", "", decision or "Not known when this directory was written: the register "
             "stage records the gate's decision on the registered version (its MLflow description).", ""]
    if notes:
        body += [notes, ""]
    body += ["## How to load", "", "```python", "from transformers import pipeline",
             f'pipe = pipeline("{pipeline_tag}", model="path/to/this/dir")', "```", ""]
    card = ModelCard(f"---\n{data.to_yaml()}\n---\n\n" + "\n".join(body))
    path = Path(model_dir) / "README.md"
    card.save(path)
    return path
