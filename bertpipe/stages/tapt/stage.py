"""The ``tapt/<task>`` stage: continued MLM on one task's own train texts, from the domain-adapted encoder.

Inputs: ``model`` (the pretrain stage's model/, the DAPT encoder) and ``task`` (the splits stage's dir of this task).
The texts are the task's train split minus any that leak its dev/test texts (``corpus``); they are packed, masked
and trained on with pretrain's own code (``data.build_examples`` in memory: a task's texts are small, so no token
store), for ``tapt.epochs`` passes at most ``tapt.max_steps``. Output: ``model/`` (save_pretrained model and
tokenizer, with its card), ``metrics.json``, ``loss.png``, ``report.md``; counts in the manifest say how many texts
were trained on, held out, and dropped as leaks.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

from bertpipe.infra.cores import use_training_threads
from bertpipe.infra.errors import BertpipeError
from bertpipe.lib.mlm import data, model, report
from bertpipe.lib.mlm.masking import MaskSpec, normal_token_ids
from bertpipe.lib.mlm.train import Dist, eval_batches, kept_weights, loss_metrics, train
from bertpipe.lib.modelinfo import clamp_seq_len
from bertpipe.stages.tapt.corpus import tapt_corpus


def planned_steps(p, segments: int) -> int:
    """``epochs`` passes over ``segments`` in optimizer steps, at most ``max_steps`` (epochs 0: ``max_steps``)."""
    if not p.epochs:
        return p.max_steps
    return max(1, min(p.max_steps, math.ceil(p.epochs * segments / (p.batch_size * p.grad_accum))))


def build(ctx, task: str) -> dict:
    p = ctx.params
    ctx.counts["torch_threads"] = use_training_threads(p.threads)  # the same in every door (bertpipe.infra.cores)
    ref = Path(ctx.inputs["model"])
    mlm, tok, fresh = model.load_checkpoint(ref, log=ctx.log)
    p = p.model_copy(update={"max_seq_len": clamp_seq_len(p.max_seq_len, mlm, f"{ctx.name}.max_seq_len", ctx.log)})
    model.check_compatible(mlm, tok, p.max_seq_len, str(ref))
    corpus = tapt_corpus(task, Path(ctx.inputs["task"]), ctx.cfg.params.prepare, p.holdout, p.seed)
    ctx.counts.update(corpus.counts)
    if corpus.counts["leak_dropped"]:
        ctx.log(f"{corpus.counts['leak_dropped']} train text(s) dropped: they leak a dev/test text of {task} "
                f"({corpus.counts['leak_dropped_by_reason']})")
    train_ex, valid_ex = _examples(ctx, corpus, tok, p)
    p = p.model_copy(update={"max_steps": planned_steps(p, len(train_ex))})
    ctx.log(f"continued from `{ref}`; {len(train_ex)} segments from {corpus.counts['trained_texts']} texts of "
            f"{task}, {len(valid_ex)} held-out; {p.max_steps} steps")
    pm, res = _fit(ctx, p, mlm, tok, train_ex, valid_ex)
    chosen = kept_weights(pm, ctx.scratch, p.output)
    metrics = {
        **loss_metrics(res),
        "epochs": round(res.step * p.batch_size * p.grad_accum / len(train_ex), 3),
        "fresh_head": int(fresh),
        "leak_dropped": corpus.counts["leak_dropped"],
    }
    ctx.counts.update(train_segments=len(train_ex), valid_segments=len(valid_ex),
                      train_tokens=int(sum(len(e.ids) for e in train_ex)), steps=res.step, stopped=res.stopped,
                      **res.precision.record())
    c = corpus.counts
    facts = {
        "start": f"the domain-adapted encoder `{ref}`" + ("; **fresh MLM head**" if fresh else ""),
        "corpus": f"{c['trained_texts']} train texts of `{task}` ({len(train_ex)} segments of <= {p.max_seq_len} "
                  f"tokens); {c['held_out_texts']} held out",
        "leak check": f"{c['leak_dropped']} of {c['train_texts']} train texts dropped for leaking one of "
                      f"{c['eval_texts']} dev/test texts ({c['leak_dropped_by_reason']})",
        "objective": f"MLM ({'whole-word' if p.whole_word else 'token'}, {p.masking}, p={p.mask_prob})",
        "steps": f"{res.step} ({metrics['epochs']} epochs; stopped by {res.stopped})",
        "precision": res.precision.words(),
        "held-out MLM loss": f"{metrics['initial_eval_loss']:.3f} -> {metrics['eval_loss']:.3f} "
                             f"(perplexity {metrics['eval_ppl']:.1f})",
        "saved checkpoint": chosen,
    }
    _write(ctx, task, ref, p, pm, mlm, tok, res, metrics, facts, valid_ex)
    return metrics


def _examples(ctx, corpus, tok, p) -> tuple[list, list]:
    """(train, held-out) segments packed in memory from the task's texts; a one-line error when they do not make a
    batch or hold nothing to evaluate on."""
    language = ctx.cfg.params.model.language
    train_ex = data.build_examples(corpus.train, tok, language, p, p.max_train_examples, p.seed)
    valid_ex = data.build_examples(corpus.held_out, tok, language, p, p.eval_examples, p.seed + 1)
    need = p.batch_size * p.grad_accum
    where = Path(ctx.inputs["task"]) / "train.jsonl"
    if len(train_ex) < need:
        raise BertpipeError(f"{where}: {len(train_ex)} packed segments of task text, fewer than one batch "
                            f"(tapt.batch_size x tapt.grad_accum = {need}); lower tapt.batch_size or add examples")
    if not valid_ex:
        raise BertpipeError(f"{where}: no held-out text to evaluate on (raise tapt.holdout)")
    return train_ex, valid_ex


def _fit(ctx, p, mlm, tok, train_ex: list, valid_ex: list):
    """(the MLM model, the training result): pretrain's loop in one process, on the current CUDA device where there
    is one (the finetunes' rule), else the CPU."""
    spec = MaskSpec.from_params(p)
    replace_ids = normal_token_ids(tok)
    eval_set = eval_batches(valid_ex, p, spec, tok.mask_token_id, replace_ids, tok.pad_token_id)
    pm = model.PretrainModel(mlm, pair=False)
    d = Dist(0, 1, torch.device(f"cuda:{torch.cuda.current_device()}" if torch.cuda.is_available() else "cpu"))
    res = train(pm, train_ex, eval_set, p, spec, tok, replace_ids, ctx.scratch, d,
                lambda m, step: ctx.log_metrics(m, step=step), section=ctx.name)
    return pm, res


def _write(ctx, task: str, ref: Path, p, pm, mlm, tok, res, metrics: dict, facts: dict, valid_ex: list) -> None:
    """``model/`` (with its card), ``loss.png``, ``report.md`` with fill-mask samples, ``metrics.json``."""
    from bertpipe.lib import modelcard

    out = Path(ctx.out)
    pm.saved.save_pretrained(out / "model")
    tok.save_pretrained(out / "model")
    modelcard.write(out / "model", ctx, pipeline_tag="fill-mask", base_model=str(ref),
                    metrics={k: v for k, v in metrics.items() if "loss" in k},
                    notes=f"Task-adaptive pretraining on the train texts of `{task}` (its dev/test texts excluded).")
    report.write_outputs(ctx, res, mlm, tok, valid_ex, p.fill_mask_samples, facts, metrics,
                         f"{ctx.name}: MLM loss on {task}'s train texts")
