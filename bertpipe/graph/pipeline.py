"""The stage graph: the ordered list of stage families, each declared by its stage package (``<stage>/declare.py``,
see ``bertpipe.core.declared``), and the rules between them. The CLI, the Prefect flow, dvc.yaml, the params model and
the import-linter contracts all follow it.

   splits ─(dev/test)─> prepare ─┬─(general)─> base* ─┐
      │                          ├─> start ───────────┤   (start.json: the base, or the champion to continue from)
      │                          └─(domain)───────────┴─> vocab ─> pretrain ─┬──────────────┐
      └─(task dir)──────────────────────────────────────────────────────────┴─> tapt/<t>* ─┴─> finetune/<t>/<encoder>
    finetune ─> evaluate ─> register
    finetune ─> distill/<task> ─> export/<model> ─> register

``splits`` materialises every finetune task's train/dev/test splits once; prepare removes their dev/test texts from
the pretraining corpora, and finetune trains on the task dirs.

``tapt/<task>`` (*) exists only when ``finetune.encoders`` names ``tapt``: continued MLM on the task's own train texts
from the pretrain stage's encoder (DAPT + TAPT), the encoder of ``finetune/<task>/tapt``.

``base`` exists only when ``model.base: scratch``: it pretrains a small general-domain model from a config, since no
pretrained Chinese weights can be downloaded here. Otherwise the base encoder is ``model.base`` (a dir or hub id).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from bertpipe.core.declared import Family
from bertpipe.core.stage import Stage
from bertpipe.infra.config import Config, compose_params, read_config
from bertpipe.infra.errors import BertpipeError
from bertpipe.lib.inference.serve_params import ServeParams
from bertpipe.stages.distill.declare import DISTILL
from bertpipe.stages.evaluate.declare import EVALUATE
from bertpipe.stages.export.declare import EXPORT
from bertpipe.stages.finetune.declare import FINETUNE
from bertpipe.stages.prepare.declare import PREPARE
from bertpipe.stages.pretrain.declare import BASE, PRETRAIN
from bertpipe.stages.register.declare import REGISTER
from bertpipe.stages.splits.declare import SPLITS
from bertpipe.stages.start.declare import START
from bertpipe.stages.tapt.declare import TAPT
from bertpipe.stages.vocab.declare import VOCAB

SELECTOR_HELP = {"task": "One task from finetune.tasks (distill: distill.tasks).", "encoder": "base, adapted or tapt.",
                 "model": "<task>, <task>-student or encoder."}

# The one list: adding a stage is its package (with a declare.py) plus an entry here, in an order that respects the
# dependencies. The CLI's commands, the flow's tasks and edges (from each Stage's inputs), dvc.yaml, `bertpipe
# stages`, the params model and the import-linter contracts (bertpipe.graph.contracts) follow it.
FAMILIES: tuple[Family, ...] = (SPLITS, PREPARE, BASE, START, VOCAB, PRETRAIN, TAPT, FINETUNE, DISTILL, EXPORT,
                                EVALUATE, REGISTER)
# {family: (help, selectors)}: the CLI's stage commands (bertpipe/doors/cli/commands.py makes them from this).
COMMANDS: dict[str, tuple[str, tuple[str, ...]]] = {f.name: (f.help, f.selectors) for f in FAMILIES}
# The model service reads params.yaml too (`bertpipe models serve`); it is a door, not a stage.
SERVICE_PARAMS = {"serve": ServeParams}


def _sections() -> dict:
    """Each family's own params sections, then the service's; a section has one owner."""
    out: dict = {}
    for owner, sections in [*((f.name, f.params) for f in FAMILIES), ("serve", SERVICE_PARAMS)]:
        for name, model in sections.items():
            if name in out:
                raise ValueError(f"params section {name!r} is declared twice (again by {owner})")
            out[name] = model
    return out


# params.yaml's model: the shared sections, each family's own, the service's.
Params = compose_params(_sections(), __name__)


def load_config(path: str | Path | None = None, profile: str | None = None,
                overrides: list[str] | None = None) -> Config:
    """Read params.yaml (or use the embedded defaults when ``path`` is None and no params.yaml exists) into this
    pipeline's params model (see ``bertpipe.infra.config.read_config``)."""
    return read_config(Params, path, profile, overrides, tuple(f.on_load for f in FAMILIES if f.on_load))


def _made(families, cfg: Config) -> dict[str, Stage]:
    out: dict[str, Stage] = {}
    for f in families:
        for st in f.make(cfg):
            out[st.name] = _with_sources(st) if st.sources_from and st.sources is None else st
    return out


def _with_sources(st: Stage) -> Stage:
    """``st`` whose ``sources`` are the stages of its ``sources_from`` families whose whole output is one of its
    inputs, keyed by that input (found from the inputs, as ``producers`` finds the graph's edges)."""

    def sources(cfg: Config) -> dict[str, Stage]:
        stages = {**all_stages(cfg), st.name: st}
        return {key: stages[o] for key, (o, rel) in producers(st.name, cfg, stages).items()
                if rel == Path(".") and stages[o].family in st.sources_from}

    return replace(st, sources=sources)


def all_stages(cfg: Config) -> dict[str, Stage]:
    """Every stage of the chain for this config, in FAMILIES order (which respects the dependencies)."""
    return _made(FAMILIES, cfg)


def family_stages(cfg: Config, family: str) -> dict[str, Stage]:
    """The stages of one family (``finetune/sentiment/base`` is of ``finetune``): a one-stage command (`bertpipe
    start`, run by every `dvc repro`) makes only its own."""
    return _made([f for f in FAMILIES if f.name == family.split("/")[0]], cfg)


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
