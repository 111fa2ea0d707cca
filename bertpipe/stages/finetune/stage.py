"""The finetune stage: one task head on one encoder. Hyperparameters are chosen on dev (``finetune.search``), then
every seed trains with them; a seed whose run is degenerate on dev is trained again with another seed; each run is
scored on dev and test.

Output (``ctx.out``): ``model/`` (the best seed by dev metric, save_pretrained with its tokenizer and id2label, loadable
by the Auto class and a transformers pipeline), ``metrics.json``, ``predictions_test.jsonl`` (the saved seed's test
predictions), ``predictions/seed<N>.jsonl`` (every seed's), ``curves.png``.
"""

from __future__ import annotations

import json
import shutil
import statistics
from collections import Counter
from pathlib import Path

from bertpipe.infra.cores import use_training_threads
from bertpipe.infra.device import pick_device, precision_for
from bertpipe.infra.errors import BertpipeError
from bertpipe.infra.execution import should_compile
from bertpipe.lib.labelled import SPLITS, SPLITS_JSON, read_task, split_datasets, split_info
from bertpipe.lib.measures.metrics import PRIMARY
from bertpipe.lib.modelinfo import clamp_seq_len
from bertpipe.lib.training import degenerate as D
from bertpipe.lib.training.features import describe, featurize
from bertpipe.lib.training.heads import pipeline_task
from bertpipe.lib.training.predict import score
from bertpipe.stages.finetune import search as S
from bertpipe.stages.finetune.declare import TRIALS, VERSION
from bertpipe.stages.finetune.fit import Task, fit
from bertpipe.stages.finetune.params import task_settings


def _plot(path: Path, runs: dict, primary: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(10, 3.6))
    for seed, r in runs.items():
        if r.losses:
            a1.plot(*zip(*r.losses), label=f"seed {seed}")
        a2.plot([e["step"] for e in r.evals], [e["primary"] for e in r.evals], marker="o", label=f"seed {seed}")
        a2.axvline(r.best_step, ls=":", lw=0.8)
    a1.set(title="train loss", xlabel="optimizer step")
    a2.set(title=f"dev {primary} (dotted: restored best)", xlabel="optimizer step")
    for a in (a1, a2):
        a.legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _mean_std(values: list[float]) -> dict:
    return {"mean": statistics.fmean(values), "std": statistics.stdev(values) if len(values) > 1 else 0.0,
            "values": values}


def _write_predictions(path: Path, recs: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as fh:
        for r in recs:
            fh.write(json.dumps(r, ensure_ascii=False) + "\n")


def _trial_identity(ctx, p) -> dict:
    """What a search trial's result depends on besides its hyperparameters and seed: the encoder and task data
    (their content digests), the task's settings and this package's code."""
    from bertpipe.core.codeid import MODEL_LIBS, code_identity
    from bertpipe.core.stage import content_digest

    return {"encoder": content_digest(ctx.inputs["encoder"], ctx.cfg),
            "task": content_digest(ctx.inputs["task"], ctx.cfg),
            "params": p.model_dump(mode="json", exclude={"train_overrides", "search_overrides"}),
            "code": code_identity(("finetune",), MODEL_LIBS)["digest"], "version": VERSION}


def build(ctx, task: str, encoder: str) -> dict:
    settings = task_settings(ctx.cfg, task)  # what the stage's spec (its fingerprint) holds, resolved once
    t, tok, tp, counts = _load(ctx, task, encoder, settings)
    outcome = _search(ctx, t, tp, settings.search)
    per_seed, runs = _train_seeds(ctx, t, tok, outcome, settings.search)
    out = _metrics(ctx, t, task, encoder, per_seed, outcome, settings.search, counts)
    return _write(ctx, out, runs, f"{task} / {encoder}", counts)


def _load(ctx, task: str, encoder: str, settings) -> tuple[Task, object, object, Counter]:
    """The task's splits featurised for the encoder, with what every run shares: (the Task, the tokenizer, the
    training settings with max_seq_len fitted to the encoder, the featurisation counts)."""
    p, tp = settings.task, settings.train
    for key, by in settings.narrowed.items():
        ctx.log(f"{task}/{encoder} search: {key} is set by {by} ({getattr(tp, key)!r}): the space is narrowed to it")
    # The same count in every door (bertpipe.infra.cores): the weights depend on it, the fingerprint holds only the
    # setting
    ctx.counts["torch_threads"] = use_training_threads(tp.num_threads)
    device = pick_device(tp.device)
    should_compile(tp.compile, 0, device, settings.key("compile"))  # `on` without a compiler fails before the data is read
    tdir = Path(ctx.inputs["task"])
    data = read_task(tdir)  # the splits stage's output: cleaned, leak-checked, capped, labels mapped
    info = split_info(tdir)
    if ctx.tracker is not None:  # every finetune run names the data it saw (base and adapted alike)
        ctx.tracker.log_datasets(split_datasets(tdir, task))
    counts: Counter = Counter({k: v for k, v in info.get("counts", {}).items() if isinstance(v, int)})
    labels = list(info.get("labels") or [])
    if p.type != "qa" and not labels:
        raise BertpipeError(f"{tdir / SPLITS_JSON}: no label list (rerun `bertpipe splits`)")
    src = ctx.inputs["encoder"]
    tok = _tokenizer(src)
    # Defaults fit any encoder: a max_seq_len past the encoder's position table is cut to it (with a notice).
    tp = tp.model_copy(update={"max_seq_len": clamp_seq_len(tp.max_seq_len, src, settings.key("max_seq_len"),
                                                            ctx.log)})
    label2id = {lab: i for i, lab in enumerate(labels)}
    splits = {s: featurize(tok, data[s], p, tp, label2id, counts, s) for s in SPLITS}
    describe(counts)
    sizes = ", ".join(f"{s} {len(data[s])} ex / {len(splits[s].feats)} feats" for s in SPLITS)
    ctx.log(f"{task}/{encoder}: {sizes}")
    prec = precision_for(tp.precision, device)  # scoring runs in bf16 where training does; fp16 scores in fp32
    ctx.counts.update(prec.record())
    ctx.log(f"{ctx.name}: precision {prec.words()}")
    train_labels = [ex.label for ex in data["train"]]
    dev_gold = [ex.label for ex in data["dev"]] if p.type in ("classification", "pair_classification") else []
    t = Task(p, src, labels, splits, PRIMARY[p.type], tok.pad_token_id if tok.pad_token_id is not None else 0, device,
             prec.bf16, D.majority_score(p.type, train_labels, dev_gold, labels), f"{task}/{encoder}",
             log_metrics=ctx.log_metrics)
    return t, tok, tp, counts


def _tokenizer(src):
    """The encoder's fast tokenizer (its character offsets map predictions back); a one-line error otherwise."""
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(str(src))
    except (OSError, ValueError) as e:
        raise BertpipeError(f"encoder {src}: no tokenizer could be loaded ({e})") from None
    if not getattr(tok, "is_fast", False):
        raise BertpipeError(f"encoder {src}: needs a fast tokenizer (character offsets map predictions back)")
    return tok


def _search(ctx, t: Task, tp, sp):
    """The hyperparameters chosen on dev (``finetune.search``, its trials kept under paths.state), each trial an
    MLflow run of its own."""
    store = S.TrialStore(ctx.cfg.state / TRIALS, _trial_identity(ctx, t.p), t.desc)
    outcome = S.search(sp, tp, tp.seeds[0], lambda ttp, seed, on_eval, n: fit(t, ttp, seed, on_eval, f"trial{n}_"),
                       store, lambda m: ctx.log(f"{t.desc} search: {m}"))
    for tr in outcome.trials:
        ctx.log_child(f"{ctx.name} trial {tr.number}", tr.config,
                      {f"dev_{t.primary}": tr.curve}, {"bertpipe.trial.state": tr.state,
                                                       "bertpipe.trial.reason": tr.reason,
                                                       "bertpipe.trial.chosen": tr.config == outcome.config
                                                       and tr.state == "complete", "bertpipe.trial.stored": tr.cached})
    return outcome


def _train_seeds(ctx, t: Task, tok, outcome, sp) -> tuple[dict, dict]:
    """Every seed trained with the chosen settings and scored on test; the best by dev (never test: choosing on it
    would leak) is saved. (per-seed records, each seed's training result)."""
    tp = outcome.chosen
    per_seed: dict = {}
    runs: dict = {}
    best_dev = float("-inf")
    for seed in tp.seeds:
        f = _seed_run(ctx, t, outcome, sp, seed)
        res, dev = f.result, f.dev
        runs[seed] = res
        test, test_details, recs = score(f.model, t.splits["test"], t.p, t.labels, t.pad, tp.eval_batch_size, t.bf16)
        per_seed[str(seed)] = {
            "dev": dev, "test": test, "test_details": test_details, "best_step": res.best_step, "steps": res.steps,
            "stopped_early": res.stopped_early, "train_seconds": round(res.seconds, 2), "bf16": res.bf16,
            "trained_seed": f.seed, "degenerate": f.degenerate,
            "compile": res.compile_why + (f" (~{res.compile_s:.0f} s compiling)" if res.compile_s is not None else ""),
            "attention": res.attention,
        }
        _write_predictions(ctx.out / "predictions" / f"seed{seed}.jsonl", recs)
        ctx.log(f"{t.desc} seed {seed}: dev {t.primary} {dev.get(t.primary, float('nan')):.4f}, "
                f"test {t.primary} {test.get(t.primary, float('nan')):.4f} ({res.steps} steps, {res.seconds:.0f}s)"
                + (f", DEGENERATE: {f.degenerate}" if f.degenerate else ""))
        # without dev the first seed stays; a degenerate run only when every run is
        choice = dev.get(t.primary, 0.0) - (2.0 if f.degenerate else 0.0)
        if choice > best_dev:
            best_dev = choice
            _save(ctx, t, tok, tp, seed, f.model, test, recs)
            for r in per_seed.values():
                r.pop("saved", None)
            per_seed[str(seed)]["saved"] = True
        del f
    return per_seed, runs


def _seed_run(ctx, t: Task, outcome, sp, seed: int):
    """The run of ``seed``: the search's own when it trained this seed, else trained here; a run degenerate on dev
    is trained again with another seed (``seed + 1000 * attempt``), up to ``finetune.search.retries`` times."""
    tp = outcome.chosen
    f = outcome.fit if (outcome.fit is not None and seed == outcome.fit.seed) else None
    outcome.fit = None if f is not None else outcome.fit
    # the search already trained this very run and found it degenerate: no need to train it again
    first = 1 if (seed == tp.seeds[0] and outcome.degenerate and sp.retries) else 0
    if first:
        ctx.log(f"{t.desc} seed {seed}: degenerate on dev in the search ({outcome.degenerate}), training another seed")
    for attempt in range(first, sp.retries + 1):
        trained = seed + 1000 * attempt
        if f is None:
            f = fit(t, tp, trained, metric_prefix=f"seed{seed}_")
        if not f.degenerate:
            break
        ctx.log(f"{t.desc} seed {trained}: degenerate on dev ({f.degenerate})"
                + (", training another seed" if attempt < sp.retries else ""))
        if attempt < sp.retries:
            f = None
    return f


def _save(ctx, t: Task, tok, tp, seed: int, model, test: dict, recs: list[dict]) -> None:
    """``model/`` (the model, its tokenizer and card) and ``predictions_test.jsonl`` of the seed chosen so far."""
    from bertpipe.lib import modelcard

    shutil.rmtree(ctx.out / "model", ignore_errors=True)
    model.save_pretrained(ctx.out / "model")
    tok.save_pretrained(ctx.out / "model")
    modelcard.write(ctx.out / "model", ctx, pipeline_tag=pipeline_task(t.p.type) or "feature-extraction",
                    base_model=str(t.encoder), labels=t.labels, metrics={f"test_{k}": v for k, v in test.items()},
                    notes=f"Seed {seed} of {tp.seeds}, chosen on dev {t.primary} (never on test).", task=t.p,
                    max_seq_len=tp.max_seq_len)
    _write_predictions(ctx.out / "predictions_test.jsonl", recs)


def _metrics(ctx, t: Task, task: str, encoder: str, per_seed: dict, outcome, sp, counts: Counter) -> dict:
    """metrics.json: every seed's scores, their summary over the runs that learned something (an encoder none of
    whose runs did is degenerate), the search and the hyperparameters."""
    sound = {s: r for s, r in per_seed.items() if not r["degenerate"]}
    summary = {}
    for s in ("dev", "test"):
        rows = (sound or per_seed).values()
        names = sorted({k for r in rows for k in r[s]})
        summary[s] = {k: _mean_std([r[s][k] for r in rows if k in r[s]]) for k in names}
    degenerate = not sound
    if degenerate:
        ctx.log(f"{task}/{encoder}: DEGENERATE: every seed's run is degenerate on dev; no verdict will use it")
    tp = outcome.chosen
    return {
        "task": task, "type": t.p.type, "encoder": encoder, "encoder_source": str(t.encoder), "primary": t.primary,
        "pipeline_task": pipeline_task(t.p.type), "labels": t.labels, "seeds": tp.seeds, "per_seed": per_seed,
        "summary": summary, "counts": dict(counts), "degenerate": degenerate,
        "degenerate_reason": next(iter(per_seed.values()))["degenerate"] if degenerate else None,
        "majority_dev": t.majority_dev,
        "search": {"space": sp.space, "budget": sp.trials, "prune": sp.prune, "chosen": outcome.config,
                   "trials": [tr.record() for tr in outcome.trials]},
        "hyperparameters": tp.model_dump(mode="json", exclude={"seeds", "device", "num_threads"}),
    }


def _write(ctx, out: dict, runs: dict, title: str, counts: Counter) -> dict:
    """metrics.json, the curves (a figure, and rows for `dvc plots`), the artifacts and the MLflow metrics: the
    flat dev and test means."""
    from bertpipe.core.stage import write_json

    primary = out["primary"]
    write_json(ctx.out / "metrics.json", out)
    _plot(ctx.out / "curves.png", runs, primary, title)
    # The same curves as rows, for `dvc plots` (evaluate collects them under work/evaluate/plots/).
    write_json(ctx.out / "curves.json", {
        "train_loss": [{"step": st, "loss": v, "seed": s} for s, r in runs.items() for st, v in r.losses],
        # the metric last: DVC plots it (y) when a plot names no field, as the dev plot (its name varies by task)
        "dev": [{"step": e["step"], "seed": s, primary: e["primary"]} for s, r in runs.items() for e in r.evals]})
    for name in ("curves.png", "metrics.json", "predictions_test.jsonl"):
        if (ctx.out / name).exists():
            ctx.log_artifact(ctx.out / name)
    ctx.counts.update({k: int(v) for k, v in counts.items()})
    flat = {f"{s}_{k}": v["mean"] for s in ("dev", "test") for k, v in out["summary"][s].items()}
    ctx.log_metrics(flat)
    return flat
