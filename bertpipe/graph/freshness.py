"""The one plan of freshness: is each stage fresh, with its fingerprint and why not. Asked of the whole graph, so
staleness propagates down it. `bertpipe stages`, a one-stage command's check of its upstream, the flow (its Prefect
cache keys: ``tasks.stages.FreshOutput``; a run that lost its server) and ``run_stage`` read it or its per-stage
rule (``bertpipe.core.stage.fingerprint`` over ``Stage.settings``, which is also what dvc.yaml's ``params_effective/``
files hold), so every door agrees on what an edit reruns.

A stage's *expected* fingerprint is the one it will have once every stage above it is up to date. It is computed
in graph order with each upstream stage's expected fingerprint in place of its written manifest:

- an input that *is* an upstream output contributes ``stage:<upstream's expected fingerprint>`` — exactly what
  ``path_digest`` reads from the manifest once that stage is rebuilt;
- an input *under* a stale upstream output (e.g. ``work/vocab/model``) will have contents nobody knows yet: it
  contributes ``pending:<upstream's expected fingerprint>/<path>``, which no manifest holds, so the stage reads as
  stale. (When the rebuilt upstream turns out to write the same bytes, the run itself finds the stage fresh and
  skips it: staleness here is "will be looked at", never "will certainly be rebuilt".)

With every upstream fresh the expected fingerprint is the plain ``bertpipe.core.stage.fingerprint``, which is what
``run_stage`` checks and what the Prefect task's cache key holds (computed when the task starts, i.e. after its
upstream tasks finished), so `bertpipe stages`, the flow and ``run_stage`` agree.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from bertpipe.core.stage import Stage, fingerprint, lost_record, read_manifest
from bertpipe.infra.config import Config
from bertpipe.infra.errors import BertpipeError

# Set in the environment of a stage command the flow starts: the flow orders the stages itself, so the command does
# not refuse an upstream stage the options make stale (refuse_stale_upstream is for a person running one stage).
FLOW_STAGE_ENV = "BERTPIPE_FLOW_STAGE"


@dataclass
class Freshness:
    name: str
    state: str  # "fresh", "stale" or "waiting" (an input that no stage makes is missing)
    fingerprint: str  # expected; "" while waiting
    reason: str = ""

    @property
    def fresh(self) -> bool:
        return self.state == "fresh"


def plan(cfg: Config, stages: dict[str, Stage] | None = None, only: list[str] | None = None,
         ) -> dict[str, Freshness]:
    """Freshness of every stage (or of ``only`` and what they need), upstream first."""
    from bertpipe.graph.pipeline import all_stages, producers

    stages = stages if stages is not None else all_stages(cfg)
    memo: dict[str, Freshness] = {}

    def visit(name: str) -> Freshness:
        if name in memo:
            return memo[name]
        made = producers(name, cfg, stages)
        ups = {key: (visit(up), rel) for key, (up, rel) in made.items()}
        waiting = sorted({f.name for f, _ in ups.values() if f.state == "waiting"})
        if waiting:
            memo[name] = Freshness(name, "waiting", "", f"waits for {', '.join(waiting)}")
            return memo[name]

        def known(key: str, _path: Path | str) -> str | None:
            if key not in ups:
                return None
            up, rel = ups[key]
            if up.fresh:
                return None  # its output on disk is what the stage will read: hash it as run_stage does
            return f"stage:{up.fingerprint}" if rel == Path(".") else f"pending:{up.fingerprint}/{rel.as_posix()}"

        try:
            fp, _ = fingerprint(stages[name], cfg, known)
        except BertpipeError as e:
            memo[name] = Freshness(name, "waiting", "", str(e))
            return memo[name]
        stale_ups = [f.name for f, _ in ups.values() if not f.fresh]
        m = read_manifest(stages[name].output(cfg))
        lost = lost_record(stages[name], cfg) if m is not None and m.get("fingerprint") == fp else None
        if m is not None and m.get("fingerprint") == fp and lost is None:
            memo[name] = Freshness(name, "fresh", fp)
        else:
            why = (f"upstream {', '.join(dict.fromkeys(stale_ups))} stale" if stale_ups
                   else "no output" if m is None else lost or _why(stages[name], m))
            memo[name] = Freshness(name, "stale", fp, why)
        return memo[name]

    for n in (only or list(stages)):
        visit(n)
    return {n: memo[n] for n in stages if n in memo}


def _why(stage: Stage, manifest: dict) -> str:
    """What changed since the output was built, as far as its manifest tells."""
    had = (manifest.get("code") or {}).get("digest")
    if had != stage.code_identity()["digest"]:
        return "code changed"
    return "inputs or params changed"


def upstream_graph(cfg: Config, name: str) -> dict[str, Stage]:
    """Stage ``name`` and every stage above it, made family by family from the inputs' places (a stage's output is
    ``work/<family>/...``): a one-stage command imports the modules of what it reads, never the whole chain's."""
    from bertpipe.graph.pipeline import COMMANDS, family_stages

    graph: dict[str, Stage] = {}
    families: list[str] = []
    todo = [name.split("/")[0]]
    work = cfg.work.resolve()
    while todo:
        fam = todo.pop()
        if fam in families:
            continue
        families.append(fam)
        for st in family_stages(cfg, fam).values():
            graph[st.name] = st
            for p in st.inputs(cfg).values():
                path = cfg.path(p).resolve() if not isinstance(p, str) or Path(p).exists() or Path(p).is_absolute() \
                    else None
                if path is not None and work in path.parents:
                    up = path.relative_to(work).parts[0]
                    if up in COMMANDS and up not in families:
                        todo.append(up)
    order = list(COMMANDS)  # FAMILIES order respects the dependencies: plan() visits upstream first anyway
    return dict(sorted(graph.items(), key=lambda kv: order.index(kv[1].family)))


def refuse_stale_upstream(cfg: Config, name: str, baseline: Config) -> None:
    """A one-stage command run with ``--set``/``--profile`` builds on inputs that are fresh under those settings:
    when they make a stage above ``name`` stale (``bertpipe stages`` with the same options says so) while it is fresh
    under the params file alone (``baseline``), one line naming the stage to run first with the same options, rather
    than a build on that stage's output made with other settings. (A stage already stale without the options is
    the params file's state, which the one-stage commands build on as it is: `bertpipe run` builds the chain.)"""
    from bertpipe.graph.pipeline import producers

    graph = upstream_graph(cfg, name)
    states = plan(cfg, graph, only=[name])
    try:
        base_graph = upstream_graph(baseline, name)
        if name not in base_graph:
            return  # the stage exists only with these options (e.g. a profile's tapt encoder): nothing to compare
        before = plan(baseline, base_graph, only=[name])
    except BertpipeError:
        return  # the params file alone does not resolve (e.g. its paths.raw is set by these options): nothing to compare
    bad = [f for n, f in states.items() if n != name and not f.fresh and n in before and before[n].fresh]
    if not bad:
        return
    direct = {up for up, _ in producers(name, cfg, graph).values()}
    first = bad[0]  # upstream first: the one to run before the others
    why = first.reason or first.state
    fix = " ".join(["bertpipe", *graph[first.name].command])
    also = f" (and {', '.join(f.name for f in bad[1:])} after it)" if len(bad) > 1 else ""
    near = "" if first.name in direct else f", above {name}'s inputs"
    raise BertpipeError(f"{name}: stage {first.name}{near} is {first.state} with these options ({why}); run `{fix}`"
                        f"{also} with the same --set/--profile first, or `bertpipe run --until {name}` with them to "
                        f"build them in order")
