"""Hyperparameters chosen on dev: an Optuna study over ``finetune.search.space`` with successive halving.

Each trial trains finetune.train plus one value per searched key on the first seed, reports the dev score after
every evaluation (the pruner stops trials that rank low at an evaluation), and ends with its best dev score. A
degenerate trial (bertpipe.lib.training.degenerate) fails and can never be chosen. The studies are kept in Optuna's
own storage (``TrialStore``: a journal under the state dir, which ``optuna-dashboard`` shows), each trial marked by
what it is (encoder, task data, configuration, seed, code), so a trial already run — by a killed attempt, or before
the budget grew — is read back, never trained again.
"""

from __future__ import annotations

import hashlib
import json
import math
import sys
import time
from dataclasses import dataclass, field
from datetime import datetime
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


KEY, RECORD, SETTINGS = "bertpipe.key", "bertpipe.trial", "bertpipe.search"  # the user attributes searches set


def _drop_cut_op(journal: Path) -> None:
    """Remove a last operation cut short (a full disk, a power cut): Optuna reads past it, but its next append would
    join it into a line no reader accepts."""
    data = journal.read_bytes() if journal.exists() else b""
    if data and not data.endswith(b"\n"):
        with open(journal, "rb+") as f:
            f.truncate(data.rfind(b"\n") + 1)


class TrialStore:
    """The project's trials: an Optuna journal, ``optuna-dashboard <journal>`` shows every search's study.

    Each trial carries the digest of what it is (``identity``, its train params, its seed) and, once finished, its
    record, so a search reads back a trial any earlier study ran. A pruned trial is read back only from a study of the
    same search settings: whether it is stopped depends on the other trials and the pruner, which the trial does not
    hold. A journal Optuna cannot read is moved aside: its trials train again."""

    def __init__(self, root: Path, identity: dict, name: str = "search"):
        self.journal, self.identity, self.name = root / "journal.log", identity, name
        self._storage: Any = None

    @property
    def storage(self) -> Any:
        if self._storage is None:
            import optuna
            from optuna.storages.journal import JournalFileBackend, JournalFileSymlinkLock

            self.journal.parent.mkdir(parents=True, exist_ok=True)
            lock = JournalFileSymlinkLock(str(self.journal))  # Optuna's own, which its appends take
            lock.acquire()
            try:
                _drop_cut_op(self.journal)
                try:
                    self._storage = optuna.storages.JournalStorage(JournalFileBackend(str(self.journal), lock))
                except (ValueError, KeyError, TypeError) as e:  # not a journal Optuna can replay
                    aside = self.journal.with_name(self.journal.name + ".unreadable")
                    self.journal.replace(aside)
                    print(f"{self.journal}: not an Optuna journal ({type(e).__name__}: {e}); moved to {aside.name}, "
                          "its trials train again", file=sys.stderr, flush=True)
                    self._storage = optuna.storages.JournalStorage(JournalFileBackend(str(self.journal), lock))
            finally:
                lock.release()
        return self._storage

    def key(self, tp: TrainParams, seed: int) -> str:
        blob = json.dumps({**self.identity, "train": tp.model_dump(mode="json"), "seed": seed}, sort_keys=True,
                          default=str)
        return hashlib.sha256(blob.encode()).hexdigest()[:32]

    def get(self, key: str, settings: dict) -> dict | None:
        """The record of the trial stored last under ``key`` (a pruned one from a study of ``settings`` only)."""
        found = None
        for s in self.storage.get_all_studies():
            for t in self.storage.get_all_trials(self.storage.get_study_id_from_name(s.study_name), deepcopy=False):
                rec = t.user_attrs.get(RECORD)
                if t.user_attrs.get(KEY) == key and rec and t.state.is_finished() and (
                        rec["state"] != "pruned" or s.user_attrs.get(SETTINGS) == settings):
                    found = rec
        return found


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
    study = optuna.create_study(storage=store.storage, direction="maximize", sampler=sampler, pruner=pruner,
                                study_name=f"{store.name} {datetime.now().isoformat(' ', 'milliseconds')}")
    settings = sp.model_dump(mode="json", exclude={"retries"})  # what decides which trials run and which are pruned
    study.set_user_attr(SETTINGS, settings)
    trials: list[Trial] = []
    best: dict = {}

    def objective(ot) -> float:
        config = {k: ot.suggest_categorical(k, sp.space[k]) for k in keys}
        ttp = configure(tp, config)
        t = Trial(ot.number, config, "pruned", None)
        trials.append(t)
        ot.set_user_attr(KEY, store.key(ttp, seed))
        cached = store.get(ot.user_attrs[KEY], settings)
        if cached is not None:
            t.__dict__.update({k: cached[k] for k in ("state", "dev", "curve", "sound", "steps", "seconds", "reason")})
            t.cached = True
            ot.set_user_attr(RECORD, t.record())
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
            ot.set_user_attr(RECORD, t.record())
            log(f"trial {t.number} {config}: pruned after {len(t.curve)} dev evaluations "
                f"({t.curve[-1]:.4f} at the last)")
            raise
        t.seconds, t.steps = time.time() - started, f.result.steps
        if f.degenerate:
            t.state, t.reason = "degenerate", f.degenerate
            ot.set_user_attr(RECORD, t.record())
            log(f"trial {t.number} {config}: degenerate ({f.degenerate})")
            raise Degenerate(f.degenerate)
        t.state, t.dev = "complete", f.result.best_primary
        ot.set_user_attr(RECORD, t.record())
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
