"""The finetuning loop shared by every head: AdamW with warmup, layer-wise lr decay, gradual unfreezing, bf16
autocast, gradient accumulation, and early stopping on the dev metric with the best weights restored.

A hand-written loop rather than transformers' Trainer because unfreezing phases and per-layer learning rates are
the point here, and both are a few lines when the loop is ours.
"""

from __future__ import annotations

import math
import random
import re
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numpy as np
import torch

from bertpipe.device import Precision, adamw, autocast, grad_scaler, legacy_request, precision_for, weight_decay_groups
from bertpipe.execution import FINETUNE_AUTO_MIN_STEPS, compile_seconds, compiled, should_compile
from bertpipe.training.batches import batches, collate
from bertpipe.training.params import TrainParams

_LAYER = re.compile(r"\.layers?\.(\d+)\.")


def set_seed(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)


def n_layers(model: torch.nn.Module) -> int:
    return int(getattr(model.config, "num_hidden_layers", 0))


def depth(name: str, layers: int) -> int:
    """-1 for embeddings, i for encoder layer i, ``layers`` for everything else (pooler, task head)."""
    m = _LAYER.search(name)
    if m:
        return int(m.group(1))
    if "embeddings" in name:
        return -1
    return layers


def trainable(name: str, layers: int, top_layers: int) -> bool:
    """Whether a parameter trains in an unfreezing phase: the head always, plus the top ``top_layers`` layers."""
    if top_layers < 0:
        return True
    d = depth(name, layers)
    return d == layers or (d >= 0 and d >= layers - top_layers)


def param_groups(model: torch.nn.Module, tp: TrainParams) -> list[dict]:
    """AdamW groups: no decay for biases and LayerNorm; lr * decay^(distance from the top) per layer."""
    layers = n_layers(model)
    head_lr = tp.head_lr or tp.lr

    def lr_of(name: str) -> float:
        d = depth(name, layers)
        return head_lr if d == layers else tp.lr * tp.layer_lr_decay ** (layers - d if d >= 0 else layers + 1)

    return weight_decay_groups(model, tp.weight_decay, lr_of)


FP32 = Precision("fp32", "default")


def backward_step(model: torch.nn.Module, group: Sequence[dict], device: torch.device, prec: Precision = FP32,
                  scaler=None) -> torch.Tensor:
    """Forward and backward over one optimizer step's micro-batches; returns each micro-batch's mean loss (a 1-D
    tensor on the device: copying it to the host waits for the device, so the loop does that only when it logs).

    The loss is always the model's own (``model(**batch).loss``, labels included), so a wrapper such as the
    distiller adds its terms for every task type: popping NER's labels and scoring the logits here left a student
    learning from the hard labels only. Token-level labels (NER) are normalised by the labelled tokens of the whole
    step (as transformers does with ``num_items_in_batch``): the model's mean over a micro-batch's n labelled tokens,
    times n / (labelled tokens of the step), so micro-batches with unequal token counts give the gradient of one
    big batch. Example-level losses (classification, QA) are per-micro-batch means, averaged over the step's
    micro-batches. Under fp16 ``scaler`` (a GradScaler) scales the loss.
    """
    token_level = "labels" in group[0] and group[0]["labels"].dim() == 2
    # the label counts come from the host tensors (collate's): counting them costs no device sync
    n_step = sum(int((b["labels"] != -100).sum()) for b in group) if token_level else 0
    out = []
    for b in group:
        n = int((b["labels"] != -100).sum()) if token_level else 0
        if token_level and n == 0:  # nothing scored (a mean over no tokens is NaN): no gradient, no loss
            continue
        b = {k: v.to(device, non_blocking=True) for k, v in b.items()}
        with autocast(device, prec):
            res = model(**b)
        loss = res.loss.float()
        share = loss * (n / max(n_step, 1)) if token_level else loss / len(group)
        (scaler.scale(share) if scaler is not None else share).backward()
        out.append(loss.detach())
    return torch.stack(out) if out else torch.zeros(0, device=device)


@dataclass
class TrainResult:
    losses: list[tuple[int, float]] = field(default_factory=list)  # (optimizer step, mean loss since last point)
    evals: list[dict] = field(default_factory=list)  # {"step", "epoch", "primary", **dev metrics}
    best_step: int = 0
    best_primary: float = float("-inf")
    best_kept: Any = None  # what ``evaluate`` handed back to keep (its third value) at the best evaluation
    steps: int = 0
    stopped_early: bool = False
    seconds: float = 0.0
    bf16: bool = False
    precision: Precision = FP32
    compiled: bool = False
    compile_why: str = ""  # the compile setting and why it was (not) applied
    compile_s: float | None = None  # the slow first steps' time over the median step: what compiling cost


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
    compile_key: str = "finetune.train.compile",
) -> TrainResult:
    from tqdm.auto import tqdm
    from transformers import get_linear_schedule_with_warmup

    set_seed(seed)
    device = next(model.parameters()).device
    prec = precision_for(legacy_request(tp.precision, tp.bf16), device)
    scaler = grad_scaler(device, prec)
    res = TrainResult(bf16=prec.bf16, precision=prec)
    layers = n_layers(model)
    per_epoch = max(1, math.ceil(len(feats) / (tp.batch_size * tp.grad_accum)))
    total = max(1, math.ceil(tp.epochs * per_epoch))
    eval_every = max(1, per_epoch // tp.evals_per_epoch)
    res.compiled, res.compile_why = should_compile(tp.compile, total, device, compile_key, FINETUNE_AUTO_MIN_STEPS)
    # the training forward runs through the compiled view; evaluation, the best weights and the model handed back
    # are the eager module's (the view shares its parameters)
    forward = compiled(model) if res.compiled else model
    step_times: list[float] = []
    # Phase i ends at optimizer step ends[i]; after the listed phases everything trains.
    ends, acc = [], 0.0
    for ph in tp.unfreeze:
        acc += ph.epochs
        ends.append(min(total, round(acc * per_epoch)))
    phases = [ph.top_layers for ph in tp.unfreeze] + [-1]

    opt = adamw(param_groups(model, tp), lr=tp.lr)  # fused on the CPU and CUDA
    sched = get_linear_schedule_with_warmup(opt, round(tp.warmup_ratio * total), total)
    gen = random.Random(seed)
    best_state: dict | None = None
    bad_evals, phase, step, micro = 0, -1, 0, 0
    # the micro-batch losses since the last log point, on the device: copied to the host once per log point, so no
    # step waits for the device (on an accelerator the host queues the next step's kernels meanwhile)
    pending: list[torch.Tensor] = []
    started = time.time()
    bar = tqdm(total=total, desc=f"{desc} {prec.dtype}", unit="step", file=sys.stderr, leave=False, mininterval=2.0)

    def set_phase(i: int) -> None:
        for name, p in model.named_parameters():
            p.requires_grad_(trainable(name, layers, phases[i]))

    def do_eval() -> bool:
        nonlocal best_state, bad_evals
        model.eval()
        primary, metrics, *kept = evaluate(model)
        model.train()
        res.evals.append({"step": step, "epoch": step / per_epoch, "primary": primary, **metrics})
        if log_metrics:
            log_metrics({f"dev_{k}": v for k, v in metrics.items() if isinstance(v, (int, float))}, step)
        if primary > res.best_primary + tp.early_stopping.min_delta or best_state is None:
            res.best_primary, res.best_step, bad_evals = primary, step, 0
            res.best_kept = kept[0] if kept else None
            best_state = {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}
            return False
        bad_evals += 1
        return tp.early_stopping.patience > 0 and bad_evals >= tp.early_stopping.patience

    model.train()
    stop = False
    while step < total and not stop:
        epoch = batches(feats, tp.batch_size, gen)
        for g in range(0, len(epoch), tp.grad_accum):  # one optimizer step: up to grad_accum micro-batches
            want = next((i for i, e in enumerate(ends) if step < e), len(ends))
            if want != phase:
                if phase >= 0 and on_phase_end:
                    on_phase_end(phase, model)
                phase = want
                set_phase(phase)
            t0 = time.perf_counter()
            group = [collate([feats[i] for i in idx], pad_id) for idx in epoch[g : g + tp.grad_accum]]
            pending.append(backward_step(forward, group, device, prec, scaler))
            micro += len(pending[-1])
            scaler.unscale_(opt)  # no-op unless fp16: clipping must see the true gradients
            if tp.max_grad_norm > 0:
                torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], tp.max_grad_norm)
            scaler.step(opt)  # fp16: skipped when the scaled gradients overflowed
            scaler.update()
            sched.step()
            opt.zero_grad(set_to_none=True)
            if res.compiled and len(step_times) < 8:
                step_times.append(time.perf_counter() - t0)
            step += 1
            bar.update(1)
            if step % max(1, total // 50) == 0 or step == total:
                losses = torch.cat(pending).tolist()
                pending.clear()
                mean = sum(losses) / max(len(losses), 1)
                res.losses.append((step, mean))
                bar.set_postfix(loss=f"{mean:.3f}", ex_s=f"{micro * tp.batch_size / (time.time() - started):.1f}")
                if log_metrics:
                    log_metrics({"train_loss": mean, "lr": sched.get_last_lr()[0]}, step)
            if step % eval_every == 0 or step == total:
                if do_eval():
                    stop = res.stopped_early = True
                    break
            if step >= total:
                break
    bar.close()
    if not res.evals or res.evals[-1]["step"] != step:
        do_eval()
    if on_phase_end and phase >= 0:
        on_phase_end(phase, model)
    for p in model.parameters():
        p.requires_grad_(True)
    if best_state is not None:
        model.load_state_dict(best_state)
    res.steps, res.seconds = step, time.time() - started
    res.compile_s = compile_seconds(step_times) if res.compiled else None
    return res
