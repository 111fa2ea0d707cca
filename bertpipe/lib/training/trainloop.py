"""The one training loop: pretrain and TAPT (MLM or RTD), finetune (a task head) and distill (the distiller) all
train through ``run``.

What differs between them is handed in: the model with its optimiser and schedule, the data (``feed``: one optimizer
step's micro-batches), the objective (``Objective``: a micro-batch's forward pass and its share of the step's loss),
the evaluation (a score, higher is better) and the ``Plan`` (how long; how often to log, evaluate and checkpoint).
What does not differ is here, in the order it happens: resume from the last checkpoint; forward and backward over the
micro-batches (gradient accumulation, DDP, autocast, fp16 loss scaling); clip, step, schedule; log; evaluate, keep the
best, stop early; checkpoint.

A hand-written loop rather than transformers' Trainer: the pretraining speed-ups (the MLM head only at the masked
positions, length buckets that DDP shards deterministically, masks that are a pure function of (seed, step, batch)),
exact resume after SIGKILL (atomic checkpoints), unfreezing phases and per-layer learning rates would each need a
Trainer override; here each is a few lines.
"""

from __future__ import annotations

import contextlib
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

from bertpipe.infra.device import Precision, autocast, grad_scaler
from bertpipe.infra.execution import compile_seconds
from bertpipe.lib.training.checkpoint import atomic_save, load_checkpoint
from bertpipe.lib.training.processes import Dist, all_sum

FP32 = Precision("fp32", "default")


def lr_lambda(schedule: str, warmup: int, total: int) -> Callable[[int], float]:
    """The lr factor at each step: linear warm-up over ``warmup`` steps, then linear, cosine or constant (pretraining's
    schedules; task models keep transformers' linear schedule, whose warm-up starts from lr 0)."""
    def f(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        if schedule == "constant":
            return 1.0
        frac = min(1.0, (step - warmup) / max(1, total - warmup))
        return 0.5 * (1 + math.cos(math.pi * frac)) if schedule == "cosine" else 1.0 - frac

    return f


# ---------------------------------------------------------------- the objective: what differs per stage


class Objective:
    """A stage's loss: the forward pass of one micro-batch, its share of the step's loss, and the loss terms the loop
    logs (``terms``, the first of them logged as ``loss``)."""

    terms: tuple[str, ...] = ("loss",)

    def shares(self, micro_batches: Sequence[dict], d: Dist) -> list[Callable | None]:
        """Per micro-batch: from its outputs to its share of the step's loss, or None when it scores nothing. Called
        once per step with the host tensors, so a step-wide normaliser costs no device sync."""
        raise NotImplementedError

    def forward(self, model: torch.nn.Module, batch: dict):
        raise NotImplementedError

    def logged(self, out) -> torch.Tensor:
        """The micro-batch's ``terms``, detached (a scalar for one term)."""
        raise NotImplementedError


def to_device(batch: dict, device: torch.device) -> dict:
    return {k: v.to(device, non_blocking=True) for k, v in batch.items()}


# ---------------------------------------------------------------- one optimizer step's gradients


def backward_step(model: torch.nn.Module, micro_batches: Sequence[dict], d: Dist | torch.device,
                  prec: Precision = FP32, scaler=None, seeds: list[int] | None = None,
                  *, objective: Objective) -> torch.Tensor:
    """Forward and backward over one optimizer step's micro-batches (``d``: the processes, or just the device);
    returns the logged terms of each micro-batch scored, a tensor on the device (copying it to the host waits for the
    device, so the loop does that only when it logs).

    Each micro-batch's loss is its ``objective`` share of the step's, so accumulated micro-batches (and DDP ranks)
    give the gradient of one big batch. DDP syncs gradients after the last micro-batch only. Under fp16 ``scaler``
    (a GradScaler) scales the loss. ``seeds[k]`` seeds the global RNG (dropout, RTD's sampling) before micro-batch k.
    """
    d = d if isinstance(d, Dist) else Dist(device=d)
    logged = []
    for k, (b, share) in enumerate(zip(micro_batches, objective.shares(micro_batches, d))):
        if share is None:
            continue
        b = to_device(b, d.device)
        sync = model.no_sync() if (d.world > 1 and k < len(micro_batches) - 1) else contextlib.nullcontext()
        if seeds is not None:
            torch.manual_seed(seeds[k])
        with sync:
            with autocast(d.device, prec):
                out = objective.forward(model, b)
            loss = share(out)
            (scaler.scale(loss) if scaler is not None else loss).backward()
        logged.append(objective.logged(out))
    return torch.stack(logged) if logged else torch.zeros(0, device=d.device)


# ---------------------------------------------------------------- the loop


@dataclass
class Plan:
    """How long a run is, and how often it logs, evaluates and checkpoints."""

    total: int  # optimizer steps
    eval_every: int
    log_every: int
    max_grad_norm: float = 0.0  # 0: no clipping
    save_every: int = 0  # with a scratch dir: a checkpoint every this many steps, and at the end
    patience: int = 0  # evaluations without improvement before stopping early; 0: never
    min_delta: float = 0.0  # the least rise of the score that counts as an improvement
    max_time_s: float = 0.0  # wall-clock budget; 0: none
    eval_at_start: bool = False  # score the starting point too, so the curve shows how far the loss fell
    extra_eval_steps: frozenset = frozenset()


@dataclass
class TrainResult:
    step: int = 0  # optimizer steps, the resumed runs' included
    # log points {"step", "loss", "lr", "tokens", "tokens_per_s", other terms} and evaluations {"step", "tokens", ...}
    history: list[dict] = field(default_factory=list)
    best: dict = field(default_factory=lambda: {"step": -1, "score": float("-inf")})  # and the evaluation's record
    best_kept: Any = None  # what the evaluation handed back to keep (its third value) at the best evaluation
    final_eval: dict = field(default_factory=dict)
    tokens: float = 0.0  # non-padding tokens trained, all processes, this run and the runs it resumed
    train_seconds: float = 0.0  # this process's time in optimizer steps (evaluations excluded)
    seconds: float = 0.0  # the whole loop's wall time
    stopped: str = "max_steps"  # max_steps | max_time_s | early_stop
    resumed_from: int = 0
    precision: Precision = FP32  # what it ran in, and why
    compiled: bool = False
    compile_why: str = ""  # the compile setting and why it was (not) applied
    compile_s: float | None = None  # the slow first steps' time over the median step: what compiling cost
    attention: str = ""  # the attention kernel it trained with, and why (bertpipe.infra.attention.choose)

    @property
    def steps(self) -> int:
        return self.step

    @property
    def best_step(self) -> int:
        return self.best["step"]

    @property
    def best_primary(self) -> float:
        return self.best["score"]

    @property
    def stopped_early(self) -> bool:
        return self.stopped == "early_stop"

    @property
    def bf16(self) -> bool:
        return self.precision.bf16

    @property
    def losses(self) -> list[tuple[int, float]]:
        """(step, mean loss since the last log point)."""
        return [(h["step"], h["loss"]) for h in self.history if "tokens_per_s" in h]

    @property
    def evals(self) -> list[dict]:
        return [h for h in self.history if "tokens_per_s" not in h]


def run(model: torch.nn.Module, opt: torch.optim.Optimizer, sched, feed: Callable[[int], tuple[list[dict], Any]],
        objective: Objective, evaluate: Callable[[int], tuple], plan: Plan, prec: Precision, d: Dist | None = None,
        *, scratch: Path | None = None, forward: torch.nn.Module | None = None, compiled: bool = False,
        compile_why: str = "", before_step: Callable[[int], None] | None = None,
        on_best: Callable[[int], None] | None = None, on_log: Callable[[dict, int], None] | None = None,
        desc: str = "train") -> TrainResult:
    """Train ``model`` for ``plan.total`` optimizer steps.

    ``feed(step)``: that step's micro-batches for this process and their dropout seeds (or None). ``evaluate(step)``:
    (score, record[, what to keep]), higher scores better; the record goes into the history. ``forward``: the module
    the training steps run through (a compiled view of ``model``), ``model`` itself by default. ``before_step(step)``
    runs first in every step (unfreezing phases). ``on_best(step)`` sees each new best evaluation (the one at the
    start, ``plan.eval_at_start``, is a reference point, never the best). With ``scratch`` the run checkpoints
    model, optimiser, schedule, scaler and history to ``scratch/last.pt`` and resumes from it, replaying the steps an
    uninterrupted run takes."""
    from tqdm.auto import tqdm

    d = Dist(device=next(model.parameters()).device) if d is None else d
    scaler = grad_scaler(d.device, prec)
    state = {"step": 0, "history": [], "best": TrainResult().best, "tokens": 0.0, "bad": 0}
    if scratch is not None:
        scratch.mkdir(parents=True, exist_ok=True)
        ck = load_checkpoint(scratch)
        if ck is not None:
            model.load_state_dict(ck["model"])
            opt.load_state_dict(ck["optim"])
            sched.load_state_dict(ck["sched"])
            if ck.get("scaler"):
                scaler.load_state_dict(ck["scaler"])
            state = ck["state"]
            if d.main:
                print(f"[{desc}] resuming from checkpoint at step {state['step']}", file=sys.stderr, flush=True)
    res = TrainResult(resumed_from=state["step"], precision=prec, compiled=compiled, compile_why=compile_why)
    forward = model if forward is None else forward
    if d.world > 1:
        forward = torch.nn.parallel.DistributedDataParallel(
            forward, device_ids=[d.device.index] if d.device.type == "cuda" else None)

    def evaluated(step: int) -> tuple:
        model.eval()
        score, record, *kept = evaluate(step)
        model.train()
        state["history"].append({"step": step, "tokens": state["tokens"], **record})
        res.final_eval = record
        return score, record, kept

    def save() -> None:
        if scratch is not None and d.main:
            atomic_save({"model": model.state_dict(), "optim": opt.state_dict(), "sched": sched.state_dict(),
                         "scaler": scaler.state_dict(), "state": state}, scratch / "last.pt")

    if plan.eval_at_start and not state["history"]:
        evaluated(0)
    model.train()
    bar = tqdm(total=plan.total, initial=state["step"], disable=not d.main, file=sys.stderr, dynamic_ncols=True,
               mininterval=2.0, leave=False, desc=f"{desc} {prec.dtype}", unit="step")
    # the micro-batches' logged terms since the last log point, on the device: copied to the host once per log
    # point, so no step waits for the device (on an accelerator the host queues the next step's kernels meanwhile)
    pending: list[torch.Tensor] = []
    tokens, t_window = 0.0, time.perf_counter()
    started = time.perf_counter()
    step_times: list[float] = []  # the first steps' times: what compiling cost
    while state["step"] < plan.total:
        step = state["step"]
        if before_step is not None:
            before_step(step)
        t0 = time.perf_counter()
        micro_batches, seeds = feed(step)
        pending.append(backward_step(forward, micro_batches, d, prec, scaler, seeds, objective=objective))
        tokens += sum(float(b["attention_mask"].sum()) for b in micro_batches)  # host tensors: no sync
        scaler.unscale_(opt)  # no-op unless fp16: clipping must see the true gradients
        if plan.max_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), plan.max_grad_norm)
        scaler.step(opt)  # fp16: skipped when the scaled gradients overflowed
        scaler.update()
        sched.step()
        opt.zero_grad(set_to_none=True)
        res.train_seconds += time.perf_counter() - t0
        if compiled and len(step_times) < 8:
            step_times.append(time.perf_counter() - t0)
        state["step"] = step = step + 1
        bar.update(1)
        stop = None
        if plan.max_time_s:
            over = float(time.perf_counter() - started > plan.max_time_s)
            if all_sum([over], d)[0] > 0:  # every process stops at the same step
                stop = "max_time_s"

        if step % plan.log_every == 0 or step == plan.total or stop:
            rows = torch.cat(pending).reshape(-1, len(objective.terms)).tolist()
            sums = [sum(col) for col in zip(*rows)] if rows else [0.0] * len(objective.terms)
            *sums, n, tok = all_sum([*sums, float(len(rows)), tokens], d)
            now = time.perf_counter()
            state["tokens"] += tok
            means = [s / max(n, 1) for s in sums]
            rec = {"step": step, "loss": means[0], "lr": sched.get_last_lr()[0], "tokens": state["tokens"],
                   "tokens_per_s": tok / max(now - t_window, 1e-9), **dict(zip(objective.terms[1:], means[1:]))}
            state["history"].append(rec)
            if d.main:
                bar.set_postfix(loss=f"{rec['loss']:.3f}", tok_s=f"{rec['tokens_per_s']:.0f}", refresh=False)
                if on_log is not None:
                    on_log({k: v for k, v in rec.items() if k != "step"}, step)
            pending, tokens, t_window = [], 0.0, now

        if step % plan.eval_every == 0 or step == plan.total or step in plan.extra_eval_steps or stop:
            score, record, kept = evaluated(step)
            if score > state["best"]["score"] + plan.min_delta or state["best"]["step"] < 0:
                state["best"], state["bad"] = {"step": step, "score": score, **record}, 0
                res.best_kept = kept[0] if kept else None
                if on_best is not None:
                    on_best(step)
            else:
                state["bad"] += 1
                if plan.patience and state["bad"] >= plan.patience and stop is None:
                    stop = "early_stop"
        if plan.save_every and (step % plan.save_every == 0 or step == plan.total or stop):
            save()
        if stop:
            res.stopped = stop
            break
    bar.close()
    if not res.final_eval:  # resumed at the very end: the history holds the last evaluation
        res.final_eval = next((h for h in reversed(state["history"]) if "tokens_per_s" not in h), {})
    res.step, res.history, res.best, res.tokens = state["step"], state["history"], state["best"], state["tokens"]
    res.seconds = time.perf_counter() - started
    res.compile_s = compile_seconds(step_times) if compiled else None
    return res
