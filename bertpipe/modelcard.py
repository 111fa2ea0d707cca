"""A Hugging Face model card (``README.md``, written with ``huggingface_hub.ModelCard``) in every model directory a
stage saves (base, vocab, pretrain, finetune, distill), so the directory is ready to share as Hub users expect:
YAML metadata (language, library, pipeline tag, license, the base model as the user gave it in params.yaml, the
datasets, tags, and the metrics with their values in the Hub's ``model-index`` format) and a body naming the model
it was built from, the data it saw with digests, its evaluation results, the intended use and, where known, the
registry gate's decision. The same call fits the saved tokenizer's length limit to the model's positions
(``bertpipe.modeldir.fit_tokenizer``), so ``pipeline(task, model=dir)(long_text, truncation=True)`` works.

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


def user_base_model(cfg) -> str | None:
    """The base model as the user named it in params.yaml (``model.continue_from`` when set, else ``model.base``): a
    hub id or their own path (relative to the project when inside it), never a work path a stage resolved; None for
    a base trained from scratch by the base stage."""
    from bertpipe.layout import base_is_scratch

    given = cfg.params.model.continue_from.strip() or (None if base_is_scratch(cfg) else cfg.params.model.base.strip())
    if given and cfg.path(given).exists():  # their directory: relative to the project when inside it, so the card
        return _shown(cfg, cfg.path(given))  # (hashed into later stages) is the same wherever the project lives
    return given


def _license(base: str | None, cfg) -> str:
    """The license the user's base model's own card declares (a local directory's README.md), else "other": the
    Hub's value for a license stated elsewhere (the data's terms decide it; edit the card before sharing)."""
    if base:
        readme = cfg.path(base) / "README.md"
        if readme.is_file():
            from huggingface_hub import ModelCard

            try:
                found = ModelCard.load(readme).data.license
            except (ValueError, OSError):
                found = None
            if isinstance(found, str) and found:
                return found
    return "other"


def _is_model(v) -> bool:
    """An input that is a model (a directory with config.json, or a hub id) rather than data."""
    p = Path(v)
    return (p / "config.json").is_file() or (isinstance(v, str) and not p.exists())


def _eval_results(metrics: dict[str, float], task: str, dataset: str):
    """The metrics as Hub ``model-index`` results: ``test_f1`` is metric ``f1`` on the test split."""
    from huggingface_hub import EvalResult

    out = []
    for k, v in sorted(metrics.items()):
        split, _, name = k.partition("_") if k.startswith(("test_", "dev_", "eval_")) else (None, "", k)
        out.append(EvalResult(task_type=task, dataset_type=dataset, dataset_name=dataset, dataset_split=split,
                              metric_type=name, metric_name=k, metric_value=v))
    return out


def write(model_dir: Path, ctx, *, pipeline_tag: str, base_model: str, metrics: dict[str, float] | None = None,
          labels: list[str] | None = None, decision: str | None = None, notes: str = "") -> Path:
    """README.md for ``model_dir`` written by stage ``ctx`` (a bertpipe.stage.StageContext)."""
    from huggingface_hub import ModelCard, ModelCardData

    from bertpipe.modeldir import fit_tokenizer

    fit_tokenizer(Path(model_dir))
    cfg = ctx.cfg
    base_model = _shown(cfg, base_model) if base_model else base_model
    metrics = {k: float(v) for k, v in (metrics or {}).items() if isinstance(v, (int, float)) and v == v}
    given = user_base_model(cfg)
    datasets = [_shown(cfg, v) for _, v in sorted(ctx.inputs.items()) if v is not None and not _is_model(v)]
    data = ModelCardData(language=cfg.params.model.language, library_name="transformers", pipeline_tag=pipeline_tag,
                         license=_license(given, cfg), tags=["bertpipe", ctx.name.split("/")[0]],
                         base_model=given, datasets=datasets or None)
    if metrics:
        data.metrics = sorted(metrics)
        data.model_name = ctx.name.replace("/", "-")
        data.eval_results = _eval_results(metrics, pipeline_tag, datasets[0] if datasets else ctx.name)
    inputs = "\n".join(f"- `{k}`: `{_shown(cfg, v)}` "
                       f"({_digest(Path(v)) if not isinstance(v, str) or '/' in v else 'hub id'})"
                       for k, v in sorted(ctx.inputs.items()) if v is not None)
    results = "\n".join(f"| {k} | {v:.4f} |" for k, v in sorted(metrics.items()))
    body = [f"# {ctx.name}", "",
            f"Built by the bertpipe stage `{ctx.name}` (fingerprint `{ctx.fingerprint[:16]}`, profile "
            f"`{cfg.params.profile or '(none)'}`).", "",
            "## Base model", "", f"Built from `{base_model}`"
            + (f"; the base model as given in params.yaml: `{given}`." if given else
               "; the base encoder was trained from scratch by the base stage."), "",
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
