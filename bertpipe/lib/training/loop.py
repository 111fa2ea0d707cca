"""Task models (finetune's heads, distill's distiller) on featurised examples, through the one training loop
(``bertpipe.lib.training.trainloop``): epochs of shuffled length-bucketed batches, the model's own loss, layer-wise lr
decay, gradual unfreezing, and early stopping on the dev metric with the best weights restored."""

from __future__ import annotations

import functools
import math
import random
from typing import Callable, Sequence

import numpy as np
import torch

from bertpipe.infra import attention
from bertpipe.infra.device import adamw, precision_for
from bertpipe.infra.execution import FINETUNE_AUTO_MIN_STEPS, should_compile
from bertpipe.infra.execution import compiled as compiled_view
from bertpipe.lib.training.batches import batches, collate
from bertpipe.lib.training.layers import n_layers, param_groups, trainable
from bertpipe.lib.training.params import TrainParams
from bertpipe.lib.training.trainloop import Objective, Plan, TrainResult, backward_step, run


def set_seed(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)


class ModelLoss(Objective):
    """The model's own loss (``model(**batch).loss``, labels included): task heads, and the distiller, which adds its
    terms for every task type (popping NER's labels and scoring the logits here would leave a student learning from
    the hard labels only).

    Token-level labels (NER) are normalised by the labelled tokens of the whole step (as transformers does with
    ``num_items_in_batch``): the model's mean over a micro-batch's n labelled tokens, times n / (labelled tokens of
    the step), so micro-batches with unequal token counts give the gradient of one big batch; a micro-batch with no
    labelled token (a mean over nothing is NaN) is skipped. Example-level losses (classification, QA) are
    per-micro-batch means, averaged over the step's micro-batches."""

    def shares(self, group, d):
        if not ("labels" in group[0] and group[0]["labels"].dim() == 2):
            return [lambda out: out.loss.float() / len(group)] * len(group)
        counts = [int((b["labels"] != -100).sum()) for b in group]
        n_step = sum(counts)
        return [(lambda out, n=n: out.loss.float() * (n / max(n_step, 1))) if n else None for n in counts]

    def forward(self, model, batch):
        return model(**attention.model_batch(model, batch))

    def logged(self, out):
        return out.loss.float().detach()


MODEL_LOSS = ModelLoss()


# the loop's step with the model's own loss
backward_step = functools.partial(backward_step, objective=MODEL_LOSS)


def train(
    model: torch.nn.Module,
    feats: Sequence[dict],
    tp: TrainParams,
    evaluate: Callable[[torch.nn.Module], tuple],  # (primary, metrics[, what to keep if this evaluation is the best])
    pad_id: int,
    seed: int,
    log_metrics: Callable[[dict, int], None] | None = None,
    on_phase_end: Callable[[int, torch.nn.Module], None] | None = None,
    desc: str = "finetune",
    section: str = "finetune.train",
) -> TrainResult:
    """Finetune (or distill) ``model``: epochs of shuffled length-bucketed batches, AdamW with layer-wise lr decay
    and transformers' linear warm-up (from lr 0) and decay, gradual unfreezing, and early stopping on the dev metric
    with the best weights restored. ``section``: where ``tp`` comes from in the params, which errors name.

    A task model (a transformers model) trains with ``tp.attention``'s kernel; anything else (the distiller, which
    calls its teacher with the batch's padding mask) with the mask."""
    from transformers import get_linear_schedule_with_warmup

    set_seed(seed)
    device = next(model.parameters()).device
    prec = precision_for(tp.precision, device)
    layers = n_layers(model)
    per_epoch = max(1, math.ceil(len(feats) / (tp.batch_size * tp.grad_accum)))
    total = max(1, math.ceil(tp.epochs * per_epoch))
    compile_it, compile_why = should_compile(tp.compile, total, device, f"{section}.compile", FINETUNE_AUTO_MIN_STEPS)
    kind, attention_why = attention.choose(tp.attention, device, f"{section}.attention")
    if not hasattr(model, "set_attn_implementation"):  # the distiller
        kind, attention_why = "mask", "attention: mask (the distiller's teacher reads the padding mask)"
    # Phase i ends at optimizer step ends[i]; after the listed phases everything trains.
    ends, acc = [], 0.0
    for ph in tp.unfreeze:
        acc += ph.epochs
        ends.append(min(total, round(acc * per_epoch)))
    phases = [ph.top_layers for ph in tp.unfreeze] + [-1]
    opt = adamw(param_groups(model, tp), lr=tp.lr)  # fused on the CPU and CUDA
    sched = get_linear_schedule_with_warmup(opt, round(tp.warmup_ratio * total), total)
    gen = random.Random(seed)
    phase, best = -1, {}

    def steps():  # one optimizer step's micro-batches at a time (up to grad_accum), epoch after epoch
        while True:
            order = batches(feats, tp.batch_size, gen)
            for g in range(0, len(order), tp.grad_accum):
                yield [attention.prepare(collate([feats[i] for i in idx], pad_id), kind)
                       for idx in order[g : g + tp.grad_accum]], None

    def unfreeze(step: int) -> None:
        nonlocal phase
        want = next((i for i, e in enumerate(ends) if step < e), len(ends))
        if want != phase:
            if phase >= 0 and on_phase_end:
                on_phase_end(phase, model)
            phase = want
            for name, p in model.named_parameters():
                p.requires_grad_(trainable(name, layers, phases[phase]))

    def dev(step: int) -> tuple:
        primary, metrics, *kept = evaluate(model)
        if log_metrics:
            log_metrics({f"dev_{k}": v for k, v in metrics.items() if isinstance(v, (int, float))}, step)
        return (primary, {"epoch": step / per_epoch, "primary": primary, **metrics}, *kept)

    def keep(step: int) -> None:
        best["state"] = {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}

    def log(rec: dict, step: int) -> None:
        if log_metrics:
            log_metrics({"train_loss": rec["loss"], "lr": rec["lr"]}, step)

    stream = steps()
    plan = Plan(total, eval_every=max(1, per_epoch // tp.evals_per_epoch), log_every=max(1, total // 50),
                max_grad_norm=tp.max_grad_norm, patience=tp.early_stopping.patience,
                min_delta=tp.early_stopping.min_delta)
    # the training forward runs through the compiled view; evaluation, the best weights and the model handed back
    # are the eager module's (the view shares its parameters)
    with attention.kernel(model, kind, f"{section}.attention", training=True):
        res = run(model, opt, sched, lambda step: next(stream), MODEL_LOSS, dev, plan, prec,
                  forward=compiled_view(model) if compile_it else None, compiled=compile_it, compile_why=compile_why,
                  before_step=unfreeze, on_best=keep, on_log=log, desc=desc)
    res.attention = attention_why
    if on_phase_end and phase >= 0:
        on_phase_end(phase, model)
    for p in model.parameters():
        p.requires_grad_(True)
    if best:
        model.load_state_dict(best["state"])
    return res
