"""The evaluate stage: collects every finetune/<task>/<encoder> result into the base-vs-adapted comparison, adds the
encoders' held-out MLM perplexity, and writes ``report.md`` (with figures) and ``metrics.json``.

``metrics.json`` (stable; the registry reads it)::

    {"split": "test", "encoders": ["base", "adapted"],
     "tasks": {task: {"type", "primary", "seeds": [...],
                      "base": {metric: {"mean", "std", "values"}}, "adapted": {...},
                      "delta": {metric: {"mean", "std", "values"}}}},      # adapted − base, paired by seed
     "mlm": {"base": {"perplexity", "loss", "masked_tokens", "texts"}, "adapted": {...},
             "delta": {"perplexity", "loss"}}}
"""

from __future__ import annotations

import json
import shutil
import statistics
from pathlib import Path

from bertpipe.errors import BertpipeError
from bertpipe.evaluate import report as R
from bertpipe.evaluate.params import EvaluateParams

VERSION = "1"


def own_inputs(cfg) -> dict:
    return {}


def _stat(values: list[float]) -> dict:
    return {"mean": statistics.fmean(values), "std": statistics.stdev(values) if len(values) > 1 else 0.0,
            "values": values}


def _load_finetune(path: Path, key: str) -> dict:
    try:
        return json.loads((Path(path) / "metrics.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise BertpipeError(f"{path}/metrics.json: cannot read the {key} result ({e})") from None


def compare(results: dict[tuple[str, str], dict], split: str) -> dict:
    """The tasks part of metrics.json from finetune metrics keyed by (task, encoder)."""
    tasks: dict = {}
    encoders = [e for e in ("base", "adapted") if any(k[1] == e for k in results)]
    for (task, enc), m in sorted(results.items()):
        t = tasks.setdefault(task, {"type": m["type"], "primary": m["primary"], "seeds": m["seeds"]})
        per_seed = {s: r[split] for s, r in m["per_seed"].items()}
        names = sorted({k for r in per_seed.values() for k in r})
        t[enc] = {k: _stat([r[k] for r in per_seed.values() if k in r]) for k in names}
        t.setdefault("_per_seed", {})[enc] = per_seed
    for t in tasks.values():
        ps = t.pop("_per_seed")
        if "base" in ps and "adapted" in ps:
            seeds = sorted(set(ps["base"]) & set(ps["adapted"]))
            names = sorted(set(t["base"]) & set(t["adapted"]))
            t["delta"] = {
                k: _stat([ps["adapted"][s][k] - ps["base"][s][k] for s in seeds
                          if k in ps["adapted"][s] and k in ps["base"][s]])
                for k in names
            }
            t["delta"] = {k: v for k, v in t["delta"].items() if v["values"]}
    return {"split": split, "encoders": encoders, "tasks": tasks}


def _valid_texts(corpus: Path, limit: int) -> list[str]:
    import pyarrow.parquet as pq

    path = Path(corpus) / "valid.parquet"
    if not path.is_file():
        raise BertpipeError(f"{path}: the prepared domain corpus has no valid split")
    texts = [t for t in pq.read_table(path, columns=["text"]).column("text").to_pylist() if t and t.strip()]
    return texts[:limit] if limit else texts


def _perplexity(ctx, p: EvaluateParams, encoders: list[str]) -> dict:
    from bertpipe.evaluate.metrics import mlm_perplexity

    texts = _valid_texts(Path(ctx.inputs["corpus"]), p.mlm_max_texts)
    out: dict = {}
    skipped = []
    for enc in encoders:
        src = ctx.inputs.get(enc)
        if src is None:
            continue
        try:
            out[enc] = mlm_perplexity(src, texts, p.mlm_max_seq_len, p.mlm_mask_prob, p.mlm_batch_size, p.mlm_seed)
        except (OSError, ValueError) as e:  # a headless encoder or a hub id that cannot be fetched
            skipped.append(f"{enc} ({str(e).splitlines()[0][:120]})")
        ctx.log(f"perplexity {enc}: {out.get(enc, {}).get('perplexity', float('nan')):.2f}")
    if "base" in out and "adapted" in out:
        out["delta"] = {k: out["adapted"][k] - out["base"][k] for k in ("perplexity", "loss")}
    notes = []
    if skipped:
        notes.append("No MLM head to score: " + "; ".join(skipped) + ".")
    notes.append("Each encoder is scored with its own tokenizer; with an extended vocabulary the masked tokens differ, "
                 "so compare perplexities as a trend, not to the decimal.")
    out["note"] = " ".join(notes)
    return out


def build(ctx) -> dict:
    p: EvaluateParams = ctx.params
    if p.num_threads:
        import torch

        torch.set_num_threads(p.num_threads)
    results = {}
    dirs = {}
    for key, path in ctx.inputs.items():
        if key.startswith("finetune/"):
            _, task, enc = key.split("/")
            results[(task, enc)] = _load_finetune(Path(path), key)
            dirs[(task, enc)] = Path(path)
    if not results:
        raise BertpipeError("evaluate: no finetune results among the inputs (finetune.tasks is empty?)")
    result = compare(results, p.split)
    result["mlm"] = _perplexity(ctx, p, result["encoders"]) if p.perplexity and "corpus" in ctx.inputs else {}

    figs = ctx.out / "figures"
    figs.mkdir()
    figures: dict[str, list[str]] = {"bar": [], "confusion": [], "curves": []}
    R.bar_chart(figs / "primary.png", result["tasks"], result["encoders"])
    figures["bar"].append("figures/primary.png")
    label_keys = {}
    for (task, enc), m in sorted(results.items()):
        saved = [r for r in m["per_seed"].values() if r.get("saved")] or list(m["per_seed"].values())
        conf = saved[0].get("test_details", {}).get("confusion")
        if conf and p.split == "test":
            name = f"confusion_{task}_{enc}.png"
            R.confusion_png(figs / name, conf["labels"], conf["matrix"], f"{task} / {enc} (test)")
            figures["confusion"].append(f"figures/{name}")
            label_keys[task] = conf["labels"]
        curves = dirs[(task, enc)] / "curves.png"
        if curves.is_file():
            shutil.copy(curves, figs / f"curves_{task}_{enc}.png")
            figures["curves"].append(f"figures/curves_{task}_{enc}.png")
    (ctx.out / "report.md").write_text(R.markdown(result, figures, label_keys), encoding="utf-8")
    from bertpipe.stage import write_json

    write_json(ctx.out / "metrics.json", result)
    ctx.log_artifact(ctx.out / "report.md")
    ctx.log_artifact(ctx.out / "metrics.json")
    for f in sorted(figs.iterdir()):
        ctx.log_artifact(f, "figures")

    flat: dict[str, float] = {}
    for task, t in result["tasks"].items():
        for enc in result["encoders"] + ["delta"]:
            for k, v in t.get(enc, {}).items():
                flat[f"{task}.{enc}.{k}"] = v["mean"]
    for enc, r in result["mlm"].items():
        if isinstance(r, dict):
            flat.update({f"mlm.{enc}.{k}": float(v) for k, v in r.items() if k in ("perplexity", "loss")})
    ctx.counts.update({"tasks": len(result["tasks"]), "finetune_results": len(results)})
    ctx.log_metrics(flat)
    return flat
