"""A Hugging Face model card (``README.md``, written with ``huggingface_hub.ModelCard``) in every model directory a
stage saves (base, vocab, pretrain, finetune, distill), so the directory is ready to share as Hub users expect:
YAML metadata (language, library, pipeline tag, license, the base model as the user gave it in params.yaml, the
datasets, tags, and the metrics with their values in the Hub's ``model-index`` format) and a body naming the model
it was built from, the data it saw with digests, its evaluation results, the intended use and, where known, the
registry gate's decision. The same call fits the saved tokenizer's length limit to the model's positions
(``bertpipe.lib.modeldir.fit_tokenizer``), so ``pipeline(task, model=dir)(long_text, truncation=True)`` works.

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
    from bertpipe.lib.layout import base_is_scratch

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


LICENSE_FILE = "LICENSE.md"


def _license_file(model_dir: Path, base: str | None) -> None:
    """What ``license: other`` links to when no license is known: who decides it."""
    came = f"the base model `{base}` and " if base else ""
    (Path(model_dir) / LICENSE_FILE).write_text(
        "# License: not stated\n\nbertpipe does not know the terms of this model: they follow from " + came
        + "the data it was trained on (see README.md). State them (the `license` field of README.md's metadata, a "
        "Hub license id, and this file) before sharing the model.\n", encoding="utf-8")


def _is_model(v) -> bool:
    """An input that is a model (a directory with config.json, or a hub id) rather than data."""
    p = Path(v)
    return (p / "config.json").is_file() or (isinstance(v, str) and not p.exists())


def _dataset_id(v) -> str:
    """A data input as the card's ``datasets`` and model-index ``dataset.type`` name it: the task (its split
    directory's name) or the corpus (``domain``, ``general``, a file's name), never a local path."""
    return Path(v).name


def _eval_results(metrics: dict[str, float], task: str, dataset: str, dataset_name: str):
    """The metrics as Hub ``model-index`` results: ``test_f1`` is metric ``f1`` on the test split. ``dataset``: its
    id (``dataset.type``); ``dataset_name``: the free-text name, where the data's path may be shown."""
    from huggingface_hub import EvalResult

    out = []
    for k, v in sorted(metrics.items()):
        split, _, name = k.partition("_") if k.startswith(("test_", "dev_", "eval_")) else (None, "", k)
        out.append(EvalResult(task_type=task, dataset_type=dataset, dataset_name=dataset_name, dataset_split=split,
                              metric_type=name, metric_name=k, metric_value=v))
    return out


def _classify_snippet(task, max_seq_len: int) -> list[str]:
    """A long text read as training and serving read it (``bertpipe.lib.training.features``): the task's truncation
    (head, tail, head_tail with ``head_tokens``) or windows every ``stride`` pieces with their logits aggregated."""
    how = task.truncation
    keep = {"tail": ["    return [ids[-budget:]]"],
            "head_tail": [f"    head = min({task.head_tokens}, budget)  # the first {task.head_tokens} pieces and the "
                          "last ones",
                          "    return [ids if len(ids) <= budget else ids[:head] + ids[len(ids) - (budget - head):]]"],
            "window": [f"    stride = max(1, min({task.stride}, budget))  # a window every stride pieces",
                       "    out, start = [], 0", "    while True:", "        out.append(ids[start:start + budget])",
                       "        if start + budget >= len(ids):", "            return out", "        start += stride"],
            }.get(how, ["    return [ids[:budget]]"])
    pick = (["    votes = torch.bincount(logits.argmax(-1), minlength=logits.shape[-1]).double()",
             "    span = float(mean.max() - mean.min()) or 1.0",
             "    k = int((votes + 0.5 * (mean - mean.min()) / span).argmax())  # a vote; ties: the mean logits"]
            if how == "window" and task.window_aggregate == "vote" else ["    k = int(mean.argmax())"])
    return ["import torch", "from transformers import AutoModelForSequenceClassification, AutoTokenizer", "",
            'path = "path/to/this/dir"', "tok = AutoTokenizer.from_pretrained(path)",
            "model = AutoModelForSequenceClassification.from_pretrained(path).eval()", "", "",
            "def windows(ids: list[int]) -> list[list[int]]:",
            f'    """The pieces the model reads, as it was trained: {max_seq_len} tokens with the special ones; a '
            f'longer text: {how}."""',
            f"    budget = {max_seq_len} - tok.num_special_tokens_to_add()", *keep, "", "",
            "def classify(text: str) -> dict:",
            '    ids = tok(text, add_special_tokens=False)["input_ids"]',
            "    with torch.no_grad():",
            "        logits = torch.cat([model(torch.tensor([[tok.cls_token_id, *w, tok.sep_token_id]])).logits",
            "                            for w in windows(ids)])",
            "    mean = logits.mean(0)", *pick,
            '    return {"label": model.config.id2label[k], "score": float(mean.softmax(-1)[k])}', "", "",
            'print(classify("' + "很长的文本。" * 3 + '"))']


def _qa_snippet(task, max_seq_len: int) -> list[str]:
    """The best answer span over overlapping windows of a long context, scored as serving scores it
    (``bertpipe.lib.inference.predictor``: start and end log-probabilities over each window's context)."""
    overlap = max(0, min(task.doc_stride, max_seq_len - task.max_query_len - 4))  # as bertpipe.lib.training.qa
    return ["import torch", "from transformers import AutoModelForQuestionAnswering, AutoTokenizer", "",
            'path = "path/to/this/dir"', "tok = AutoTokenizer.from_pretrained(path)",
            "model = AutoModelForQuestionAnswering.from_pretrained(path).eval()", "", "",
            "def answer(question: str, context: str) -> dict:",
            f'    """As trained: windows of {max_seq_len} tokens over the context, overlapping by {overlap}; '
            f'answers of at most {task.max_answer_len} tokens."""',
            f'    enc = tok(question, context, truncation="only_second", max_length={max_seq_len}, stride={overlap}, '
            "padding=True,",
            '              return_overflowing_tokens=True, return_offsets_mapping=True, return_tensors="pt")',
            '    offsets = enc.pop("offset_mapping").tolist()', '    enc.pop("overflow_to_sample_mapping")',
            "    with torch.no_grad():", "        out = model(**enc)",
            '    best = {"answer": "", "score": 0.0, "start": -1, "end": -1}',
            "    for w in range(len(offsets)):",
            "        ctx = torch.tensor([s == 1 for s in enc.sequence_ids(w)])",
            "        start = out.start_logits[w].masked_fill(~ctx, -1e9).log_softmax(-1)",
            "        end = out.end_logits[w].masked_fill(~ctx, -1e9).log_softmax(-1)",
            "        for i in ctx.nonzero().flatten().tolist():",
            f"            j = i + int(end[i:i + {task.max_answer_len}].argmax())",
            "            score = float((start[i] + end[j]).exp())",
            '            if score > best["score"]:',
            "                a, b = offsets[w][i][0], offsets[w][j][1]",
            '                best = {"answer": context[a:b], "score": score, "start": a, "end": b}',
            "    return best", "", "",
            'print(answer("什么？", "' + "很长的段落。" * 3 + '"))']


def how_to_load(pipeline_tag: str, task=None, max_seq_len: int | None = None) -> list[str]:
    """The card's "How to load" code, reading a text past the model's length as training and serving do. ``task``:
    a finetuned model's task settings (``bertpipe.lib.training.params.TaskParams``: type and long-text handling) and
    ``max_seq_len`` its training length; None for an encoder."""
    load = ["from transformers import pipeline", "", 'path = "path/to/this/dir"']
    kind = getattr(task, "type", None) if max_seq_len else None
    if kind == "classification":
        return _classify_snippet(task, max_seq_len)
    if kind == "pair_classification":
        return load + [f'pipe = pipeline("{pipeline_tag}", model=path)',
                       'print(pipe({"text": "第一段。", "text_pair": "第二段。"}, truncation="longest_first", '
                       f"max_length={max_seq_len}))"]
    if kind == "ner":
        return ["from transformers import AutoTokenizer, pipeline", "", 'path = "path/to/this/dir"',
                f"tok = AutoTokenizer.from_pretrained(path, model_max_length={max_seq_len})  # windows as in training",
                f"overlap = max(0, {max_seq_len} - tok.num_special_tokens_to_add() - {task.stride})  # a window "
                f"every {task.stride} pieces",
                f'pipe = pipeline("{pipeline_tag}", model=path, tokenizer=tok, aggregation_strategy="simple", '
                "stride=overlap)",
                'print(pipe("' + "张三在北京工作。" * 3 + '"))  # the entities of the whole text, character offsets']
    if kind == "qa":
        return _qa_snippet(task, max_seq_len)
    call = ('pipe(f"今天{pipe.tokenizer.mask_token}气。", tokenizer_kwargs={"truncation": True})'
            if pipeline_tag == "fill-mask"
            else 'pipe("很长的文本。", truncation=True)')
    return load + [f'pipe = pipeline("{pipeline_tag}", model=path)', f"print({call})"]


def write(model_dir: Path, ctx, *, pipeline_tag: str, base_model: str, metrics: dict[str, float] | None = None,
          labels: list[str] | None = None, decision: str | None = None, notes: str = "", task=None,
          max_seq_len: int | None = None) -> Path:
    """README.md for ``model_dir`` written by stage ``ctx`` (a bertpipe.core.stage.StageContext); ``task`` and
    ``max_seq_len``: a finetuned model's task settings and length, for its "How to load" code (``how_to_load``)."""
    from huggingface_hub import ModelCard, ModelCardData

    from bertpipe.lib.modeldir import fit_tokenizer

    fit_tokenizer(Path(model_dir))
    cfg = ctx.cfg
    base_model = _shown(cfg, base_model) if base_model else base_model
    metrics = {k: float(v) for k, v in (metrics or {}).items() if isinstance(v, (int, float)) and v == v}
    given = user_base_model(cfg)
    data_inputs = [v for _, v in sorted(ctx.inputs.items()) if v is not None and not _is_model(v)]
    datasets = list(dict.fromkeys(_dataset_id(v) for v in data_inputs))
    license_id = _license(given, cfg)
    data = ModelCardData(language=cfg.params.model.language, library_name="transformers", pipeline_tag=pipeline_tag,
                         license=license_id, tags=["bertpipe", ctx.name.split("/")[0]],
                         base_model=given, datasets=datasets or None)
    if license_id == "other":
        data.license_name, data.license_link = "unstated", LICENSE_FILE
        _license_file(model_dir, given)
    if metrics:
        data.metrics = sorted(metrics)
        data.model_name = ctx.name.replace("/", "-")
        data.eval_results = _eval_results(metrics, pipeline_tag, datasets[0] if datasets else ctx.name.split("/")[0],
                                          _shown(cfg, data_inputs[0]) if data_inputs else ctx.name)
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
    body += ["## How to load", "", "```python", *how_to_load(pipeline_tag, task, max_seq_len), "```", ""]
    card = ModelCard(f"---\n{data.to_yaml()}\n---\n\n" + "\n".join(body))
    path = Path(model_dir) / "README.md"
    card.save(path)
    return path
