"""The stage graph: which stage's output feeds which input. The CLI, the Prefect flow and dvc.yaml all follow it.

    tasks ─(dev/test)─> prepare ─┬─(general)─> base* ─┐
      │                          ├─> start ───────────┤   (start.json: the base, or the champion to continue from)
      │                          └─(domain)───────────┴─> vocab ─> pretrain ─┬──────────────┐
      └─(task dir)──────────────────────────────────────────────────────────┴─> tapt/<t>* ─┴─> finetune/<t>/<encoder>
    finetune ─> evaluate ─> register
    finetune ─> distill/<task> ─> export/<model> ─> register

``tasks`` materialises every finetune task's splits once; prepare removes their dev/test texts from the pretraining
corpora, and finetune trains on the task dirs.

``tapt/<task>`` (*) exists only when ``finetune.encoders`` names ``tapt``: continued MLM on the task's own train texts
from the pretrain stage's encoder (DAPT + TAPT), the encoder of ``finetune/<task>/tapt``.

``base`` exists only when ``model.base: scratch``: it pretrains a small general-domain model from a config, since no
pretrained Chinese weights can be downloaded here. Otherwise the base encoder is ``model.base`` (a dir or hub id).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from bertpipe.codeid import MODEL_LIBS
from bertpipe.config import Config
from bertpipe.errors import BertpipeError
from bertpipe.layout import base_is_scratch, base_model, base_tokenizer, corpus_dir  # noqa: F401 (old home)
from bertpipe.stage import Stage
from bertpipe.start import encoder_paths, read_start, start_dir, start_file


SELECTOR_HELP = {"task": "One task from finetune.tasks (distill: distill.tasks).", "encoder": "base, adapted or tapt.",
                 "model": "<task>, <task>-student or encoder."}


def adapted_model(cfg: Config) -> Path:
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


def task_eval_files(cfg: Config) -> dict[str, Path]:
    """Every task's dev and test split files, keyed ``tasks/<task>/<split>``: what prepare keeps out of pretraining.

    Their contents (not the tasks stage's fingerprint) are the inputs, so a task edit that changes no dev/test
    example (e.g. a per-task learning rate) does not rerun prepare and everything after it."""
    from bertpipe.taskdata import task_dir

    if not cfg.params.prepare.exclude.tasks:
        return {}
    tasks = cfg.params.finetune.tasks
    return {f"tasks/{t}/{s}": task_dir(cfg, t) / f"{s}.jsonl" for t in tasks for s in ("dev", "test")}


def _ranked(stage: Stage, cfg: Config, force: bool = False):
    """The launcher of base and pretrain: the same run in every rank of a torchrun job (bertpipe.pretrain.run)."""
    from bertpipe.pretrain.run import run

    return run(stage, cfg, force=force)


def tasks_stage(cfg: Config) -> Stage:
    from bertpipe.taskdata import stage as m

    return Stage("tasks", m.VERSION, m.sections(cfg), m.own_inputs, lambda c: c.work / "tasks", m.build,
                 params_section="finetune", code=("taskdata",), libs=("numpy",))


def prepare_stage() -> Stage:
    from bertpipe.prepare import stage as m

    def inputs(cfg: Config) -> dict:
        return {**m.own_inputs(cfg), **task_eval_files(cfg)}

    return Stage("prepare", m.VERSION, ("prepare",), inputs, lambda c: c.work / "prepare", m.build,
                 code=("prepare",), libs=("datasketch", "jieba", "numpy", "pyarrow", "scipy"))


def base_stage() -> Stage:
    from bertpipe.pretrain import stage as m

    def inputs(cfg: Config) -> dict:
        return {"corpus": corpus_dir(cfg, "general"), "tokenizer": base_tokenizer(cfg)}

    # The base model and tokenizer are inputs (hashed by content); of `model:` only the language matters here, so
    # e.g. retrain's model.continue_from does not rebuild the bootstrap base.
    return Stage("base", m.VERSION, ("base", "model.language"), inputs, lambda c: c.work / "base", m.build,
                 params_section="base", code=("pretrain",), libs=(*MODEL_LIBS, "jieba", "numpy"),
                 launcher=_ranked)


def start_stage() -> Stage:
    return _start(None)[0]


def vocab_stage() -> Stage:
    from bertpipe.vocab import stage as m

    def inputs(cfg: Config) -> dict:
        # The encoder to extend: the base, or the champion when new data arrived, as the start stage wrote it
        # (a file: walking the graph asks nothing of the registry).
        model, tokenizer = encoder_paths(read_start(start_file(cfg)), base_model(cfg), base_tokenizer(cfg))
        return {
            "corpus": corpus_dir(cfg, "domain"),
            "start": start_file(cfg),
            "model": model,
            "tokenizer": tokenizer,
            **m.own_inputs(cfg),
        }

    return Stage("vocab", m.VERSION, ("vocab", "model.language"), inputs, lambda c: c.work / "vocab", m.build,
                 params_section="vocab", code=("vocab",), libs=(*MODEL_LIBS, "jieba"))


def pretrain_stage() -> Stage:
    from bertpipe.pretrain import stage as m

    def inputs(cfg: Config) -> dict:
        # Always the vocab stage's model: the base or the champion encoder (see bertpipe.lineage), with the words
        # mined from the current corpus added.
        return {"corpus": corpus_dir(cfg, "domain"), "model": cfg.work / "vocab" / "model"}

    return Stage("pretrain", m.VERSION, ("pretrain", "model.language"), inputs, lambda c: c.work / "pretrain", m.build,
                 params_section="pretrain", code=("pretrain",), libs=(*MODEL_LIBS, "jieba", "numpy"),
                 launcher=_ranked)


def tapt_tasks(cfg: Config) -> list[str]:
    """Tasks that get a TAPT encoder: every finetune task, when finetune.encoders names ``tapt``."""
    return list(cfg.params.finetune.tasks) if "tapt" in cfg.params.finetune.encoders else []


def tapt_stage(task: str) -> Stage:
    from bertpipe.pretrain.tapt import stage as m
    from bertpipe.taskdata import task_dir, task_params

    def inputs(cfg: Config) -> dict:
        task_params(cfg, task)  # an unknown task name is a one-line error
        return {"model": adapted_model(cfg), "task": task_dir(cfg, task)}

    # prepare's clean/dedup/exclude params define the leak check that keeps the task's dev/test texts out
    return Stage(f"tapt/{task}", m.VERSION, ("tapt", "model.language", "prepare.clean", "prepare.dedup",
                                             "prepare.exclude"), inputs, lambda c: tapt_out(c, task),
                 lambda ctx: m.build(ctx, task=task), params_section="tapt", code=("pretrain/tapt",),
                 libs=(*MODEL_LIBS, "datasketch", "jieba", "numpy"), cli=("tapt", "--task", task), task=task)


def finetune_stage(task: str, encoder: str) -> Stage:
    from bertpipe.finetune import stage as m
    from bertpipe.taskdata import task_dir, task_params

    def inputs(cfg: Config) -> dict:
        task_params(cfg, task)  # an unknown task name is a one-line error
        return {"encoder": encoder_dir(cfg, encoder, task), "task": task_dir(cfg, task)}

    def build(ctx):
        return m.build(ctx, task=task, encoder=encoder)

    return Stage(
        f"finetune/{task}/{encoder}",
        m.VERSION,
        ("finetune.train", "finetune.search", f"finetune.tasks.{task}"),
        inputs,
        lambda c: finetune_out(c, task, encoder),
        build,
        params_section="finetune",
        code=("finetune",),
        libs=(*MODEL_LIBS, "numpy", "optuna"),
        cli=("finetune", "--task", task, "--encoder", encoder),
        task=task,
        encoder=encoder,
    )


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


def distill_out(cfg: Config, task: str) -> Path:
    return cfg.work / "distill" / task


def distill_stage(task: str) -> Stage:
    from bertpipe.distill import stage as m

    def inputs(cfg: Config) -> dict:
        from bertpipe.taskdata import task_dir

        # The student trains on the task's splits (bertpipe.distill.data) with the teacher's soft targets.
        return {"teacher": finetune_out(cfg, task, cfg.params.distill.teacher_encoder), "task": task_dir(cfg, task)}

    return Stage(f"distill/{task}", m.VERSION, ("distill", "finetune.train", f"finetune.tasks.{task}"), inputs,
                 lambda c: distill_out(c, task), lambda ctx: m.build(ctx, task=task), params_section="distill",
                 code=("distill",), libs=MODEL_LIBS, cli=("distill", "--task", task), task=task)


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


def export_out(cfg: Config, key: str) -> Path:
    return cfg.work / "export" / key


def export_stage(key: str) -> Stage:
    from bertpipe.export import stage as m

    # Keys are "<task>", "<task>-student" or "encoder" (see export_targets).
    task = None if key == "encoder" else key.removesuffix("-student")

    def inputs(cfg: Config) -> dict:
        from bertpipe.taskdata import task_dir

        src = export_targets(cfg)[key][1]
        # a task model is checked on its test split, the encoder on domain texts
        return {**src, "task": task_dir(cfg, task)} if task else {**src, "corpus": corpus_dir(cfg, "domain")}

    sections = ("export", f"finetune.tasks.{task}") if task else ("export",)
    return Stage(f"export/{key}", m.VERSION, sections, inputs, lambda c: export_out(c, key),
                 lambda ctx: m.build(ctx, key=key, task=task), params_section="export", code=("export",),
                 libs=(*MODEL_LIBS, "numpy", "onnx", "onnxruntime"), cli=("export", "--model", key), task=task,
                 model=key)


def evaluate_stage() -> Stage:
    from bertpipe.evaluate import stage as m

    def sources(cfg: Config) -> dict[str, Stage]:
        return {f"finetune/{t}/{e}": finetune_stage(t, e) for t, e in finetune_pairs(cfg)}

    def inputs(cfg: Config) -> dict:
        ins: dict = {k: st.output(cfg) for k, st in sources(cfg).items()}
        ins["base"] = base_model(cfg)
        ins["adapted"] = adapted_model(cfg)
        ins["corpus"] = corpus_dir(cfg, "domain")
        # the materialised splits the baselines train/score on and whose test hash identifies the test set
        ins.update({f"tasks/{t}": cfg.work / "tasks" / t for t in cfg.params.finetune.tasks})
        return ins

    return Stage("evaluate", m.VERSION, ("evaluate",), inputs, lambda c: c.work / "evaluate", m.build,
                 code=("evaluate",), libs=(*MODEL_LIBS, "numpy", "scikit-learn", "seqeval"), sources=sources)


def register_stage() -> Stage:
    from bertpipe.register import stage as m

    def sources(cfg: Config) -> dict[str, Stage]:
        # every competing encoder's finetune of each task (register registers the best by dev score, as export
        # exports it; none when finetune.encoders is [base]: register then logs the encoder and any students)
        out: dict[str, Stage] = {f"finetune/{t}/{e}": finetune_stage(t, e) for t in cfg.params.finetune.tasks
                                 for e in task_model_encoders(cfg)}
        out.update({f"distill/{t}": distill_stage(t) for t in distill_tasks(cfg)})
        out.update({f"export/{k}": export_stage(k) for k in export_targets(cfg)})
        return out

    def inputs(cfg: Config) -> dict:
        ins: dict = {k: st.output(cfg) for k, st in sources(cfg).items()}
        ins["evaluate"] = cfg.work / "evaluate"
        ins["adapted"] = cfg.work / "pretrain"
        # Read too: each task's test split is re-scored and identified; the encoder gate (when the encoder is
        # registered) scores on the domain test split against the base (scoring.encoder_gate); the lineage tags name
        # the vocab output's fingerprint where there is one (task models can be registered over a given encoder).
        if cfg.params.register.register_encoder:
            ins["corpus"] = corpus_dir(cfg, "domain")
            ins["base"] = base_model(cfg)
        if cfg.params.register.register_encoder or (cfg.work / "vocab").exists():
            ins["vocab"] = cfg.work / "vocab"
        # read where present (the split hashes identify the test set; a registry can be built from finetune
        # outputs alone, as before the tasks stage existed)
        ins.update({f"tasks/{t}": cfg.work / "tasks" / t for t in cfg.params.finetune.tasks
                    if (cfg.work / "tasks" / t).exists()})
        return ins

    from bertpipe.register.present import missing

    return Stage("register", m.VERSION, ("register", "tracking"), inputs, lambda c: c.work / "register", m.build,
                 code=("register",), libs=(*MODEL_LIBS, "mlflow"), sources=sources, lost=missing)


@dataclass(frozen=True)
class Family:
    """One entry of the graph: a stage family, its `bertpipe <name>` command (help; for a fanned-out family the
    Stage identity fields its options select by: --task, --encoder, --model) and its stages in a config."""

    name: str
    help: str
    make: Callable[[Config], list[Stage]]  # this family's stages for the config (none: not in this pipeline)
    selectors: tuple[str, ...] = ()


def _start(_cfg) -> list[Stage]:
    from bertpipe.start import stage as m

    return [Stage("start", m.VERSION, m.SECTIONS, m.own_inputs, start_dir, m.build, params_section="flow",
                  code=("start",), external=m.decide, external_memo=m.KEPT_WITH, light=True)]


# The one list: adding a stage is its package plus an entry here, in an order that respects the dependencies. The
# CLI's commands, the flow's tasks and edges (from each Stage's inputs), dvc.yaml and `bertpipe stages` follow.
FAMILIES: tuple[Family, ...] = (
    Family("tasks", "Materialise every finetune task's train/dev/test splits into work/tasks (caps applied).",
           lambda c: [tasks_stage(c)]),
    Family("prepare", "Ingest, clean, deduplicate and split the raw corpora into work/prepare (tasks' dev/test "
           "texts excluded).", lambda c: [prepare_stage()]),
    Family("base", "Pretrain a small general-domain base from scratch (when model.base: scratch).",
           lambda c: [base_stage()] if base_is_scratch(c) else []),
    Family("start", "Decide where domain pretraining starts (the base, or the registry's champion encoder) into "
           "work/start/start.json.", _start),
    Family("vocab", "Mine domain words, extend the tokenizer and initialise the new embeddings.",
           lambda c: [vocab_stage()]),
    Family("pretrain", "Continued MLM pretraining on the domain corpus (torchrun-compatible).",
           lambda c: [pretrain_stage()]),
    Family("tapt", "Task-adaptive pretraining: continued MLM on each task's train texts (when finetune.encoders "
           "names tapt; or one with --task).", lambda c: [tapt_stage(t) for t in tapt_tasks(c)], ("task",)),
    Family("finetune", "Finetune a task head (every task x encoder in params, or one with --task/--encoder).",
           lambda c: [finetune_stage(t, e) for t, e in finetune_pairs(c)], ("task", "encoder")),
    Family("distill", "Distill each finetuned task into a smaller student (or one with --task).",
           lambda c: [distill_stage(t) for t in distill_tasks(c)], ("task",)),
    Family("export", "Export models register will log to ONNX + int8, checked against torch (or --model KEY).",
           lambda c: [export_stage(k) for k in export_targets(c)], ("model",)),
    Family("evaluate", "Evaluate finetuned models; base vs adapted report.", lambda c: [evaluate_stage()]),
    Family("register", "Register the finetuned models in the MLflow registry (champion/challenger).",
           lambda c: [register_stage()]),
)
# {family: (help, selectors)}: the CLI's stage commands (bertpipe/cli.py makes them from this).
COMMANDS: dict[str, tuple[str, tuple[str, ...]]] = {f.name: (f.help, f.selectors) for f in FAMILIES}


def all_stages(cfg: Config) -> dict[str, Stage]:
    """Every stage of the chain for this config, in FAMILIES order (which respects the dependencies)."""
    return {st.name: st for f in FAMILIES for st in f.make(cfg)}


def family_stages(cfg: Config, family: str) -> dict[str, Stage]:
    """The stages of one family (``finetune/sentiment/base`` is of ``finetune``). Making a Stage imports its
    stage module, and some import torch: a one-stage command (`bertpipe start`, run by every `dvc repro`) makes
    only its own."""
    return {st.name: st for f in FAMILIES if f.name == family.split("/")[0] for st in f.make(cfg)}


def producers(name: str, cfg: Config, stages: dict[str, Stage] | None = None) -> dict[str, tuple[str, Path]]:
    """{input key: (the stage whose output holds it, the path within that output)} for stage ``name``'s inputs
    that another stage makes (an input at or under that stage's output)."""
    stages = stages if stages is not None else all_stages(cfg)
    outs = {other: stages[other].output(cfg).resolve() for other in stages if other != name}
    found: dict[str, tuple[str, Path]] = {}
    for key, p in stages[name].inputs(cfg).items():
        if isinstance(p, str) and not Path(p).exists() and not Path(p).is_absolute():
            continue  # a hub id
        path = cfg.path(p).resolve()
        for o, out in outs.items():
            if path == out or out in path.parents:
                found[key] = (o, path.relative_to(out))
                break
    return found


def upstream(name: str, cfg: Config, stages: dict[str, Stage] | None = None) -> list[str]:
    """The stages whose outputs stage ``name`` reads, found from its inputs (an input at or under another stage's
    output), so the flow's dependencies follow whatever ``inputs`` say and never need listing by hand."""
    stages = stages if stages is not None else all_stages(cfg)
    found = {o for o, _ in producers(name, cfg, stages).values()}
    return [o for o in stages if o in found]


def until_targets(names: list[str], until: str | None) -> list[str] | None:
    """``--until X`` (every door: `bertpipe run`, `schedule`, the flow): stage X, or every ``X/...`` (e.g.
    ``finetune``); the flow then runs those and, through the graph, what they need (``tasks.parallel.select``).
    None: no limit. An unknown name is a one-line error."""
    if until is None:
        return None
    matches = [n for n in names if n == until or n.startswith(until + "/")]
    if not matches:
        tops = list(dict.fromkeys(n.split("/")[0] for n in names))
        raise BertpipeError(f"--until {until!r}: not a stage of this pipeline (one of {', '.join(tops)})")
    return matches
