"""The training loop: bucketed batches, dynamic masking, bf16 autocast, DDP, atomic checkpoints and exact resume.

Why a short loop of our own rather than transformers' Trainer: the speed-ups this stage exists for (MLM head only at
the chosen positions, length buckets that DDP shards deterministically, masks that are a pure function of
(seed, step, batch)) would each need a Trainer override (compute_loss, get_train_dataloader, the collator's RNG), and
exact resume after SIGKILL needs atomic checkpoints that Trainer does not write. Everything that makes the result a
pure function of (params, data, step) is in this file: data order = f(seed, epoch); mask and dropout = f(seed, step,
j), j the micro-batch's place among the step's ``grad_accum x processes`` batches, so N processes with accumulation
G train on the same batches with the same masks as one process with N x G; a checkpoint holds model, optimiser,
schedule and history, so a resumed run replays the same steps as an uninterrupted one.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import torch
import torch.distributed as dist
from tqdm.auto import tqdm

from bertpipe.device import Precision, autocast, grad_scaler, precision_for
from bertpipe.errors import BertpipeError
from bertpipe.execution import compile_in_place, compile_seconds, should_compile
from bertpipe.pretrain.data import Example, collate, epoch_batches
from bertpipe.pretrain.masking import IGNORE, MaskSpec, mask_batch, seeded
from bertpipe.pretrain.model import PretrainModel


# ---------------------------------------------------------------- processes


@dataclass
class Dist:
    rank: int = 0
    world: int = 1
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))

    @property
    def main(self) -> bool:
        return self.rank == 0


def setup_distributed() -> Dist:
    """One process per device under torchrun (WORLD_SIZE/RANK/LOCAL_RANK set); a single process otherwise.

    ``BERTPIPE_DIST_TIMEOUT_S`` bounds how long a collective waits for a rank that is gone (default: torch's 30
    minutes for gloo, 10 for NCCL); past it the survivors fail and torchrun's agent can restart the group."""
    from datetime import timedelta

    world = int(os.environ.get("WORLD_SIZE", "1"))
    local = int(os.environ.get("LOCAL_RANK", "0"))
    cuda = torch.cuda.is_available()
    device = torch.device(f"cuda:{local}" if cuda else "cpu")
    if cuda:
        torch.cuda.set_device(device)
    if world > 1 and not dist.is_initialized():
        limit = os.environ.get("BERTPIPE_DIST_TIMEOUT_S")
        dist.init_process_group(backend="nccl" if cuda else "gloo",
                                timeout=timedelta(seconds=float(limit)) if limit else None)
    if dist.is_initialized():
        return Dist(dist.get_rank(), dist.get_world_size(), device)
    return Dist(0, 1, device)


def elastic_restarts(d: Dist) -> int:
    """How many times torchrun's elastic agents restarted this job's worker group (``--max-restarts``): the highest
    ``TORCHELASTIC_RESTART_COUNT`` of any rank. Each agent counts only the restarts its own workers' failures caused
    (an agent that restarts because another node rejoins does not count), so ranks disagree and the maximum is the
    job's. 0 outside torchrun."""
    n = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    if d.world == 1:
        return n
    t = torch.tensor([n], dtype=torch.int64, device=d.device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t.item())


def state_digest(module: torch.nn.Module) -> str:
    """sha256 of a module's tensors (sorted by name): equal digests mean bit-identical weights."""
    import hashlib

    h = hashlib.sha256()
    for k, v in sorted(module.state_dict().items()):
        h.update(k.encode())
        h.update(v.detach().float().contiguous().cpu().numpy().tobytes())
    return h.hexdigest()


def all_sum(values: list[float], d: Dist) -> list[float]:
    if d.world == 1:
        return values
    t = torch.tensor(values, dtype=torch.float64, device=d.device)
    dist.all_reduce(t)
    return t.tolist()


# ---------------------------------------------------------------- checkpoints


def plain(obj):
    """``obj`` as tensors and plain Python values only (numpy scalars become numbers), so it loads with
    ``weights_only=True``: a checkpoint is data, never code to unpickle."""
    if isinstance(obj, torch.Tensor) or obj is None or isinstance(obj, (str, int, float, bool)):
        return obj
    if isinstance(obj, dict):
        return {k: plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(plain(v) for v in obj)
    if hasattr(obj, "item"):
        return obj.item()
    raise TypeError(f"checkpoint value of type {type(obj).__name__} is not a tensor or plain value")


def atomic_save(obj, path: Path) -> None:
    """Write then rename: a reader (or a resumed run after SIGKILL) sees the old file or the new one, never half."""
    from bertpipe.outputs import atomic_file

    with atomic_file(path) as tmp:
        torch.save(plain(obj), tmp)


def safe_load(path: Path) -> dict:
    """Load a checkpoint with ``weights_only=True``; anything else in it (a crafted pickle) is refused."""
    import pickle

    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, ValueError) as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        raise BertpipeError(f"{path}: not a checkpoint of tensors and plain values, refusing to load it ({first}); "
                            f"delete it to start this stage over") from None


def load_checkpoint(scratch: Path) -> dict | None:
    p = scratch / "last.pt"
    return safe_load(p) if p.is_file() else None


# ---------------------------------------------------------------- schedule


def lr_lambda(schedule: str, warmup: int, total: int) -> Callable[[int], float]:
    def f(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        if schedule == "constant":
            return 1.0
        frac = min(1.0, (step - warmup) / max(1, total - warmup))
        return 0.5 * (1 + math.cos(math.pi * frac)) if schedule == "cosine" else 1.0 - frac

    return f


def make_optimizer(model: torch.nn.Module, p) -> torch.optim.Optimizer:
    """AdamW, fused on the CPU and CUDA (``device.adamw``): the per-parameter loop was ~12% of a 6L/384H step on the
    CPU (torch.profiler; bench/bench_pretrain.py --profile)."""
    from bertpipe.device import adamw, weight_decay_groups

    return adamw(weight_decay_groups(model, p.weight_decay), lr=p.lr, betas=(0.9, 0.98), eps=1e-6)


FP32 = Precision("fp32", "default")


# ---------------------------------------------------------------- batches on device


class Batches:
    """Micro-batch ``k`` of this process, for any global step: a pure function of (seed, epoch, rank)."""

    def __init__(self, examples: list[Example], p, d: Dist, pad_id: int):
        self.examples, self.p, self.d, self.pad_id = examples, p, d, pad_id
        self.lengths = getattr(examples, "lengths", None)  # a token store has them (no per-example loop)
        if self.lengths is None:
            self.lengths = np.array([len(e) for e in examples])
        n = len(epoch_batches(self.lengths, p.batch_size, p.seed, 0, p.bucket)) // d.world
        self.per_epoch = (n // p.grad_accum) * p.grad_accum  # micro-batches per process per epoch
        self._epoch, self._cache = -1, []

    def get(self, k: int) -> list[Example]:
        epoch, i = divmod(k, self.per_epoch)
        if epoch != self._epoch:
            all_b = epoch_batches(self.lengths, self.p.batch_size, self.p.seed, epoch, self.p.bucket)
            self._cache, self._epoch = all_b[self.d.rank :: self.d.world], epoch
        return [self.examples[j] for j in self._cache[i]]


def to_device(batch: dict, device: torch.device) -> dict:
    return {k: v.to(device, non_blocking=True) for k, v in batch.items()}


def static_masked(examples: list[Example], spec: MaskSpec, mask_id: int, replace_ids, seed: int, pad_id: int) -> dict:
    """Mask each example once, from a generator seeded by its index (static masking; also the eval set)."""
    out = {}
    for i, e in enumerate(examples):
        b = collate([e], pad_id)
        ids, labels = mask_batch(b["input_ids"], b["word_ids"], spec, mask_id, replace_ids, seeded(seed, 7, i))
        out[id(e)] = (ids[0], labels[0])
    return out


def apply_static(batch: dict, examples: list[Example], table: dict) -> tuple[torch.Tensor, torch.Tensor]:
    ids = batch["input_ids"].clone()
    labels = torch.full_like(ids, IGNORE)
    for r, e in enumerate(examples):
        m_ids, m_labels = table[id(e)]
        ids[r, : len(m_ids)], labels[r, : len(m_labels)] = m_ids, m_labels
    return ids, labels


def eval_batches(examples: list[Example], p, spec: MaskSpec, mask_id: int, replace_ids, pad_id: int) -> list[dict]:
    """Held-out batches with one fixed mask, so every evaluation (and every run) scores the same masked tokens."""
    order = np.argsort([len(e) for e in examples], kind="stable")
    out = []
    for s in range(0, len(order), p.batch_size):
        chunk = [examples[j] for j in order[s : s + p.batch_size]]
        b = collate(chunk, pad_id)
        b["input_ids"], b["labels"] = mask_batch(
            b["input_ids"], b["word_ids"], spec, mask_id, replace_ids, seeded(p.seed, 99991, s)
        )
        out.append(b)
    return out


@torch.no_grad()
def evaluate(model: PretrainModel, batches: list[dict], d: Dist, prec: Precision = FP32) -> dict:
    """Held-out losses. ``eval_loss`` is the objective trained (MLM; RTD: generator MLM + weight x discriminator),
    what ``output: best`` and early stopping compare; ``eval_ppl`` is the MLM's (RTD: the generator's)."""
    was = model.training
    model.eval()
    sums = [0.0] * 7  # mlm nll, masked, pair right, pairs, disc loss, tokens, disc right
    weight = 0.0
    for b in batches[d.rank :: d.world]:
        b = to_device(b, d.device)
        with autocast(d.device, prec):
            out = model(b["input_ids"], b["attention_mask"], b["token_type_ids"], b["labels"], b["pair_labels"],
                        doc_ids=b.get("doc_ids"))
        sums[0] += float(out["mlm_sum"])
        sums[1] += float(out["n_masked"])
        if "pair_acc" in out:
            sums[2] += float(out["pair_acc"]) * len(b["pair_labels"])
            sums[3] += len(b["pair_labels"])
        if "disc_sum" in out:
            weight = out["disc_weight"]
            sums[4] += float(out["disc_sum"])
            sums[5] += float(out["n_tokens"])
            sums[6] += float(out["disc_correct"])
    mlm_sum, n, pair_ok, pairs, disc_sum, tokens, disc_ok = all_sum(sums, d)
    model.train(was)
    loss = mlm_sum / max(n, 1.0)
    res = {"eval_loss": loss, "eval_ppl": math.exp(min(loss, 50.0))}
    if pairs:
        res["eval_pair_acc"] = pair_ok / pairs
    if tokens:
        disc = disc_sum / tokens
        res.update(eval_loss=loss + weight * disc, eval_mlm_loss=loss, eval_disc_loss=disc,
                   eval_disc_acc=disc_ok / tokens)
    return res


# ---------------------------------------------------------------- one optimizer step's gradients


def backward_step(model, micro_batches: list[dict], d: Dist, prec: Precision = FP32, scaler=None,
                  seeds: list[int] | None = None) -> list[dict]:
    """Forward and backward over one optimizer step's micro-batches; returns each micro-batch's outputs.

    The MLM loss is normalised by the masked tokens of the whole step, summed over micro-batches and processes (as
    transformers does with ``num_items_in_batch``), so every masked token weighs the same however the step is cut:
    micro-batches with unequal masked counts give the gradient of one big batch. DDP averages gradients over
    processes, hence the factor ``world``. The pair (NSP/SOP) loss is per example: a mean per micro-batch, averaged.
    RTD's discriminator loss (``disc_sum``, over every non-padding token) is normalised the same way, by the step's
    non-padding tokens, and weighted by ``disc_weight``. Under fp16 ``scaler`` (a GradScaler) scales the loss.
    ``seeds[k]`` seeds the global RNG (dropout, RTD's sampling) before micro-batch ``k``.
    """
    n_step, tok_step = all_sum([float(sum(int((b["labels"] != IGNORE).sum()) for b in micro_batches)),
                                float(sum(int(b["attention_mask"].sum()) for b in micro_batches))], d)
    scale = d.world / max(n_step, 1.0)
    outs = []
    for k, b in enumerate(micro_batches):
        b = to_device(b, d.device)
        last = k == len(micro_batches) - 1
        sync = model.no_sync() if (d.world > 1 and not last) else contextlib.nullcontext()
        if seeds is not None:
            torch.manual_seed(seeds[k])
        with sync:
            with autocast(d.device, prec):
                out = model(b["input_ids"], b["attention_mask"], b["token_type_ids"], b["labels"], b["pair_labels"],
                            doc_ids=b.get("doc_ids"))
            loss = out["mlm_sum"] * scale
            if "disc_sum" in out:
                loss = loss + out["disc_weight"] * out["disc_sum"] * (d.world / max(tok_step, 1.0))
            if "pair_loss" in out:
                loss = loss + out["pair_loss"] / len(micro_batches)
            (scaler.scale(loss) if scaler is not None else loss).backward()
        outs.append(out)
    return outs


# ---------------------------------------------------------------- the loop


@dataclass
class TrainResult:
    step: int
    history: list[dict]
    best: dict  # {"eval_loss", "step"}
    final_eval: dict
    tokens: float  # non-padding tokens seen, all processes, this run and the runs it resumed
    train_seconds: float  # this process's training time (excluding evals)
    stopped: str  # max_steps | max_time_s | early_stop
    resumed_from: int
    precision: Precision = FP32  # what it ran in, and why
    compiled: bool = False
    compile_why: str = ""  # the compile setting and why it was (not) applied
    compile_s: float | None = None  # the slow first steps' time over the median step: what compiling cost


def train(
    pm: PretrainModel,
    train_ex: list[Example],
    eval_set: list[dict],
    p,
    spec: MaskSpec,
    tokenizer,
    replace_ids: torch.Tensor,
    scratch: Path,
    d: Dist,
    on_log: Callable[[dict, int], None] = lambda m, s: None,
    extra_eval_steps: set[int] = frozenset(),
    compile_key: str = "pretrain.compile",
) -> TrainResult:
    prec = precision_for(p.precision, d.device)
    compiled, compile_why = should_compile(p.compile, p.max_steps, d.device, compile_key)
    if d.main:
        print(f"[pretrain] precision {prec.words()}; {compile_why}", file=sys.stderr, flush=True)
    scaler = grad_scaler(d.device, prec)
    pm.to(d.device)
    opt = make_optimizer(pm, p)
    warmup = int(math.ceil(p.warmup_ratio * p.max_steps))
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda(p.schedule, warmup, p.max_steps))
    state = {"step": 0, "history": [], "best": {"eval_loss": float("inf"), "step": -1}, "tokens": 0.0, "bad": 0}
    scratch.mkdir(parents=True, exist_ok=True)
    ck = load_checkpoint(scratch)
    if ck is not None:
        pm.load_state_dict(ck["model"])
        opt.load_state_dict(ck["optim"])
        sched.load_state_dict(ck["sched"])
        if ck.get("scaler"):
            scaler.load_state_dict(ck["scaler"])
        state = ck["state"]
        if d.main:
            print(f"[pretrain] resuming from checkpoint at step {state['step']}", file=sys.stderr, flush=True)
    resumed_from = state["step"]
    if compiled:
        compile_in_place(pm)
    model = pm
    if d.world > 1:
        model = torch.nn.parallel.DistributedDataParallel(pm, device_ids=[d.device.index] if d.device.type == "cuda" else None)
    batches = Batches(train_ex, p, d, tokenizer.pad_token_id)
    static = (
        static_masked(train_ex, spec, tokenizer.mask_token_id, replace_ids, p.seed, tokenizer.pad_token_id)
        if p.masking == "static" else None
    )
    if not state["history"]:  # the starting point, so the curve shows how far the loss fell
        state["history"].append({"step": 0, "tokens": 0.0, **evaluate(pm, eval_set, d, prec)})
        if d.main:
            on_log({k: v for k, v in state["history"][0].items() if k.startswith("eval")}, 0)
    pm.train()
    bar = tqdm(total=p.max_steps, initial=state["step"], disable=not d.main, file=sys.stderr, dynamic_ncols=True,
               desc=f"pretrain {prec.dtype}", unit="step", mininterval=2.0)
    window = [0.0, 0.0, 0.0, 0.0, 0.0]  # loss sum, pair loss sum, micro-batches, non-padding tokens, disc loss sum
    t_window, train_s, stopped, started = time.perf_counter(), 0.0, "max_steps", time.perf_counter()
    final_eval: dict = {}
    # BERTPIPE_PRETRAIN_TRACE=<dir>: each process records what it trained on and its final weights (DDP tests)
    trace_dir = os.environ.get("BERTPIPE_PRETRAIN_TRACE")
    trace = {"rank": d.rank, "world": d.world, "batches": []} if trace_dir else None
    step_times: list[float] = []  # the first steps' times: what compiling cost

    def save(step: int) -> None:
        if d.main:
            atomic_save({"model": pm.state_dict(), "optim": opt.state_dict(), "sched": sched.state_dict(),
                         "scaler": scaler.state_dict(), "state": state}, scratch / "last.pt")

    while state["step"] < p.max_steps:
        step = state["step"]
        t0 = time.perf_counter()
        micro_batches, seeds = [], []
        for micro in range(p.grad_accum):
            # this micro-batch's place among the step's batches (Batches deals them to ranks in turn): masks and
            # dropout follow it, so the step is the same however it is cut into processes and accumulation
            j = d.rank + d.world * micro
            seeds.append(int(seeded(p.seed, step, j, 3).initial_seed()) % (1 << 62))  # dropout stream
            exs = batches.get(step * p.grad_accum + micro)
            if trace is not None:
                trace["batches"].append([int(e.ids.sum()) for e in exs])  # a cheap identity of each example
            b = collate(exs, tokenizer.pad_token_id)
            if static is not None:
                ids, labels = apply_static(b, exs, static)
            else:
                gen = seeded(p.seed, step, j, 0)
                ids, labels = mask_batch(b["input_ids"], b["word_ids"], spec, tokenizer.mask_token_id, replace_ids, gen)
            b["input_ids"], b["labels"] = ids, labels
            micro_batches.append(b)
        # Losses stay device tensors until the log step: a float() per micro-batch is a host-device sync per step.
        for out, b in zip(backward_step(model, micro_batches, d, prec, scaler, seeds), micro_batches):
            window[0] += out["mlm_loss"].detach()
            window[1] += out["pair_loss"].detach() if "pair_loss" in out else 0.0
            window[2] += 1
            window[3] += float(b["attention_mask"].sum())  # a host tensor: no sync
            window[4] += out["disc_loss"].detach() if "disc_loss" in out else 0.0
        scaler.unscale_(opt)  # no-op unless fp16: clipping must see the true gradients
        if p.max_grad_norm > 0:
            torch.nn.utils.clip_grad_norm_(pm.parameters(), p.max_grad_norm)
        scaler.step(opt)  # fp16: skipped when the scaled gradients overflowed
        scaler.update()
        sched.step()
        opt.zero_grad(set_to_none=True)
        train_s += time.perf_counter() - t0
        if compiled and len(step_times) < 8:
            step_times.append(time.perf_counter() - t0)
        state["step"] = step = step + 1
        bar.update(1)
        stop = None
        if p.max_time_s:
            over = float(time.perf_counter() - started > p.max_time_s)
            if all_sum([over], d)[0] > 0:  # every process stops at the same step
                stop = "max_time_s"

        if step % p.log_every == 0 or step == p.max_steps or stop:
            loss_s, pair_s, m, tok, disc_s = all_sum([float(w) for w in window], d)
            now = time.perf_counter()
            state["tokens"] += tok
            rec = {"step": step, "loss": loss_s / m, "lr": sched.get_last_lr()[0], "tokens": state["tokens"],
                   "tokens_per_s": tok / max(now - t_window, 1e-9)}
            if p.pair_objective != "none":
                rec["pair_loss"] = pair_s / m
            if p.objective == "rtd":  # "loss" is then the generator's MLM loss
                rec["disc_loss"] = disc_s / m
            state["history"].append(rec)
            if d.main:
                bar.set_postfix(loss=f"{rec['loss']:.3f}", tok_s=f"{rec['tokens_per_s']:.0f}")
                on_log({k: v for k, v in rec.items() if k != "step"}, step)
            window, t_window = [0.0] * 5, now

        if step % p.eval_every == 0 or step == p.max_steps or step in extra_eval_steps or stop:
            ev = evaluate(pm, eval_set, d, prec)
            final_eval = ev
            state["history"].append({"step": step, "tokens": state["tokens"], **ev})
            if d.main:
                on_log(ev, step)
                bar.write(f"[pretrain] step {step}: held-out {p.objective.upper()} loss {ev['eval_loss']:.4f} "
                          f"(MLM ppl {ev['eval_ppl']:.1f})", file=sys.stderr)
            if ev["eval_loss"] < state["best"]["eval_loss"] - 1e-4:
                state["best"] = {"eval_loss": ev["eval_loss"], "step": step}
                state["bad"] = 0
                if d.main:
                    atomic_save({"step": step, "model": pm.saved.state_dict()}, scratch / "best.pt")
            else:
                state["bad"] += 1
                if p.early_stop_patience and state["bad"] >= p.early_stop_patience and stop is None:
                    stop = "early_stop"
        if step % p.save_every == 0 or stop or step == p.max_steps:
            save(step)
        if stop:
            stopped = stop
            break
    bar.close()
    if trace is not None:
        import json

        trace["digest"] = state_digest(pm.saved)
        Path(trace_dir).mkdir(parents=True, exist_ok=True)
        (Path(trace_dir) / f"rank{d.rank}.json").write_text(json.dumps(trace))
    if not final_eval:  # resumed at the very end: the history holds the last evaluation
        final_eval = next((h for h in reversed(state["history"]) if "eval_loss" in h), {})
    compile_s = compile_seconds(step_times) if compiled else None
    if compiled and d.main and compile_s is not None:
        print(f"[pretrain] compiling took ~{compile_s:.1f} s of the first steps", file=sys.stderr, flush=True)
    return TrainResult(state["step"], state["history"], state["best"], final_eval, state["tokens"], train_s, stopped,
                       resumed_from, prec, compiled, compile_why, compile_s)

