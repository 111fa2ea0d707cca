"""Hyperparameters chosen on dev: an Optuna study over ``finetune.search.space`` with successive halving.

Each trial trains finetune.train plus one value per searched key on the first seed, reports the dev score after
every evaluation (the pruner stops trials that rank low at an evaluation), and ends with its best dev score. A
degenerate trial (bertpipe.lib.training.degenerate) fails and can never be chosen. Trials are stored by what they
are (encoder, task data, configuration, seed, code) under the state dir, so a trial already run — by a killed
attempt, or before the budget grew — is read back, never trained again.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from bertpipe.lib.training.params import SearchParams, TrainParams
from bertpipe.stages.finetune.fit import Fit


class Degenerate(Exception):
    pass


@dataclass
class Trial:
    number: int
    config: dict[str, Any]  # the searched keys' values
    state: str  # complete | pruned | degenerate
    dev: float | None  # best dev primary (complete trials)
    curve: list[float] = field(default_factory=list)  # dev primary at each evaluation
    sound: list[bool] = field(default_factory=list)  # ... and whether it was above the majority baseline there
    steps: int = 0
    seconds: float = 0.0
    reason: str = ""
    cached: bool = False

    def record(self) -> dict:
        return {"number": self.number, "config": self.config, "state": self.state, "dev": self.dev,
                "curve": self.curve, "sound": self.sound, "steps": self.steps, "seconds": round(self.seconds, 2), "reason": self.reason,
                "cached": self.cached}


@dataclass
class Outcome:
    chosen: TrainParams  # the configuration every seed trains with
    config: dict[str, Any]  # its searched keys' values ({} without a search)
    trials: list[Trial]
    fit: Fit | None  # the chosen trial's run on the first seed, when this process trained it
    # Why the chosen configuration's run on the first seed is degenerate, when a trial already trained exactly that
    # run (every trial failed and the given hyperparameters were one of them): the seed goes straight to its retry.
    degenerate: str | None = None


def grid_size(space: dict[str, list]) -> int:
    return math.prod(len(v) for v in space.values()) if space else 0


def configure(tp: TrainParams, config: dict[str, Any]) -> TrainParams:
    return TrainParams.model_validate({**tp.model_dump(), **config})


def _replayable(rec: Any) -> bool:
    """Whether a stored record holds what ``search`` replays; anything else (another shape, a file cut short) is
    read as no record, and the trial trains again and overwrites it."""
    if not (isinstance(rec, dict) and isinstance(rec.get("curve"), list) and isinstance(rec.get("sound", []), list)):
        return False
    numbers = all(isinstance(v, (int, float)) for v in rec["curve"]) and isinstance(rec.get("seconds"), (int, float))
    if not (numbers and isinstance(rec.get("steps"), int) and isinstance(rec.get("reason"), str)):
        return False
    if rec.get("state") == "complete":
        return isinstance(rec.get("dev"), (int, float))
    return rec.get("state") in ("pruned", "degenerate") and rec.get("dev") is None


class TrialStore:
    """One JSON file per trial under ``root``, named by the digest of what the trial is.

    A pruned trial is replayed only within its own study (``study``: the search settings): whether it is stopped
    depends on the other trials and the pruner, which the trial itself does not hold."""

    def __init__(self, root: Path, identity: dict):
        self.root = root
        self.identity = identity

    def path(self, tp: TrainParams, seed: int) -> Path:
        blob = json.dumps({**self.identity, "train": tp.model_dump(mode="json"), "seed": seed}, sort_keys=True,
                          default=str)
        return self.root / f"{hashlib.sha256(blob.encode()).hexdigest()[:32]}.json"

    def get(self, tp: TrainParams, seed: int, study: dict) -> dict | None:
        try:
            rec = json.loads(self.path(tp, seed).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        if not _replayable(rec) or (rec["state"] == "pruned" and rec.get("study") != study):
            return None
        return rec

    def put(self, tp: TrainParams, seed: int, rec: dict, study: dict) -> None:
        """Atomically: two runs of one project may store the same trial at once."""
        from bertpipe.core.outputs import atomic_write_text

        path = self.path(tp, seed)
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, json.dumps({**rec, "study": study}, sort_keys=True, indent=1))


def ranked(value: float, sound: bool) -> float:
    """What the pruner compares: a dev score at or below the majority baseline ranks below every score above it,
    so a trial on the majority plateau (often one that ends degenerate) never stops one that is learning."""
    return value if sound else value - 1.0


def search(sp: SearchParams, tp: TrainParams, seed: int, run: Callable[..., Fit], store: TrialStore,
           log: Callable[[str], None]) -> Outcome:
    """Choose a configuration on dev. ``run(tp, seed, on_eval, trial number)`` trains one trial (bertpipe.stages.finetune.fit)."""
    if sp.trials == 0 or not sp.space:
        return Outcome(tp, {}, [], None)
    import optuna

    # ERROR: Optuna logs every failed (degenerate) trial with a traceback at WARNING; the log line below says it
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    keys = sorted(sp.space)
    n = grid_size(sp.space)
    if n <= sp.trials:
        sampler: Any = optuna.samplers.GridSampler({k: sp.space[k] for k in keys}, seed=sp.seed)
        budget = n
    else:
        sampler, budget = optuna.samplers.TPESampler(seed=sp.seed), sp.trials
    pruner = (optuna.pruners.SuccessiveHalvingPruner(min_resource=sp.min_evals, reduction_factor=sp.reduction_factor)
              if sp.prune else optuna.pruners.NopPruner())
    study = optuna.create_study(direction="maximize", sampler=sampler, pruner=pruner)
    settings = sp.model_dump(mode="json", exclude={"retries"})  # what decides which trials run and which are pruned
    trials: list[Trial] = []
    best: dict = {}

    def objective(ot) -> float:
        config = {k: ot.suggest_categorical(k, sp.space[k]) for k in keys}
        ttp = configure(tp, config)
        t = Trial(ot.number, config, "pruned", None)
        trials.append(t)
        cached = store.get(ttp, seed, settings)
        if cached is not None:
            t.__dict__.update({k: cached[k] for k in ("state", "dev", "curve", "steps", "seconds", "reason")})
            t.sound, t.cached = cached.get("sound") or [True] * len(t.curve), True
            for i, (v, ok) in enumerate(zip(t.curve, t.sound), 1):
                ot.report(ranked(v, ok), i)
            log(f"trial {t.number} {config}: {t.state} (stored), dev {t.dev if t.dev is None else round(t.dev, 4)}")
            if t.state == "pruned":
                raise optuna.TrialPruned()
            if t.state == "degenerate":
                raise Degenerate(t.reason)
            return t.dev

        def on_eval(value: float, i: int, sound: bool) -> None:
            t.curve.append(value)
            t.sound.append(sound)
            # the step is the evaluations seen: successive halving's first rung is min_evals
            ot.report(ranked(value, sound), i + 1)
            if ot.should_prune():
                raise optuna.TrialPruned()

        started = time.time()
        try:
            f = run(ttp, seed, on_eval, t.number)
        except optuna.TrialPruned:
            t.seconds = time.time() - started
            store.put(ttp, seed, t.record(), settings)
            log(f"trial {t.number} {config}: pruned after {len(t.curve)} dev evaluations "
                f"({t.curve[-1]:.4f} at the last)")
            raise
        t.seconds, t.steps = time.time() - started, f.result.steps
        if f.degenerate:
            t.state, t.reason = "degenerate", f.degenerate
            store.put(ttp, seed, t.record(), settings)
            log(f"trial {t.number} {config}: degenerate ({f.degenerate})")
            raise Degenerate(f.degenerate)
        t.state, t.dev = "complete", f.result.best_primary
        store.put(ttp, seed, t.record(), settings)
        log(f"trial {t.number} {config}: dev {t.dev:.4f} ({t.steps} steps, {t.seconds:.0f}s)")
        if not best or t.dev > best["dev"]:
            best.update(dev=t.dev, number=t.number, fit=f)
        return t.dev

    study.optimize(objective, n_trials=budget, catch=(Degenerate,))
    done = [t for t in trials if t.state == "complete"]
    if not done:
        known = next((t.reason for t in trials if t.state == "degenerate" and configure(tp, t.config) == tp), None)
        log(f"every one of the {len(trials)} trials was pruned or degenerate: training the given hyperparameters"
            + (f" (a trial found them degenerate on seed {seed}: {known})" if known else ""))
        return Outcome(tp, {}, trials, None, known)
    win = max(done, key=lambda t: (t.dev, -t.number))
    log(f"chosen on dev: {win.config} (dev {win.dev:.4f}; {len(done)} of {len(trials)} trials complete)")
    fit = best.get("fit") if best.get("number") == win.number else None
    return Outcome(configure(tp, win.config), win.config, trials, fit)
