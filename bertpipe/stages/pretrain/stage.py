"""The `base` and `pretrain` stages: one build, MLM pretraining from a checkpoint (pretrain) or from params (base).

Under torchrun every process runs this build (see ``bertpipe.stages.pretrain.run``): all of them train, only rank 0
writes ``ctx.out``; the others get a throwaway ``out`` and the same ``scratch`` (checkpoints are written by rank 0 and
read by every rank on resume, so with several nodes ``paths.state`` must be on a shared filesystem).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist

from bertpipe.infra.cores import use_training_threads
from bertpipe.infra.errors import BertpipeError
from bertpipe.infra.execution import should_compile
from bertpipe.lib.mlm import data, model, report
from bertpipe.lib.mlm.masking import MaskSpec, normal_token_ids
from bertpipe.lib.mlm.params import PretrainParams
from bertpipe.lib.mlm.train import (elastic_restarts, eval_batches, kept_weights, loss_metrics,
                                    setup_distributed, train)
from bertpipe.lib.modelinfo import clamp_seq_len
from bertpipe.stages.pretrain import rtd, tokstore


def build(ctx) -> dict:
    d = setup_distributed()
    try:
        return _build(ctx, d)
    finally:
        if d.world > 1 and dist.is_initialized():
            dist.destroy_process_group()
        from bertpipe.lib import keyedstore

        for rec in ctx.counts.get("token_store", {}).values():  # training is over: the stores may be collected
            keyedstore.release(rec["path"])


def objective_model(mlm, p):
    """The one place the objective is chosen: a module with PretrainModel's interface (forward -> losses, ``saved``)."""
    if p.objective == "rtd":
        return rtd.RtdModel(mlm, p.rtd.generator_ratio, p.rtd.disc_weight, p.seed)
    return model.PretrainModel(mlm, pair=p.pair_objective != "none")


def objective_words(p) -> str:
    masking = (f"{'whole-word' if p.whole_word else 'token'}, {p.masking}, p={p.mask_prob}, "
               f"{p.mask_token_ratio:g}/{p.random_token_ratio:g}/{p.keep_ratio:g}")
    if p.objective == "rtd":
        return (f"RTD (ELECTRA): generator at {p.rtd.generator_ratio:g} of the width fills the masks ({masking}); "
                f"loss = generator MLM + {p.rtd.disc_weight:g} x discriminator")
    return f"MLM ({masking})" + (f" + {p.pair_objective.upper()}" if p.pair_objective != "none" else "")


def _load(ctx, p):
    """(model, tokenizer, fresh head, origin, params with max_seq_len fitted to the model's position table)."""
    if "model" in ctx.inputs:
        ref = ctx.inputs["model"]
        mlm, tok, fresh = model.load_checkpoint(ref, log=ctx.log)
        p = p.model_copy(update={"max_seq_len": clamp_seq_len(p.max_seq_len, mlm, f"{ctx.name}.max_seq_len", ctx.log)})
        model.check_compatible(mlm, tok, p.max_seq_len, str(ref))
        return mlm, tok, fresh, f"continued from `{ref}`", p
    ref = ctx.inputs.get("tokenizer")
    if ref is None:
        raise BertpipeError(f"{ctx.name}: expected a `model` input or a `tokenizer` input (from scratch)")
    tok = model.load_tokenizer(ref)
    torch.manual_seed(ctx.params.seed)
    mlm = model.from_scratch(tok, p.arch, p.max_seq_len)
    model.check_compatible(mlm, tok, p.max_seq_len, str(ref))
    a = p.arch
    return mlm, tok, True, f"from scratch ({a.layers} layers, hidden {a.hidden}, {a.heads} heads, tokenizer `{ref}`)", p


def _build(ctx, d) -> dict:
    p: PretrainParams = ctx.params  # base's or pretrain's section
    # The same count in every door (bertpipe.infra.cores): the weights depend on it, the fingerprint holds only
    # p.threads. base has only light neighbours in the graph (the flow runs it on every core), pretrain runs beside
    # finetunes.
    threads = use_training_threads(p.threads, int(os.environ.get("LOCAL_WORLD_SIZE", "1")), alone=ctx.name == "base")
    ctx.counts["torch_threads"] = threads
    should_compile(p.compile, p.max_steps, d.device, f"{ctx.name}.compile")  # a bad setting fails before the data
    mlm, tok, fresh, origin, p = _load(ctx, p)
    corpus = Path(ctx.inputs["corpus"])
    train_ex, valid_ex, lengths = _examples(ctx, tok, ctx.cfg.params.model.language, p, corpus)
    _check_sizes(ctx.name, p, d, corpus, len(train_ex), len(valid_ex))
    if d.main:
        ctx.log(f"{origin}; {len(train_ex)} training segments, {len(valid_ex)} held-out; {d.world} process(es)")
    pm, res = _fit(ctx, d, p, mlm, tok, train_ex, valid_ex)
    restarts = elastic_restarts(d)
    chosen = kept_weights(pm, ctx.scratch, p.output)
    pad = _padding_share(lengths, p)
    metrics = _metrics(res, fresh, restarts, pad, p)
    ctx.counts.update(
        train_segments=len(train_ex), valid_segments=len(valid_ex), train_tokens=int(lengths.sum()),
        processes=d.world, steps=res.step, stopped=res.stopped, **res.precision.record(),
        restarts=restarts, resumed_from_step=res.resumed_from, attention=res.attention,
    )
    if not d.main:
        return metrics
    _collect_stores(ctx)
    facts = _facts(ctx, p, d, res, metrics, origin=origin, fresh=fresh, corpus=corpus, segments=len(train_ex),
                   tokens=int(lengths.sum()), held_out=len(valid_ex), restarts=restarts, pad=pad, chosen=chosen)
    _write(ctx, p, pm, mlm, tok, res, metrics, facts, valid_ex)
    return metrics


def _check_sizes(name: str, p, d, corpus: Path, n_train: int, n_valid: int) -> None:
    """At least one batch of training segments for every process, and held-out text; a one-line error otherwise."""
    need = p.batch_size * p.grad_accum * d.world
    if n_train < need:
        raise BertpipeError(
            f"{corpus / 'train.parquet'}: {n_train} packed segments, fewer than one batch "
            f"(batch_size x grad_accum x processes = {need}); lower {name}.batch_size or add text"
        )
    if not n_valid:
        raise BertpipeError(f"{corpus / 'valid.parquet'}: no text to evaluate on")


def _fit(ctx, d, p, mlm, tok, train_ex, valid_ex):
    """(the objective's model, the training result): the model trained by the one loop, resuming from scratch's
    checkpoints."""
    spec = MaskSpec.from_params(p)
    replace_ids = normal_token_ids(tok)
    eval_set = eval_batches(valid_ex, p, spec, tok.mask_token_id, replace_ids, tok.pad_token_id)
    pm = objective_model(mlm, p)

    def on_log(metrics: dict, step: int) -> None:
        ctx.log_metrics(metrics, step=step)

    res = train(pm, train_ex, eval_set, p, spec, tok, replace_ids, ctx.scratch, d, on_log,
                section=ctx.name)
    return pm, res


def _metrics(res, fresh: bool, restarts: int, pad: float, p) -> dict:
    """The run's numbers: the held-out losses, throughput, how it started, stopped and was padded."""
    tok_s = [h["tokens_per_s"] for h in res.history if "tokens_per_s" in h]
    metrics = {
        **loss_metrics(res),
        "tokens_per_s": float(np.median(tok_s)) if tok_s else 0.0,
        "fresh_head": int(fresh),
        "resumed_from_step": res.resumed_from,
        "restarts": restarts,  # by torchrun's elastic agent (--max-restarts), after a rank failed
        "padding_share": round(pad, 4),
        "max_seq_len": p.max_seq_len,
        # max_time_s is an optional wall-clock guard (off by default): when it ends the run, the output depends on
        # the machine's speed, so the manifest says so.
        "stopped_by_max_time_s": int(res.stopped == "max_time_s"),
    }
    if res.compile_s is not None:
        metrics["compile_seconds"] = round(res.compile_s, 1)
    for k in ("eval_pair_acc", "eval_mlm_loss", "eval_disc_loss", "eval_disc_acc"):
        if k in res.final_eval:
            metrics[k] = float(res.final_eval[k])
    return metrics


def _facts(ctx, p, d, res, metrics: dict, *, origin: str, fresh: bool, corpus: Path, segments: int, tokens: int,
           held_out: int, restarts: int, pad: float, chosen: str) -> dict[str, str]:
    """The report's facts: where it started, on what, with which objective, how it ran and what it reached."""
    facts = {
        "start": origin + ("; **fresh MLM head** (the checkpoint had none)" if fresh and "model" in ctx.inputs else ""),
        "corpus": f"`{corpus}` ({segments} training segments of <= {p.max_seq_len} tokens, {tokens} tokens; "
                  f"{held_out} held-out)",
        "objective": objective_words(p),
        "steps": f"{res.step} (stopped by {res.stopped}; resumed from step {res.resumed_from}"
                 + (f"; the job restarted {restarts} time(s) after a process failed)" if restarts else ")"),
        "precision": res.precision.words(),
        "compile": res.compile_why + (f" (~{res.compile_s:.0f} s compiling)" if res.compile_s is not None else ""),
        "attention": res.attention,
        "effective batch": f"{p.batch_size} x {p.grad_accum} accumulation x {d.world} process(es)",
        "throughput": f"{metrics['tokens_per_s']:.0f} non-padding tokens/s (median); padding {pad:.1%} of batch cells",
        f"held-out {p.objective.upper()} loss": f"{metrics['initial_eval_loss']:.3f} -> {metrics['eval_loss']:.3f} "
                                                f"(best {metrics['best_eval_loss']:.3f}; "
                                                f"{'generator ' if p.objective == 'rtd' else ''}"
                                                f"perplexity {metrics['eval_ppl']:.1f})",
        "saved checkpoint": chosen,
    }
    if p.objective == "rtd":
        facts["discriminator"] = (f"held-out loss {metrics['eval_disc_loss']:.4f}, accuracy {metrics['eval_disc_acc']:.3f}"
                                  " over all tokens; model/ is the discriminator's encoder (no MLM head: the fair MLM "
                                  "comparison and the encoder gate do not apply), generator/ the generator")
    return facts


def _write(ctx, p, pm, mlm, tok, res, metrics: dict, facts: dict, valid_ex) -> None:
    """``model/`` (with its card; RTD's ``generator/`` too), ``loss.png``, ``report.md`` with fill-mask samples,
    ``metrics.json``."""
    from bertpipe.lib import modelcard

    out = Path(ctx.out)
    pm.saved.save_pretrained(out / "model")
    tok.save_pretrained(out / "model")
    modelcard.write(out / "model", ctx, pipeline_tag="fill-mask" if p.objective == "mlm" else "feature-extraction",
                    base_model=str(ctx.inputs.get("model") or "a fresh model (from scratch)"),
                    metrics={k: v for k, v in metrics.items() if "loss" in k or k.startswith("eval_")})
    # RTD: the generator too (an MLM; not the encoder), for a look at what it fills in and to score it by hand
    filler = pm.generator if p.objective == "rtd" else mlm
    if p.objective == "rtd":
        pm.generator.save_pretrained(out / "generator")
        tok.save_pretrained(out / "generator")
    report.write_outputs(ctx, res, filler, tok, valid_ex, p.fill_mask_samples, facts, metrics,
                         f"{ctx.name}: {p.objective.upper()} loss")


def _collect_stores(ctx) -> None:
    """Token stores no stage output references, beyond the few most recently used, are removed (each corpus,
    tokenizer or packing change makes one; leased ones, in use by another process, stay)."""
    from bertpipe.lib import keyedstore

    keep = {r["key"] for r in ctx.counts.get("token_store", {}).values()} | keyedstore.referenced(ctx.cfg.work)
    keyedstore.collect(keyedstore.root_of(ctx.cfg.state), keep, log=ctx.log)


def _examples(ctx, tok, language: str, p, corpus: Path):
    """(train examples, held-out examples, train lengths) from the token store: tokenized and packed once per corpus,
    tokenizer and packing params, then memory-mapped by every start, resume, rerun and torchrun rank."""
    stores = {}
    for split, limit, seed in (("train", p.max_train_examples, p.seed), ("valid", p.eval_examples, p.seed + 1)):
        stores[split], ctx.counts.setdefault("token_store", {})[split] = tokstore.open_or_build(
            corpus, split, tok, language, p, limit, seed, ctx.cfg.state, log=ctx.log)
    train = stores["train"]
    # static masking keys its table by example object, so it needs one object per example (it holds a mask per
    # example in memory anyway); dynamic masking slices the memory map per batch
    return (list(train) if p.masking == "static" else train), list(stores["valid"]), train.lengths


def _padding_share(lengths: np.ndarray, p) -> float:
    batches = data.epoch_batches(lengths, p.batch_size, p.seed, 0, p.bucket)
    if not batches:
        return 0.0
    cell = lengths[np.stack(batches)]  # batches are all batch_size long
    return float(1 - cell.sum() / max(int(cell.max(axis=1).sum()) * cell.shape[1], 1))
