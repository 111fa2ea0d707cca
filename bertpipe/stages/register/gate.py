"""The champion gate: which number is compared (the registered artifact's own test score), on which test set (its
identity), against what (the task's floor, then the champion), and the rule that turns them into a decision.

Every primary metric here is higher-is-better (macro-F1, entity F1, QA F1, the encoder's negated loss).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from bertpipe.core.stage import read_manifest
from bertpipe.infra.errors import BertpipeError

# Settings that change a test score without changing the test data. Training hyperparameters (lr, epochs, seeds,
# ...) are deliberately absent: a model trained differently is still scored on the same test set.
EVAL_TASK_KEYS = ("truncation", "head_tokens", "stride", "window_aggregate", "label_all_pieces", "model_scheme",
                  "doc_stride", "max_query_len", "max_answer_len", "n_best")
EVAL_TRAIN_KEYS = ("max_seq_len", "max_eval_examples")
# register.floor -> the baselines of work/evaluate/metrics.json it may name, first found wins (NER has no tfidf
# baseline; its trained simple baseline is the train lexicon).
FLOOR_BASELINES = {"majority": ("majority",), "tfidf": ("tfidf", "lexicon")}


def saved_seed_score(metrics: dict, where: str = "finetune metrics.json") -> tuple[str, float, str]:
    """(primary metric, test value, seed) of the seed whose model was saved: the artifact that gets registered."""
    name = metrics.get("primary")
    if not name:
        raise BertpipeError(f"{where}: key 'primary' (the primary metric name) is missing")
    per_seed = metrics.get("per_seed") or {}
    saved = [s for s, r in per_seed.items() if r.get("saved")]
    if not saved and len(per_seed) == 1:
        saved = list(per_seed)
    if len(saved) != 1:
        raise BertpipeError(f"{where}: per_seed must mark exactly one seed 'saved: true' (found {len(saved)})")
    value = (per_seed[saved[0]].get("test") or {}).get(name)
    if not isinstance(value, (int, float)):
        raise BertpipeError(f"{where}: per_seed.{saved[0]}.test.{name} (the saved model's test score) is missing")
    return name, float(value), saved[0]


def task_settings(cfg, ft_dir: Path, task: str):
    """(TaskParams, TrainParams) the finetune output was built with (its manifest), else today's config."""
    from bertpipe.infra.config import validated
    from bertpipe.lib.training.params import TaskParams, TrainParams

    params = (read_manifest(ft_dir) or {}).get("params") or {}
    raw_task, raw_train = params.get(f"finetune.tasks.{task}"), params.get("finetune.train")
    if raw_task is None:
        if task not in cfg.params.finetune.tasks:
            raise BertpipeError(f"{ft_dir}/manifest.json: no params for task {task!r}, and finetune.tasks has none")
        tp = cfg.params.finetune.tasks[task]
    else:
        tp = validated(TaskParams, raw_task, f"{ft_dir}/manifest.json: params.finetune.tasks.{task}")
    shared = (validated(TrainParams, raw_train, f"{ft_dir}/manifest.json: params.finetune.train")
              if raw_train is not None else cfg.params.finetune.train)
    return tp, tp.train_params(shared)


def test_identity(cfg, ft_dir: Path, task: str) -> tuple[str, dict]:
    """(identity hash, what it is made of) of the test set a task model was scored on: the test split's sha256
    from work/splits/<task>/splits.json (or, where there is none, the finetune data inputs and the task's
    data params) plus the evaluation settings that change the score."""
    from bertpipe.lib.labelled import split_info
    from bertpipe.lib.layout import task_dir

    tp, trp = task_settings(cfg, ft_dir, task)
    test = (split_info(task_dir(cfg, task)).get("splits") or {}).get("test") or {}
    if test.get("sha256"):
        data = {"test_sha256": test["sha256"], "examples": test.get("examples")}
    else:
        m = read_manifest(ft_dir) or {}
        data = {"inputs": {k: v.get("digest") for k, v in sorted((m.get("inputs") or {}).items())
                           if k != "encoder"},
                "task": tp.model_dump(mode="json", exclude={"train_overrides", *EVAL_TASK_KEYS})}
    settings = {**{k: getattr(tp, k) for k in EVAL_TASK_KEYS}, **{k: getattr(trp, k) for k in EVAL_TRAIN_KEYS}}
    parts = {"data": data, "settings": settings}
    blob = json.dumps(parts, sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:32], parts


def encoder_identity(cfg) -> tuple[str, dict]:
    """The encoder gate's test set: the prepared domain corpus and the evaluate settings that score it."""
    parts = {"prepare": (read_manifest(cfg.work / "prepare") or {}).get("fingerprint"),
             "evaluate": cfg.section_dict("evaluate")}
    blob = json.dumps(parts, sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:32], parts


@dataclass
class Floor:
    name: str  # majority | tfidf | none | base encoder
    value: float | None  # None: no floor applies
    source: str  # what the value is, in words

    def describe(self, metric: str, margin: float) -> str:
        if self.value is None:
            return self.source
        return f"{self.source}: {metric} {self.value:.4f} (+ margin {margin:g})"


def task_floor(evaluate_dir: Path, task: str, floor: str, metric: str) -> Floor:
    """The floor a task model must beat, from work/evaluate/metrics.json ``tasks[task].baselines``."""
    if floor == "none":
        return Floor("none", None, "no floor (register.floor: none)")
    path = Path(evaluate_dir) / "metrics.json"
    try:
        baselines = ((json.loads(path.read_text(encoding="utf-8")).get("tasks") or {}).get(task) or {}) \
            .get("baselines") or {}
    except (OSError, ValueError):
        baselines = {}
    for key in FLOOR_BASELINES[floor]:
        value = (baselines.get(key) or {}).get(metric)
        if isinstance(value, (int, float)):
            return Floor(key, float(value), f"{key} baseline")
    # No baseline to compare with (e.g. QA, or an evaluate output without one): a model must at least score
    # above zero, so an all-wrong model is never crowned; the reason says so.
    return Floor(floor, 0.0, f"no {floor} baseline for {task!r} in {path}, floor taken as 0")


def encoder_floor(cfg, floor: str, evaluate_dir: Path | None = None) -> Floor:
    """The adapted encoder must beat the base encoder it was adapted from on the same gate score (evaluate's, when it
    scored this base on the same windows)."""
    if floor == "none":
        return Floor("none", None, "no floor (register.floor: none)")
    from bertpipe.lib.layout import base_model

    base = base_model(cfg)
    if not isinstance(base, Path) or not base.exists():
        return Floor("base encoder", None, f"no floor (base encoder {base} is not a local model to score)")
    from bertpipe.lib.measures.encoder_gate import gate_score

    try:
        _, value, read = gate_score(base, cfg, evaluate_dir)
        return Floor("base encoder", value, f"base encoder {base}" + (" (evaluate's score)" if read else ""))
    except BertpipeError as e:  # an ELECTRA discriminator has no MLM head: a random one would make any floor
        return Floor("base encoder", None, f"no floor ({str(e).splitlines()[0][:200]})")


@dataclass
class Verdict:
    promoted: bool
    below_floor: bool
    reason: str


def degenerate_reason(metrics: dict) -> str | None:
    """Why a finetuned model learned nothing (its metrics.json ``degenerate``), or None."""
    if not metrics.get("degenerate"):
        return None
    return str(metrics.get("degenerate_reason") or "every run was degenerate on dev")


def judge(metric: str, value: float, floor: Floor, floor_margin: float, champion_version: str | None,
          champion_value: float | None, min_delta: float, require_ci: bool,
          ci: tuple[float, float] | None, champion_note: str = "", degenerate: str | None = None) -> Verdict:
    """The rule, strict everywhere: a degenerate model is never crowned (whatever the floor setting); a tie with the
    floor or the champion never promotes. Scores compare at the six decimals the registry records them with, so a
    champion's recorded score ties with its own re-logged copy."""
    if degenerate:
        return Verdict(False, True, f"degenerate: {degenerate}; a model that learned nothing is never champion, "
                                    "registered as challenger only")
    value = round(value, 6)
    champion_value = None if champion_value is None else round(champion_value, 6)
    floor = Floor(floor.name, None if floor.value is None else round(floor.value, 6), floor.source)
    if floor.value is not None and not value > floor.value + floor_margin:
        return Verdict(False, True, f"below the floor: {metric} {value:.4f} does not beat the {floor.source} "
                                    f"{floor.value:.4f} + margin {floor_margin:g}; registered as challenger only")
    above = (f"beats the {floor.source} {floor.value:.4f} + {floor_margin:g}" if floor.value is not None
             else f"with {floor.source}")
    if champion_version is None:
        return Verdict(True, False, f"first champion: {metric} {value:.4f} {above}")
    if champion_value is None:
        return Verdict(False, False, f"champion v{champion_version} could not be scored on this test set "
                                     f"({champion_note or 'unknown reason'}); champion kept")
    versus = f"champion v{champion_version} {champion_value:.4f}{champion_note and f' ({champion_note})'}"
    if not value > champion_value + min_delta:
        word = "ties" if value == champion_value else "does not beat"
        return Verdict(False, False, f"{metric} {value:.4f} {word} {versus} + min_delta {min_delta:g}; "
                                     "champion kept")
    if require_ci and (ci is None or not ci[0] > 0):
        why = "no interval could be computed" if ci is None else f"95% interval [{ci[0]:+.4f}, {ci[1]:+.4f}] " \
                                                                  "includes 0"
        return Verdict(False, False, f"{metric} {value:.4f} > {versus} + {min_delta:g}, but {why} "
                                     "(register.require_ci); champion kept")
    ci_text = f", 95% interval [{ci[0]:+.4f}, {ci[1]:+.4f}]" if ci is not None else ""
    return Verdict(True, False, f"{metric} {value:.4f} > {versus} + min_delta {min_delta:g}{ci_text}; {above}")
