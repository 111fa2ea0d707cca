"""The stage graph: which stage's output feeds which input. The CLI, the Prefect flow and dvc.yaml all follow it.

    prepare ─┬─(general)─> base* ─┐
             └─(domain)───────────┴─> vocab ─> pretrain ─> finetune/<task>/<encoder> ─> evaluate ─> register

``base`` exists only when ``model.base: scratch``: it pretrains a small general-domain model from a config, since no
pretrained Chinese weights can be downloaded here. Otherwise the base encoder is ``model.base`` (a dir or hub id).
"""

from __future__ import annotations

from pathlib import Path

from bertpipe.config import Config
from bertpipe.stage import Stage


def base_is_scratch(cfg: Config) -> bool:
    return cfg.params.model.base.strip().lower() == "scratch"


def base_model(cfg: Config) -> Path | str:
    """The base encoder: the bootstrapped one, a local save_pretrained dir, or a hub id (kept as a string)."""
    if base_is_scratch(cfg):
        return cfg.work / "base" / "model"
    p = cfg.path(cfg.params.model.base)
    return p if p.exists() else cfg.params.model.base


def base_tokenizer(cfg: Config) -> Path | str:
    tok = cfg.params.model.tokenizer.strip()
    if not tok:
        return base_model(cfg)
    p = cfg.path(tok)
    return p if p.exists() else tok


def corpus_dir(cfg: Config, name: str) -> Path:
    """A prepared corpus: ``work/prepare/<name>/{train,valid,test}.parquet``."""
    return cfg.work / "prepare" / name


def adapted_model(cfg: Config) -> Path:
    return cfg.work / "pretrain" / "model"


def encoder_dir(cfg: Config, encoder: str) -> Path | str:
    return base_model(cfg) if encoder == "base" else adapted_model(cfg)


def finetune_out(cfg: Config, task: str, encoder: str) -> Path:
    return cfg.work / "finetune" / task / encoder


def prepare_stage() -> Stage:
    from bertpipe.prepare import stage as m

    return Stage("prepare", m.VERSION, ("prepare",), m.own_inputs, lambda c: c.work / "prepare", m.build)


def base_stage() -> Stage:
    from bertpipe.pretrain import stage as m

    def inputs(cfg: Config) -> dict:
        return {"corpus": corpus_dir(cfg, "general"), "tokenizer": base_tokenizer(cfg)}

    # The base model and tokenizer are inputs (hashed by content); of `model:` only the language matters here, so
    # e.g. retrain's model.continue_from does not rebuild the bootstrap base.
    return Stage("base", m.VERSION, ("base", "model.language"), inputs, lambda c: c.work / "base", m.build,
                 params_section="base")


def vocab_stage() -> Stage:
    from bertpipe.vocab import stage as m

    def inputs(cfg: Config) -> dict:
        return {
            "corpus": corpus_dir(cfg, "domain"),
            "model": base_model(cfg),
            "tokenizer": base_tokenizer(cfg),
            **m.own_inputs(cfg),
        }

    return Stage("vocab", m.VERSION, ("vocab", "model.language"), inputs, lambda c: c.work / "vocab", m.build,
                 params_section="vocab")


def pretrain_stage() -> Stage:
    from bertpipe.pretrain import stage as m

    def inputs(cfg: Config) -> dict:
        start = cfg.params.model.continue_from.strip()
        model = cfg.path(start) if start else cfg.work / "vocab" / "model"
        return {"corpus": corpus_dir(cfg, "domain"), "model": model}

    return Stage("pretrain", m.VERSION, ("pretrain", "model.language"), inputs, lambda c: c.work / "pretrain", m.build,
                 params_section="pretrain")


def finetune_stage(task: str, encoder: str) -> Stage:
    from bertpipe.finetune import stage as m

    def inputs(cfg: Config) -> dict:
        return {"encoder": encoder_dir(cfg, encoder), **m.own_inputs(cfg, task)}

    def build(ctx):
        return m.build(ctx, task=task, encoder=encoder)

    return Stage(
        f"finetune/{task}/{encoder}",
        m.VERSION,
        ("finetune.train", f"finetune.tasks.{task}"),
        inputs,
        lambda c: finetune_out(c, task, encoder),
        build,
        params_section="finetune",
    )


def finetune_pairs(cfg: Config) -> list[tuple[str, str]]:
    ft = cfg.params.finetune
    return [(t, e) for t in ft.tasks for e in ft.encoders]


def evaluate_stage() -> Stage:
    from bertpipe.evaluate import stage as m

    def inputs(cfg: Config) -> dict:
        ins: dict = {f"finetune/{t}/{e}": finetune_out(cfg, t, e) for t, e in finetune_pairs(cfg)}
        ins["base"] = base_model(cfg)
        ins["adapted"] = adapted_model(cfg)
        ins["corpus"] = corpus_dir(cfg, "domain")
        return ins

    return Stage("evaluate", m.VERSION, ("evaluate",), inputs, lambda c: c.work / "evaluate", m.build)


def register_stage() -> Stage:
    from bertpipe.register import stage as m

    def inputs(cfg: Config) -> dict:
        ins: dict = {f"finetune/{t}": finetune_out(cfg, t, "adapted") for t in cfg.params.finetune.tasks}
        ins["evaluate"] = cfg.work / "evaluate"
        ins["adapted"] = cfg.work / "pretrain"
        return ins

    return Stage("register", m.VERSION, ("register", "tracking"), inputs, lambda c: c.work / "register", m.build)


def all_stages(cfg: Config) -> dict[str, Stage]:
    """Every stage of the chain for this config, in an order that respects the dependencies."""
    stages: dict[str, Stage] = {"prepare": prepare_stage()}
    if base_is_scratch(cfg):
        stages["base"] = base_stage()
    stages["vocab"] = vocab_stage()
    stages["pretrain"] = pretrain_stage()
    for t, e in finetune_pairs(cfg):
        s = finetune_stage(t, e)
        stages[s.name] = s
    stages["evaluate"] = evaluate_stage()
    stages["register"] = register_stage()
    return stages


def upstream(name: str, cfg: Config, stages: dict[str, Stage] | None = None) -> list[str]:
    """The stages whose outputs stage ``name`` reads, found from its inputs (an input at or under another stage's
    output), so the flow's dependencies follow whatever ``inputs`` say and never need listing by hand."""
    stages = stages if stages is not None else all_stages(cfg)
    outs = {other: stages[other].output(cfg).resolve() for other in stages if other != name}
    found: list[str] = []
    for p in stages[name].inputs(cfg).values():
        if isinstance(p, str) and not Path(p).exists() and not Path(p).is_absolute():
            continue  # a hub id
        path = cfg.path(p).resolve()
        found += [o for o, out in outs.items() if (path == out or out in path.parents) and o not in found]
    return [o for o in stages if o in found]
