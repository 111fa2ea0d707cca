"""Pretraining's part of the one training loop (``bertpipe.lib.training.loop``): its data, masks, objective and
held-out evaluation, and the processes under torchrun.

Everything that makes the result a pure function of (params, data, step) is here or in the loop: data order =
f(seed, epoch); mask and dropout = f(seed, step, j), j the micro-batch's place among the step's ``grad_accum x
processes`` batches, so N processes with accumulation G train on the same batches with the same masks as one process
with N x G; a checkpoint holds model, optimiser, schedule and history, so a resumed run replays the same steps as an
uninterrupted one.
"""

from __future__ import annotations

import functools
import math
import os
import sys
from pathlib import Path
from typing import Callable

import numpy as np
import torch
import torch.distributed as dist
from tqdm.auto import tqdm

from bertpipe.infra import attention
from bertpipe.infra.device import Precision, autocast, precision_for
from bertpipe.infra.execution import compile_in_place, should_compile
from bertpipe.lib.mlm.data import Example, collate, epoch_batches
from bertpipe.lib.mlm.masking import IGNORE, MaskSpec, mask_batch, seeded
from bertpipe.lib.mlm.model import PretrainModel
from bertpipe.lib.training.checkpoint import atomic_save, safe_load
from bertpipe.lib.training.processes import Dist, all_sum
from bertpipe.lib.training.trainloop import FP32, Objective, Plan, TrainResult, backward_step, lr_lambda, run, to_device


# ---------------------------------------------------------------- processes


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


# ---------------------------------------------------------------- optimiser


def make_optimizer(model: torch.nn.Module, p) -> torch.optim.Optimizer:
    """AdamW, fused on the CPU and CUDA (``device.adamw``): the per-parameter loop was ~12% of a 6L/384H step on the
    CPU (torch.profiler; bench/bench_pretrain.py --profile)."""
    from bertpipe.infra.device import adamw, weight_decay_groups

    return adamw(weight_decay_groups(model, p.weight_decay), lr=p.lr, betas=(0.9, 0.98), eps=1e-6)


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
    kind = attention.kind_of(model.saved)
    for b in batches[d.rank :: d.world]:
        b = to_device(attention.prepare(b, kind), d.device)
        with autocast(d.device, prec):
            out = model(b["input_ids"], b["attention_mask"], b["token_type_ids"], b["labels"], b["pair_labels"],
                        doc_ids=b.get("doc_ids"), doc_offsets=b.get("doc_offsets"))
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




# ---------------------------------------------------------------- the objective


class MaskedLM(Objective):
    """MLM, with the pair (NSP/SOP) loss and RTD's discriminator where the model has them.

    The MLM loss is normalised by the masked tokens of the whole step, summed over micro-batches and processes (as
    transformers does with ``num_items_in_batch``), so every masked token weighs the same however the step is cut:
    micro-batches with unequal masked counts give the gradient of one big batch. DDP averages gradients over
    processes, hence the factor ``world``. The pair loss is per example: a mean per micro-batch, averaged. RTD's
    discriminator loss (``disc_sum``, over every non-padding token) is normalised the same way, by the step's
    non-padding tokens, and weighted by ``disc_weight``. Logged: the MLM loss (RTD: the generator's) as ``loss``."""

    OUTPUTS = {"loss": "mlm_loss", "pair_loss": "pair_loss", "disc_loss": "disc_loss"}

    def __init__(self, pair: bool = False, rtd: bool = False):
        self.terms = ("loss",) + ("pair_loss",) * pair + ("disc_loss",) * rtd

    def shares(self, micro_batches, d):
        n_step, tok_step = all_sum([float(sum(int((b["labels"] != IGNORE).sum()) for b in micro_batches)),
                                    float(sum(int(b["attention_mask"].sum()) for b in micro_batches))], d)
        scale = d.world / max(n_step, 1.0)

        def share(out):
            loss = out["mlm_sum"] * scale
            if "disc_sum" in out:
                loss = loss + out["disc_weight"] * out["disc_sum"] * (d.world / max(tok_step, 1.0))
            if "pair_loss" in out:
                loss = loss + out["pair_loss"] / len(micro_batches)
            return loss

        return [share] * len(micro_batches)

    def forward(self, model, b):
        return model(b["input_ids"], b["attention_mask"], b["token_type_ids"], b["labels"], b["pair_labels"],
                     doc_ids=b.get("doc_ids"), doc_offsets=b.get("doc_offsets"))

    def logged(self, out):
        return torch.stack([out[self.OUTPUTS[t]].detach().float() for t in self.terms])


# the loop's step with the MLM objective (bench/bench_pretrain.py --profile times it)
backward_step = functools.partial(backward_step, objective=MaskedLM())


# ---------------------------------------------------------------- pretraining


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
    section: str = "pretrain",
) -> TrainResult:
    """Pretrain ``pm`` on ``train_ex`` through the one loop: the data order a function of (seed, epoch), the masks and
    dropout of (seed, step, j), checkpoints in ``scratch`` (``best.pt``: the best held-out loss's weights).
    ``section``: the params section ``p`` is (pretrain, base, tapt), which errors name."""
    prec = precision_for(p.precision, d.device)
    compile_it, compile_why = should_compile(p.compile, p.max_steps, d.device, f"{section}.compile")
    kind, attention_why = attention.choose(p.attention, d.device, f"{section}.attention")
    if d.main:
        print(f"[pretrain] precision {prec.words()}; {compile_why}; {attention_why}", file=sys.stderr, flush=True)
    pm.to(d.device)
    opt = make_optimizer(pm, p)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lr_lambda(p.schedule, int(math.ceil(p.warmup_ratio * p.max_steps)), p.max_steps))
    if compile_it:
        compile_in_place(pm)
    batches = Batches(train_ex, p, d, tokenizer.pad_token_id)
    static = (
        static_masked(train_ex, spec, tokenizer.mask_token_id, replace_ids, p.seed, tokenizer.pad_token_id)
        if p.masking == "static" else None
    )
    # BERTPIPE_PRETRAIN_TRACE=<dir>: each process records what it trained on and its final weights (DDP tests)
    trace_dir = os.environ.get("BERTPIPE_PRETRAIN_TRACE")
    trace = {"rank": d.rank, "world": d.world, "batches": []} if trace_dir else None

    def feed(step: int) -> tuple[list[dict], list[int]]:
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
            micro_batches.append(attention.prepare(b, kind))
        return micro_batches, seeds

    def held_out(step: int) -> tuple[float, dict]:
        ev = evaluate(pm, eval_set, d, prec)
        if d.main:
            on_log(ev, step)
            if step:
                tqdm.write(f"[pretrain] step {step}: held-out {p.objective.upper()} loss {ev['eval_loss']:.4f} "
                           f"(MLM ppl {ev['eval_ppl']:.1f})", file=sys.stderr)
        return -ev["eval_loss"], ev

    def keep_best(step: int) -> None:
        if d.main:
            atomic_save({"step": step, "model": pm.saved.state_dict()}, scratch / "best.pt")

    plan = Plan(p.max_steps, eval_every=p.eval_every, log_every=p.log_every, max_grad_norm=p.max_grad_norm,
                save_every=p.save_every, patience=p.early_stop_patience, min_delta=1e-4, max_time_s=p.max_time_s,
                eval_at_start=True, extra_eval_steps=frozenset(extra_eval_steps))
    objective = MaskedLM(pair=p.pair_objective != "none", rtd=p.objective == "rtd")
    with attention.kernel(pm, kind, f"{section}.attention", training=True):
        res = run(pm, opt, sched, feed, objective, held_out, plan, prec, d, scratch=scratch, compiled=compile_it,
                  compile_why=compile_why, on_best=keep_best, on_log=on_log, desc="pretrain")
    res.attention = attention_why
    if trace is not None:
        import json

        trace["digest"] = state_digest(pm.saved)
        Path(trace_dir).mkdir(parents=True, exist_ok=True)
        (Path(trace_dir) / f"rank{d.rank}.json").write_text(json.dumps(trace))
    if compile_it and d.main and res.compile_s is not None:
        print(f"[pretrain] compiling took ~{res.compile_s:.1f} s of the first steps", file=sys.stderr, flush=True)
    return res


def kept_weights(pm: PretrainModel, scratch: Path, output: str) -> str:
    """Put the weights an MLM stage saves into ``pm``: the held-out best (``output: best``, when ``train`` kept a
    ``best.pt`` in ``scratch``) or the last step's, as they are. Says which ("last" or "best (step N)")."""
    best_path = scratch / "best.pt"
    if output != "best" or not best_path.is_file():
        return "last"
    best = safe_load(best_path)
    pm.saved.load_state_dict(best["model"])
    return f"best (step {best['step']})"


def loss_metrics(res: TrainResult) -> dict:
    """The held-out losses and the work of an MLM run, as every MLM stage reports them."""
    evals = [h for h in res.history if "eval_loss" in h]
    return {
        "eval_loss": float(res.final_eval.get("eval_loss", float("nan"))),
        "eval_ppl": float(res.final_eval.get("eval_ppl", float("nan"))),
        "best_eval_loss": float(res.best["eval_loss"]),
        "initial_eval_loss": float(evals[0]["eval_loss"]) if evals else float("nan"),
        "steps": res.step,
        "tokens": float(res.tokens),
        "train_seconds": round(res.train_seconds, 3),
    }
