"""The evaluate stage: every finetune/<task>/<encoder> result next to the task's baselines, each encoder's paired
difference from base with a bootstrap interval, a verdict per task, and the fair encoder comparison; writes ``report.md`` (with
figures) and ``metrics.json``.

``metrics.json`` (stable; register reads it)::

    {"split": "test", "encoders": ["base", "adapted"],
     "tasks": {task: {"type", "primary", "seeds": [...], "test_sha256",
                      "baselines": {"majority": {metric: value}, "tfidf" | "lexicon": {...}},
                      "base": {metric: {"mean", "std", "values"}}, "adapted": {...}, "tapt": {...},
                      "deltas": {encoder: {metric: {"mean", "std", "values", "seeds", "ci95": [lo, hi] | null,
                                                    "ci_method"}}},
                      "delta": deltas["adapted"],
                      "degenerate": {encoder: "why"},  (only encoders every one of whose runs is degenerate)
                      "search": {encoder: {"chosen", "trials", "complete"}},
                      "lost_classes": {encoder: {class: {"support", "baseline", "baseline_recall"}}},
                                      (only classes the encoder never gets right on test while a baseline does)
                      "verdict": "plain sentences"}},
     "encoder_comparison": {"split": "test", "base": {"nll_per_char", "bits_per_char", "masked_chars", "spans", ...},
                            "adapted": {...}, "delta": {"nll_per_char", "ci95": [lo, hi], ...},
                            "gate": {encoder: {"neg_nll_per_char", "max_len", "key"}}}}

``encoder_comparison.gate`` holds each encoder's register gate score (``bertpipe.lib.measures.encoder_gate``) under the
key of the model, windows and scoring it was computed with: register reads it instead of scoring the same encoder
again.
"""

from __future__ import annotations

import json
import shutil
import statistics
from pathlib import Path

from bertpipe.infra.cores import use_training_threads
from bertpipe.infra.errors import BertpipeError
from bertpipe.lib.measures import baselines as BL
from bertpipe.lib.measures import bootstrap as B
from bertpipe.stages.evaluate import report as R
from bertpipe.stages.evaluate.params import EvaluateParams


def _stat(values: list[float]) -> dict:
    return {"mean": statistics.fmean(values), "std": statistics.stdev(values) if len(values) > 1 else 0.0,
            "values": values}


def _load_finetune(path: Path, key: str) -> dict:
    try:
        return json.loads((Path(path) / "metrics.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise BertpipeError(f"{path}/metrics.json: cannot read the {key} result ({e})") from None


ENCODER_ORDER = ("base", "adapted", "tapt")


def _sound(m: dict, split: str) -> dict[str, dict]:
    """{seed: scores on split} of a finetune result's runs that are not degenerate (all of them when every run is:
    the numbers stay visible, and the task is marked degenerate)."""
    rows = {s: r for s, r in m["per_seed"].items() if not r.get("degenerate")}
    return {s: r[split] for s, r in (rows or m["per_seed"]).items()}


def compare(results: dict[tuple[str, str], dict], split: str) -> dict:
    """The tasks part of metrics.json from finetune metrics keyed by (task, encoder): every encoder's scores, and
    each other encoder's difference from base paired by seed (``deltas``; ``delta`` is adapted's)."""
    tasks: dict = {}
    present = {k[1] for k in results}
    encoders = [e for e in ENCODER_ORDER if e in present] + sorted(present - set(ENCODER_ORDER))
    for (task, enc), m in sorted(results.items()):
        t = tasks.setdefault(task, {"type": m["type"], "primary": m["primary"], "seeds": m["seeds"]})
        per_seed = _sound(m, split)
        names = sorted({k for r in per_seed.values() for k in r})
        t[enc] = {k: _stat([r[k] for r in per_seed.values() if k in r]) for k in names}
        t.setdefault("_per_seed", {})[enc] = per_seed
        if m.get("degenerate"):
            t.setdefault("degenerate", {})[enc] = m.get("degenerate_reason") or "every run degenerate on dev"
        if m.get("search", {}).get("trials"):
            t.setdefault("search", {})[enc] = {"chosen": m["search"]["chosen"], "trials": len(m["search"]["trials"]),
                                                "complete": sum(tr["state"] == "complete"
                                                                for tr in m["search"]["trials"])}
    for t in tasks.values():
        ps = t.pop("_per_seed")
        if "base" not in ps:
            continue
        for enc in [e for e in encoders if e != "base" and e in ps]:
            if t.get("degenerate", {}).keys() & {"base", enc}:
                continue  # a comparison with a model that learned nothing says nothing
            seeds = sorted(set(ps["base"]) & set(ps[enc]))
            names = sorted(set(t["base"]) & set(t[enc]))
            d = {k: _stat([ps[enc][s][k] - ps["base"][s][k] for s in seeds if k in ps[enc][s] and k in ps["base"][s]])
                 for k in names}
            d = {k: v for k, v in d.items() if v["values"]}
            for v in d.values():
                v["seeds"] = seeds
            t.setdefault("deltas", {})[enc] = d
        if "adapted" in t.get("deltas", {}):
            t["delta"] = t["deltas"]["adapted"]
    return {"split": split, "encoders": encoders, "tasks": tasks}


def interval(t: dict, enc: str, base_dir: Path, enc_dir: Path, split: str, n: int, seed: int
             ) -> tuple[list | None, str]:
    """95% interval of the primary metric's ``enc`` − base mean: paired bootstrap over the test examples (the saved
    seeds' predictions) combined with resampling the seeds' paired differences when there are several."""
    seed_deltas = t["deltas"][enc][t["primary"]]["values"]
    fn = B.METRIC_FNS.get(t["type"])
    # the test examples both encoders' finetunes scored
    gold, base, other = B.shared_examples(t["type"], B.read_predictions(Path(base_dir) / B.PREDICTIONS),
                                          B.read_predictions(Path(enc_dir) / B.PREDICTIONS))
    if n and fn and split == "test" and gold:
        deltas = B.paired_deltas(gold, base, other, fn, n, seed)
        ci = B.seeds_and_examples(seed_deltas, deltas, fn(gold, other) - fn(gold, base), seed)
        how = f"paired bootstrap over {len(gold)} test examples (saved seeds' predictions; n={n}, seed {seed})"
        if len(seed_deltas) > 1:
            how += f" combined with resampling the {len(seed_deltas)} seeds' paired differences"
        return ci, how
    if n and len(seed_deltas) > 1:
        import numpy as np

        s = np.asarray(seed_deltas)
        pick = B.replicate_indices(len(s), n, seed)
        return B.percentile_ci(s[pick].mean(axis=1)), f"bootstrap over {len(s)} seeds' paired differences only"
    return None, "none: no per-example test predictions and a single seed"


BASELINE_NAMES = {"majority": "majority-class baseline", "tfidf": "TF-IDF baseline", "lexicon": "lexicon baseline"}


def comparison(t: dict, enc: str) -> str:
    """One clause on ``enc`` against base. "beats"/"is worse" only when the interval excludes 0 and every seed's
    paired difference has the same sign; otherwise it says which seeds disagree."""
    m = t["primary"]
    dead = {e: r for e, r in t.get("degenerate", {}).items() if e in ("base", enc)}
    if dead:
        who = "; ".join(f"{e} is degenerate ({r})" for e, r in sorted(dead.items()))
        return f"{enc} vs base is not informative: {who}; no difference or interval is reported"
    d = t.get("deltas", {}).get(enc, {}).get(m)
    if not d:
        return f"no {enc} − base difference"
    ci = d.get("ci95")
    span = f"{d['mean']:+.3f} {m}" + (f" (95% CI {ci[0]:+.3f}..{ci[1]:+.3f})" if ci else "")
    values, seeds = d["values"], d.get("seeds") or list(range(1, len(d["values"]) + 1))
    ups = [s for s, v in zip(seeds, values) if v > 0]
    downs = [s for s, v in zip(seeds, values) if v <= 0]
    if ci and (ci[0] > 0 or ci[1] < 0):
        word = "beats base by" if ci[0] > 0 else "is worse than base by"
        against = downs if ci[0] > 0 else ups
        if not against:
            agree = f", every one of {len(values)} seeds agrees" if len(values) > 1 else ", one seed"
            return f"{enc} {word} {span}{agree}"
        return (f"{enc} − base is {span}, but seeds {against} go the other way "
                f"({', '.join(f'{v:+.3f}' for v in values)}): no verdict")
    if ci:
        return f"{enc} and base cannot be told apart on {m} (Δ {span} includes 0)"
    return f"{enc} − base is {span} (no interval)"


def lost_classes(encoders: dict[str, dict], baselines: dict[str, dict]) -> dict:
    """{encoder: {class: {"support", "baseline", "baseline_recall"}}} of the classes (entity types) an encoder gets
    no test example of right (recall 0) while a baseline finds some; both map names to their metric details
    (``bertpipe.lib.measures.baselines.class_scores`` reads them). Averages hide such a class; the verdict names it."""
    found = {name: BL.class_scores(d) for name, d in baselines.items()}
    out: dict = {}
    for enc, details in encoders.items():
        for c, v in BL.class_scores(details).items():
            best = max(found, key=lambda n: (found[n].get(c, {}).get("recall", 0.0), n), default=None)
            r = found[best].get(c, {}).get("recall", 0.0) if best else 0.0
            if v["recall"] == 0 and r > 0:
                out.setdefault(enc, {})[c] = {"support": v["support"], "baseline": best, "baseline_recall": r}
    return out


def _lost(t: dict) -> list[str]:
    kind = "entity type" if t["type"] == "ner" else "class"
    return [f"{enc} never gets {kind} {c!r} right ({v['support']} test example{'s' * (v['support'] > 1)}, recall 0), "
            f"which the {BASELINE_NAMES.get(v['baseline'], v['baseline'])} does (recall {v['baseline_recall']:.3f})"
            for enc, lost in t.get("lost_classes", {}).items() for c, v in lost.items()]


def verdict(t: dict) -> str:
    """Plain sentences: each encoder against base (by its interval and its seeds), then the best encoder that
    learned something against the strongest baseline, then each class an encoder loses that a baseline finds."""
    m = t["primary"]
    others = [e for e in ENCODER_ORDER if e != "base" and e in t] + sorted(
        e for e in t.get("deltas", {}) if e not in ENCODER_ORDER)
    parts = [comparison(t, e) for e in others] if "base" in t else []
    sound = [e for e in ENCODER_ORDER if e in t and e not in t.get("degenerate", {})]
    enc = max(sound, key=lambda e: t[e].get(m, {}).get("mean", float("-inf"))) if sound else None
    value = t[enc].get(m, {}).get("mean") if enc else None
    if not parts:
        parts.append(f"{enc} scores {value:.3f} {m}" if value is not None else "no encoder learned the task")
    scored = {k: v[m] for k, v in t.get("baselines", {}).items() if m in v}
    if scored and value is not None:
        best = max(scored, key=lambda k: (scored[k], k))
        name = "all-O baseline" if (best == "majority" and t["type"] == "ner") else BASELINE_NAMES.get(best, best)
        if value > scored[best]:
            parts.append(f"{enc} beats the {name} by {value - scored[best]:+.3f}")
        else:
            parts.append(f"{enc} does not beat the {name} ({value:.3f} vs {scored[best]:.3f})")
    return "; ".join(parts + _lost(t)) + "."


def encoder_verdict(ec: dict) -> str:
    """One plain sentence on the encoder comparison (lower NLL per character is better)."""
    d = ec.get("delta")
    if not d:
        return ""
    ci = d.get("ci95")
    span = f" (95% CI {ci[0]:+.4f}..{ci[1]:+.4f})" if ci else ""
    words = f"{d['nll_per_char']:+.4f} nats per character{span}"
    if ci and ci[1] < 0:
        return f"adapted predicts masked domain words better than base: {words}."
    if ci and ci[0] > 0:
        return f"adapted predicts masked domain words worse than base: {words}."
    return f"adapted and base cannot be told apart on masked domain words: {words}."


def _task_data(ctx, p: EvaluateParams, result: dict, dirs: dict, saved: dict) -> None:
    """Baselines, test-set identity, intervals, lost classes and verdicts, task by task. ``saved``: the saved seed's
    run of each (task, encoder)."""
    from bertpipe.lib.labelled import read_task, split_info

    for task, t in result["tasks"].items():
        tdir = ctx.inputs.get(f"splits/{task}")
        info = split_info(tdir) if tdir else {}
        t["test_sha256"] = info.get("splits", {}).get("test", {}).get("sha256")
        t["baselines"] = {}
        if p.baselines and tdir:
            splits = read_task(Path(tdir))
            scored = BL.scored_baselines(t["type"], {"train": splits["train"], "test": splits[p.split]},
                                         info.get("labels"))
            t["baselines"] = {name: flat for name, (flat, _) in scored.items()}
            if p.split == "test":
                sound = [e for e in result["encoders"] if e in t and e not in t.get("degenerate", {})]
                lost = lost_classes({e: saved[(task, e)].get("test_details") or {} for e in sound},
                                    {name: details for name, (_, details) in scored.items()})
                if lost:
                    t["lost_classes"] = lost
        for enc, deltas in t.get("deltas", {}).items():
            for k, d in deltas.items():  # intervals are computed for the primary metric
                d["ci95"], d["ci_method"] = None, "none: not the primary metric"
            d = deltas.get(t["primary"])
            if d:
                d["ci95"], d["ci_method"] = interval(t, enc, dirs[(task, "base")], dirs[(task, enc)], p.split,
                                                     p.bootstrap_samples, p.bootstrap_seed)
        t["verdict"] = verdict(t)
        ctx.log(f"{task}: {t['verdict']}")


def _encoder_comparison(ctx, p: EvaluateParams, encoders: list[str]) -> dict:
    from bertpipe.core.stage import content_digest
    from bertpipe.lib.measures.encoder_gate import gate_key
    from bertpipe.lib.measures.fair_mlm import compare_encoders
    from bertpipe.lib.measures.windows import open_windows

    models = {e: ctx.inputs[e] for e in encoders if ctx.inputs.get(e) is not None}
    store: dict = {}

    def choose(max_chars: int) -> list:  # the test split's windows, from the store (built on first use)
        windows, store["test"] = open_windows(Path(ctx.inputs["corpus"]), p, max_chars, ctx.cfg.state, ctx.log)
        return windows

    try:
        out = compare_encoders(models, None, p, log=ctx.log, n_boot=p.bootstrap_samples,
                               boot_seed=p.bootstrap_seed, choose=choose)
    except (OSError, ValueError, BertpipeError) as e:  # no test text, a headless encoder, an unfetchable hub id
        ctx.log(f"encoder comparison skipped: {str(e).splitlines()[0][:200]}")
        return {"split": "test", "skipped": str(e).splitlines()[0][:200]}
    ctx.counts["window_store"] = store
    out["texts"] = store["test"]["texts"]
    for e, rec in out["gate"].items():  # what register reads instead of scoring the same model again
        rec["key"] = gate_key(content_digest(models[e], ctx.cfg), store["test"]["key"], rec["max_len"], p)
    out["verdict"] = encoder_verdict(out)
    for e in models:
        ctx.log(f"encoder {e}: {out[e]['bits_per_char']:.4f} bits per masked character ({out[e]['masked_chars']} "
                f"characters, {out[e]['spans']} words)")
    return out


def _flat(result: dict) -> dict[str, float]:
    """What goes to MLflow: every mean, baseline, interval end and encoder score, as `task.column.metric`."""
    flat: dict[str, float] = {}
    for task, t in result["tasks"].items():
        columns = {**{e: t.get(e, {}) for e in result["encoders"]},
                   **{("delta" if e == "adapted" else f"delta_{e}"): d for e, d in t.get("deltas", {}).items()}}
        for enc, stats in columns.items():
            for k, v in stats.items():
                flat[f"{task}.{enc}.{k}"] = v["mean"]
                if v.get("ci95"):
                    flat[f"{task}.{enc}.{k}.ci95_lo"], flat[f"{task}.{enc}.{k}.ci95_hi"] = v["ci95"]
        for name, scores in t.get("baselines", {}).items():
            flat.update({f"{task}.baseline_{name}.{k}": float(v) for k, v in scores.items()})
    ec = result.get("encoder_comparison") or {}
    for enc in result["encoders"]:
        if enc in ec:
            flat.update({f"encoder.{enc}.{k}": float(ec[enc][k]) for k in ("nll_per_char", "bits_per_char")})
    if "delta" in ec:
        flat["encoder.delta.nll_per_char"] = ec["delta"]["nll_per_char"]
    return flat


def build(ctx) -> dict:
    p: EvaluateParams = ctx.params
    ctx.counts["torch_threads"] = use_training_threads(p.num_threads)  # the same in every door (bertpipe.infra.cores)
    results = {}
    dirs = {}
    for key, src in ctx.sources.items():  # the finetune stages behind the inputs (bertpipe.stages.evaluate.declare)
        if src.family == "finetune":
            path = Path(ctx.inputs[key])
            results[(src.task, src.encoder)] = _load_finetune(path, key)
            dirs[(src.task, src.encoder)] = path
    if not results:
        raise BertpipeError("evaluate: no finetune results among the inputs (finetune.tasks is empty?)")
    result = compare(results, p.split)
    saved = {k: next((r for r in m["per_seed"].values() if r.get("saved")), next(iter(m["per_seed"].values())))
             for k, m in results.items()}
    _task_data(ctx, p, result, dirs, saved)
    result["encoder_comparison"] = (_encoder_comparison(ctx, p, result["encoders"])
                                    if p.encoder_comparison and "corpus" in ctx.inputs else {})

    figs = ctx.out / "figures"
    figs.mkdir()
    figures: dict[str, list[str]] = {"bar": [], "confusion": [], "curves": []}
    R.bar_chart(figs / "primary.png", result["tasks"], result["encoders"])
    figures["bar"].append("figures/primary.png")
    label_keys = {}
    confusions = {}
    recalls: dict = {}
    for task, enc in sorted(results):
        conf = saved[(task, enc)].get("test_details", {}).get("confusion")
        per_class = saved[(task, enc)].get("test_details", {}).get("per_class")
        if per_class and p.split == "test":
            recalls.setdefault(task, {})[enc] = per_class
        if conf and p.split == "test":
            name = f"confusion_{task}_{enc}.png"
            R.confusion_png(figs / name, conf["labels"], conf["matrix"], f"{task} / {enc} (test)")
            figures["confusion"].append(f"figures/{name}")
            label_keys[task] = conf["labels"]
            confusions[f"{task}_{enc}"] = (conf["labels"], conf["matrix"])
        curves = dirs[(task, enc)] / "curves.png"
        if curves.is_file():
            shutil.copy(curves, figs / f"curves_{task}_{enc}.png")
            figures["curves"].append(f"figures/curves_{task}_{enc}.png")
    (ctx.out / "report.md").write_text(R.markdown(result, figures, label_keys, recalls), encoding="utf-8")
    from bertpipe.core.stage import write_json

    write_json(ctx.out / "metrics.json", result)
    ctx.log_artifact(ctx.out / "report.md")
    ctx.log_artifact(ctx.out / "metrics.json")
    for f in sorted(figs.iterdir()):
        ctx.log_artifact(f, "figures")

    flat = _flat(result)
    from bertpipe.stages.evaluate import dvcplots

    dvcplots.write(ctx.out, flat, {t: v["primary"] for t, v in result["tasks"].items()}, confusions,
                   {f"{t}_{e}": d for (t, e), d in dirs.items()})
    ctx.counts.update({"tasks": len(result["tasks"]), "finetune_results": len(results)})
    ctx.log_metrics(flat)
    return flat
