"""Where things live in a project, as functions of the config alone: the base encoder, each stage's output that
another stage reads, and which fanned-out stages (per task, encoder or export key) a config has.

A core helper below every stage: the stage packages' declarations (``<stage>/declare.py``), the graph
(``bertpipe.graph.pipeline``) and the stages that must name another stage's output (the register gate, the fair MLM
comparison, the start rule) import these from here, never from each other or from the graph.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from bertpipe.infra.config import Config
from bertpipe.infra.errors import BertpipeError
from bertpipe.lib.modelinfo import refuse_remote_code

START_JSON = "start.json"


def base_is_scratch(cfg: Config) -> bool:
    return cfg.params.model.base.strip().lower() == "scratch"


def base_model(cfg: Config) -> Path | str:
    """The base encoder: the bootstrapped one, a local save_pretrained dir, or a hub id (kept as a string). One that
    needs its own code is refused here, before any stage works towards loading it."""
    if base_is_scratch(cfg):
        return cfg.work / "base" / "model"
    ref = _local_or_hub(cfg, cfg.params.model.base, "model.base", "a save_pretrained directory")
    refuse_remote_code(ref, "model.base")
    return ref


def base_tokenizer(cfg: Config) -> Path | str:
    tok = cfg.params.model.tokenizer.strip()
    if not tok:
        return base_model(cfg)
    ref = _local_or_hub(cfg, tok, "model.tokenizer", "a tokenizer directory (vocab.txt and tokenizer_config.json)")
    refuse_remote_code(ref, "model.tokenizer")
    return ref


# A Hugging Face hub id: ``name`` or ``namespace/name``. Anything else (``{raw}/...``, ``./x``, ``~/x``, an absolute
# path, two or more slashes) can only be a local path.
HUB_ID = re.compile(r"\w[\w.-]*(/\w[\w.-]*)?")


def _local_or_hub(cfg: Config, value: str, key: str, local: str) -> Path | str:
    """``value`` as an existing local path, else as a hub id (kept as a string); a missing path that cannot be a hub
    id is an error naming the path it was expanded to."""
    p = cfg.path(value)
    if p.exists():
        return p
    if "{raw}" in value or not HUB_ID.fullmatch(value):
        raise BertpipeError(f"{key}: {p}: does not exist (expected {local}, or a Hugging Face hub id)")
    return value


def corpus_dir(cfg: Config, name: str) -> Path:
    """A prepared corpus: ``work/prepare/<name>/{train,valid,test}/part-NNNNN.parquet`` (read it with
    ``bertpipe.lib.corpusio``)."""
    return cfg.work / "prepare" / name


def splits_dir(cfg: Config) -> Path:
    """The splits stage's output: one directory per finetune task (``bertpipe.lib.labelled`` reads them)."""
    return cfg.work / "splits"


def task_dir(cfg: Config, task: str) -> Path:
    """A task's materialised splits: ``work/splits/<task>/{train,dev,test}.jsonl`` and ``splits.json``."""
    return splits_dir(cfg) / task


def task_eval_files(cfg: Config) -> dict[str, Path]:
    """Every task's dev and test split files, keyed ``splits/<task>/<split>``: what prepare keeps out of
    pretraining (none when prepare.exclude.tasks is off).

    Their contents (not the splits stage's fingerprint) are the inputs, so a task edit that changes no dev/test
    example (e.g. a per-task learning rate) does not rerun prepare and everything after it."""
    if not cfg.params.prepare.exclude.tasks:
        return {}
    return {f"splits/{t}/{s}": task_dir(cfg, t) / f"{s}.jsonl" for t in cfg.params.finetune.tasks
            for s in ("dev", "test")}


def start_dir(cfg: Config) -> Path:
    return cfg.work / "start"


def start_file(cfg: Config) -> Path:
    """Where domain pretraining starts, as the start stage decided it (see ``bertpipe.stages.start``)."""
    return start_dir(cfg) / START_JSON


def read_start(path: Path | str) -> dict | None:
    """The decision in a start.json, or None when there is none (yet) or it is not one."""
    try:
        rec = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return rec if isinstance(rec, dict) and rec.get("kind") in ("base", "champion", "path") else None


def encoder_paths(rec: dict | None, base_model, base_tokenizer) -> tuple[Path | str, Path | str]:
    """(model, tokenizer) the vocab stage extends: the base's (also while nothing is decided yet), or the decided
    dir (a registered version's export, or model.continue_from)."""
    if rec is None or rec["kind"] == "base" or not rec.get("model"):
        return base_model, base_tokenizer
    return Path(rec["model"]), Path(rec["model"])


def adapted_model(cfg: Config) -> Path:
    """The domain-adapted encoder (the pretrain stage's model)."""
    return cfg.work / "pretrain" / "model"


def tapt_out(cfg: Config, task: str) -> Path:
    return cfg.work / "tapt" / task


def encoder_dir(cfg: Config, encoder: str, task: str) -> Path | str:
    """The encoder ``finetune/<task>/<encoder>`` starts from: the base, the adapted encoder, or the task's TAPT one."""
    if encoder == "tapt":
        return tapt_out(cfg, task) / "model"
    return base_model(cfg) if encoder == "base" else adapted_model(cfg)


def finetune_out(cfg: Config, task: str, encoder: str) -> Path:
    return cfg.work / "finetune" / task / encoder


def distill_out(cfg: Config, task: str) -> Path:
    return cfg.work / "distill" / task


def export_out(cfg: Config, key: str) -> Path:
    return cfg.work / "export" / key


def evaluate_out(cfg: Config) -> Path:
    return cfg.work / "evaluate"


# Which fanned-out stages a config has (a rule over params alone; the graph and the declarations read it).

def tapt_tasks(cfg: Config) -> list[str]:
    """Tasks that get a TAPT encoder: every finetune task, when finetune.encoders names ``tapt``."""
    return list(cfg.params.finetune.tasks) if "tapt" in cfg.params.finetune.encoders else []


def finetune_pairs(cfg: Config) -> list[tuple[str, str]]:
    ft = cfg.params.finetune
    return [(t, e) for t in ft.tasks for e in ft.encoders]


def distill_tasks(cfg: Config) -> list[str]:
    """Tasks that get a student: distill.tasks (empty: every task) whose teacher encoder is finetuned at all."""
    dp, ft = cfg.params.distill, cfg.params.finetune
    if not dp.enabled or dp.teacher_encoder not in ft.encoders:
        return []
    unknown = [t for t in dp.tasks if t not in ft.tasks]
    if unknown:
        raise BertpipeError(f"distill.tasks: {unknown} are not finetune tasks (have {sorted(ft.tasks)})")
    return [t for t in ft.tasks if not dp.tasks or t in dp.tasks]


def task_model_encoders(cfg: Config) -> list[str]:
    """The encoders whose finetunes compete for a task's exported and registered model: every one in
    finetune.encoders, when any adapted one (adapted, tapt) is among them; none when the tasks are finetuned on the
    base alone (register then logs the encoder and any students)."""
    enc = cfg.params.finetune.encoders
    return list(enc) if any(e != "base" for e in enc) else []


def export_targets(cfg: Config) -> dict[str, tuple[str | None, dict[str, Path]]]:
    """What register logs, by export key: {key: (task or None for the encoder, {input key: stage dir})}. A task's
    inputs are every competing encoder's finetune (``finetune/<encoder>``: export picks the best by dev score), a
    student's and the encoder's the one stage dir holding model/ (``model``)."""
    out: dict[str, tuple[str | None, dict[str, Path]]] = {}
    if not cfg.params.export.enabled:
        return out
    encoders = task_model_encoders(cfg)
    if encoders:
        for t in cfg.params.finetune.tasks:
            out[t] = (t, {f"finetune/{e}": finetune_out(cfg, t, e) for e in encoders})
    for t in distill_tasks(cfg):
        out[f"{t}-student"] = (t, {"model": distill_out(cfg, t)})
    if cfg.params.register.register_encoder:
        out["encoder"] = (None, {"model": cfg.work / "pretrain"})
    return out
