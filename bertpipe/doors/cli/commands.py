"""The `bertpipe` command. Every subcommand is a thin call into the library; errors are one line and exit 2."""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
import sys
import time
from pathlib import Path
from typing import Callable, List, Optional

import typer

from bertpipe.infra.errors import BertpipeError, Terminated, raise_terminated

app = typer.Typer(
    add_completion=True,  # typer's --install-completion / --show-completion (bash, zsh, fish, PowerShell)
    no_args_is_help=True,
    help="Domain-adapt, finetune, evaluate and register BERT-family models. Configuration: params.yaml.",
    pretty_exceptions_enable=False,
)
data_app = typer.Typer(no_args_is_help=True, help="Sample data shipped inside PyPI packages.")
app.add_typer(data_app, name="data")
models_app = typer.Typer(no_args_is_help=True, help="The MLflow model registry: list, show, promote, rollback, predict.")
app.add_typer(models_app, name="models")

ParamsOpt = typer.Option("params.yaml", "--params", "-p", help="Params file (the single source of configuration).")
ProfileOpt = typer.Option(None, "--profile", help="Profile under `profiles:` to apply (overrides `profile:`).")
SetOpt = typer.Option(None, "--set", "-s", help="Override a param: --set pretrain.max_steps=100 (repeatable).")
ForceOpt = typer.Option(False, "--force", help="Rebuild even if the output is up to date.")
JsonOpt = typer.Option(False, "--json", help="Print JSON (for scripts) instead of the table.")


def _version(value: bool) -> None:
    if value:
        from bertpipe import __version__

        typer.echo(f"bertpipe {__version__}")
        raise typer.Exit()


@app.callback()
def _main(version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                       help="Print the version and exit.")):
    pass


def echo_json(value) -> None:
    import json

    typer.echo(json.dumps(value, indent=1, ensure_ascii=False, default=str))


def user_errors(fn: Callable) -> Callable:
    """Turn a user's mistake into one line on stderr: ``error: <file/line/key>: what was expected``, exit status 2.
    BertpipeError carries its own message; an OSError names its file; Ctrl-C and SIGTERM end with one line too (the
    stage contract has already removed its temp dir and closed its MLflow run). Anything else is a bug: traceback."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except BertpipeError as e:
            fail(str(e))
        except UnicodeDecodeError as e:  # a reader that did not name its file: still one line, not a traceback
            fail(f"input is not UTF-8 text ({e.reason} at byte {e.start}); convert it first")
        except OSError as e:
            fail(os_error_line(e))
        except Exception as e:
            from bertpipe.infra.tracking import unreachable_line  # only now: importing it costs pydantic + config

            line = unreachable_line(e)
            if line is None:
                raise
            fail(line)
        except KeyboardInterrupt as e:
            what = "terminated (SIGTERM)" if isinstance(e, Terminated) else "interrupted"
            end_progress_bars()
            typer.echo(f"error: {what}; nothing half-written was kept, rerun to continue", err=True)
            raise typer.Exit(143 if isinstance(e, Terminated) else 130)

    return wrapper


def fail(message: str) -> None:
    end_progress_bars()
    from bertpipe.infra.redact import mask_text  # an error may quote a tracking URI with its credentials

    typer.echo(f"error: {mask_text(str(BertpipeError(message)))}", err=True)
    raise typer.Exit(2)


def end_progress_bars() -> None:
    """Close progress bars the failed stage left open (its frames live on in the traceback) and end the line they
    were drawn on, so the error line starts at column 0, not after a half-drawn bar."""
    tqdm_mod = sys.modules.get("tqdm")
    if tqdm_mod is None:
        return  # nothing drew a bar
    bars = list(getattr(getattr(tqdm_mod, "tqdm", None), "_instances", None) or [])
    for bar in bars:
        with contextlib.suppress(Exception):
            bar.close()
    if not bars:
        return  # tqdm imported (transformers does) but no bar on screen: the error line is already at column 0
    with contextlib.suppress(Exception):
        sys.stderr.write("\r\033[K" if sys.stderr.isatty() else "\n")
        sys.stderr.flush()


def os_error_line(e: OSError) -> str:
    """``<file>: <reason>``; a write that ran out of space may have no file name, then just the reason."""
    what = e.strerror or str(e)
    if e.filename is None:
        return what
    extra = f" -> {e.filename2}" if getattr(e, "filename2", None) else ""
    return f"{e.filename}{extra}: {what}"


def load(params: str, profile: Optional[str], overrides: Optional[List[str]]):
    from bertpipe.graph.pipeline import load_config

    explicit = params if (params != "params.yaml" or Path(params).exists()) else None
    return load_config(explicit, profile, overrides or [])


def _run_one(stage_name: str, params: str, profile, overrides, force: bool) -> None:
    from bertpipe.graph.pipeline import all_stages, family_stages

    cfg = load(params, profile, overrides)
    stages = family_stages(cfg, stage_name)  # not all_stages: that imports every stage's module (torch: seconds)
    if stage_name not in stages:
        stages = all_stages(cfg)  # for the message
        raise BertpipeError(f"stage {stage_name!r} is not part of this config's pipeline (have {list(stages)})")
    from bertpipe.graph.freshness import FLOW_STAGE_ENV, refuse_stale_upstream

    # the same answer `bertpipe stages` gives with these options; a stage the flow runs has its order from the flow
    if (overrides or profile is not None) and not os.environ.get(FLOW_STAGE_ENV):
        refuse_stale_upstream(cfg, stage_name, load(params, None, None))
    res = stages[stage_name].launch(cfg, force=force)  # base/pretrain: torchrun-aware (see Stage.launcher)
    if res is None:  # a torchrun rank > 0: rank 0 reports
        return
    from bertpipe_prefect.flows.summary import stage_line

    typer.echo(stage_line(res.name, "cached" if res.skipped else "built", res.out))


def _run_family(family: str, params: str, profile, set_, force: bool, **wanted: Optional[str]) -> None:
    """Run every stage of ``family`` in this config's graph whose identity (Stage.task / .encoder / .model) matches
    the options given (None: any)."""
    from bertpipe.graph.pipeline import family_stages

    cfg = load(params, profile, set_)
    family_of = family_stages(cfg, family)
    names = [n for n, st in family_of.items() if all(v is None or getattr(st, k) == v for k, v in wanted.items())]
    if not names:
        given = {k: v for k, v in wanted.items() if v is not None}
        what = "task" if family == "finetune" else "stage"
        section = "finetune.tasks" if family in ("finetune", "tapt") else family
        # what each option given could have matched, so the fix is in the message
        known = "".join(f"; --{k}: {', '.join(sorted({str(getattr(st, k)) for st in family_of.values()})) or 'none'}"
                        for k in given)
        raise BertpipeError(f"no {family} {what} matches {' '.join(f'--{k} {v}' for k, v in given.items()) or '(any)'}"
                            f" in this config's pipeline (params: {section}{known})")
    for n in names:
        _run_one(n, params, profile, set_, force)


def _stage_command(family: str, help_text: str, selectors: tuple[str, ...]) -> None:
    """`bertpipe <family>` for a family of pipeline.COMMANDS: a one-stage family runs its stage; a fanned-out one
    (finetune, distill, export) runs every stage of it in the graph, or those its options (--task, --encoder,
    --model: the Stage's identity fields) select."""

    def command(params: str, profile: Optional[str], set_: Optional[List[str]], force: bool, **wanted) -> None:
        if selectors:
            _run_family(family, params, profile, set_, force, **wanted)
        else:
            _run_one(family, params, profile, set_, force)

    from bertpipe.graph.pipeline import SELECTOR_HELP

    kw = inspect.Parameter.KEYWORD_ONLY
    options = [inspect.Parameter(sel, kw, default=typer.Option(None, f"--{sel}", help=SELECTOR_HELP[sel]),
                                 annotation=Optional[str]) for sel in selectors]
    common = [("params", ParamsOpt, str), ("profile", ProfileOpt, Optional[str]), ("set_", SetOpt, Optional[List[str]]),
              ("force", ForceOpt, bool)]
    command.__signature__ = inspect.Signature(
        options + [inspect.Parameter(n, kw, default=d, annotation=t) for n, d, t in common])
    command.__annotations__ = {}  # the signature above holds the types
    app.command(family, help=help_text)(user_errors(command))


def _stage_commands() -> None:
    from bertpipe.graph.pipeline import COMMANDS

    for family, (help_text, selectors) in COMMANDS.items():
        _stage_command(family, help_text, selectors)


_stage_commands()


@app.command("stages", help="List the stages of this config's pipeline and whether each is up to date (a stage "
             "is stale when its inputs, params or code changed, or when a stage above it is stale).")
@user_errors
def stages_cmd(params: str = ParamsOpt, profile: Optional[str] = ProfileOpt, set_: Optional[List[str]] = SetOpt,
               as_json: bool = JsonOpt,
               check: bool = typer.Option(False, "--check", help="Exit 1 when any stage is not fresh (for CI).")):
    from bertpipe.graph.freshness import plan
    from bertpipe.infra.tracking import files_only

    cfg = load(params, profile, set_)
    with files_only():  # contacts nothing: a tracking server's answers are the run's to ask
        rows = plan(cfg)
    if as_json:
        echo_json([{"stage": n, "state": f.state, "fingerprint": f.fingerprint, "reason": f.reason}
                   for n, f in rows.items()])
    else:
        for name, f in rows.items():
            state = "waiting for inputs" if f.state == "waiting" else f.state
            note = f"  ({f.reason})" if f.reason else ""
            typer.echo(f"{name:40s} {state:20s} {f.fingerprint[:12]}{note}")
    if check and not all(f.fresh for f in rows.values()):
        raise typer.Exit(1)


@app.command("config", help="Print the resolved configuration (profile and --set applied) as YAML; with --stage, "
             "exactly what that stage reads, resolved (what its fingerprint hashes and its manifest records).")
@user_errors
def config_cmd(
    params: str = ParamsOpt, profile: Optional[str] = ProfileOpt, set_: Optional[List[str]] = SetOpt,
    section: Optional[str] = typer.Argument(None, help="Only this section, e.g. pretrain."),
    stage: Optional[str] = typer.Option(None, "--stage", help="A stage, e.g. finetune/sentiment/base: its spec "
                                        "(per-task overrides folded in, a set value narrowing a search space)."),
):
    import yaml

    cfg = load(params, profile, set_)
    if stage:
        from bertpipe.graph.pipeline import all_stages

        stages = all_stages(cfg)
        if stage not in stages:
            raise BertpipeError(f"config --stage {stage}: no such stage (`bertpipe stages` lists them)")
        data = stages[stage].settings(cfg, shown=True)
    elif section:
        _known_section(cfg, section)
        data = cfg.section_shown(section)
    else:
        data = cfg.params.model_dump(mode="json", exclude={"profiles"})
        data["tracking"] = cfg.section_shown("tracking")
    typer.echo(yaml.safe_dump(data, sort_keys=False, allow_unicode=True).rstrip())


def _known_section(cfg, section: str) -> None:
    """A section path that params has, or one line naming the first unknown part and the names known there."""
    node = cfg.params.model_dump(mode="json", exclude={"profiles"})
    done = []
    for part in section.split("."):
        if not isinstance(node, dict) or part not in node:
            where = ".".join(done) or "params"
            known = ", ".join(sorted(node)) if isinstance(node, dict) else f"none ({where} is a value)"
            raise BertpipeError(f"config {section}: no section {part!r} in {where}; known: {known}")
        done.append(part)
        node = node[part]


def _check_until(cfg, until: Optional[str]) -> None:
    """What a flow would refuse at its start, refused before Prefect starts (one line, no flow-run traceback)."""
    from bertpipe.graph.pipeline import all_stages, until_targets
    from bertpipe.lib.layout import base_model, base_tokenizer

    until_targets(list(all_stages(cfg)), until)  # the flow's own --until rule
    base_model(cfg), base_tokenizer(cfg)  # a base or tokenizer that needs its own code (layout refuses it)


def _check_tracking(cfg) -> None:
    from bertpipe.infra.tracking import tracking_uri

    tracking_uri(cfg)  # a URI MLflow cannot use: one error line before Prefect starts, not a failed flow run


def _prefect_env(cfg, params: str) -> None:
    """Prefect's home under paths.state, set before the flows (and Prefect) are imported."""
    os.environ.setdefault("BERTPIPE_ROOT", str(Path(params).resolve().parent))
    from bertpipe_prefect.tasks.env import prefect_env

    prefect_env(cfg)


def flow_overrides(set_: Optional[List[str]]) -> list[str]:
    """``--set`` items as the flow's ``overrides`` parameter. Prefect stores a flow run's (and a deployment's)
    parameters in its database and shows them in its UI, so an item carrying a credential is refused here, before
    Prefect starts: it belongs in $MLFLOW_TRACKING_URI or params.yaml, which stay out of Prefect."""
    from bertpipe.infra.redact import mask_text

    for item in set_ or []:
        if mask_text(item) != item:
            raise BertpipeError(f"--set {mask_text(item)}: this value carries a credential, and a --set is a Prefect "
                                "flow parameter, stored in Prefect's database; give it in $MLFLOW_TRACKING_URI or "
                                "params.yaml instead")
    return list(set_ or [])


@app.command("run", help="Run the domain_adaptation Prefect flow (every stage; cached stages are skipped).")
@user_errors
def run_cmd(
    params: str = ParamsOpt, profile: Optional[str] = ProfileOpt, set_: Optional[List[str]] = SetOpt,
    until: Optional[str] = typer.Option(None, "--until", help="Stop after this stage (e.g. prepare, pretrain)."),
):
    overrides = flow_overrides(set_)
    cfg = load(params, profile, overrides)
    _check_until(cfg, until)  # fail fast, with a one-line error, before Prefect starts
    _check_tracking(cfg)
    _prefect_env(cfg, params)
    from prefect.exceptions import CancelledRun

    from bertpipe_prefect.flows.domain_adaptation import domain_adaptation  # the CLI is a door; the library is not
    from bertpipe_prefect.flows.lost_api import api_lost, gone, outcome, quiet_engine_tracebacks
    from bertpipe_prefect.flows.summary import summary

    started = time.time()
    quiet_engine_tracebacks()
    try:
        results = domain_adaptation(params, profile, overrides, until)
    except CancelledRun as e:
        _cancelled(e)
    except Exception as e:
        if api_lost(e) is None:
            raise
        gone(api_lost(e), say=False)  # what Prefect still sends on exit (its last log batches) tries once
        results = outcome(cfg, until, started, e)  # one error line unless every stage finished
        typer.echo(f"warning: the Prefect server was lost during the run ({api_lost(e)}); every stage finished, so "
                   "the run succeeded (its Prefect flow run may still show as running)", err=True)
    typer.echo(summary(results, cfg))


def _cancelled(e: BaseException) -> None:
    """A flow run cancelled through the Prefect API (flows/cancel.py): its stage processes were stopped and no stage
    started since."""
    fail(f"{e}; its running stages were stopped and nothing half-written was kept")


@app.command("retrain", help="Add new domain files, re-run what they invalidate, challenger vs champion.")
@user_errors
def retrain_cmd(
    add: List[str] = typer.Option(..., "--add", help="New domain file(s) (jsonl, as flow.incoming_source says)."),
    params: str = ParamsOpt, profile: Optional[str] = ProfileOpt, set_: Optional[List[str]] = SetOpt,
):
    from bertpipe.doors.incoming import plan

    overrides = flow_overrides(set_)
    cfg = load(params, profile, overrides)
    plan(cfg, list(add))  # every file as prepare will read it, before Prefect starts
    _check_until(cfg, None)
    _check_tracking(cfg)
    _prefect_env(cfg, params)
    from prefect.exceptions import CancelledRun

    from bertpipe_prefect.flows.retrain import retrain
    from bertpipe_prefect.flows.summary import summary

    try:
        out = retrain(params, list(add), profile, overrides)
    except CancelledRun as e:
        _cancelled(e)
    typer.echo(f"added: {', '.join(out['added'])}")
    typer.echo(summary(out["results"], load(params, profile, out["overrides"])))


@app.command("schedule", help="Serve a scheduled Prefect deployment of domain_adaptation (cron from flow.cron).")
@user_errors
def schedule_cmd(
    params: str = ParamsOpt, profile: Optional[str] = ProfileOpt, set_: Optional[List[str]] = SetOpt,
    until: Optional[str] = typer.Option(None, "--until", help="Runs stop after this stage."),
    name: str = typer.Option("bertpipe-domain-adaptation", "--name", help="Deployment name."),
):
    overrides = flow_overrides(set_)
    cfg = load(params, profile, overrides)
    _check_until(cfg, until)
    _check_tracking(cfg)
    _prefect_env(cfg, params)
    if not os.environ.get("PREFECT_API_URL"):
        typer.echo("note: PREFECT_API_URL is not set; serving against a temporary local server. For a UI, run "
                   "`prefect server start --host 127.0.0.1` and export PREFECT_API_URL=http://127.0.0.1:4200/api",
                   err=True)
    from bertpipe_prefect.flows.schedule import serve

    serve(params, profile, overrides, until, name)



@app.command("dvc-yaml", help="Write dvc.yaml (and stages/*/dvc.yaml, params_effective/) from the stage graph and "
             "params (or --check that they are current).")
@user_errors
def dvc_yaml_cmd(
    params: str = ParamsOpt, profile: Optional[str] = ProfileOpt, set_: Optional[List[str]] = SetOpt,
    check: bool = typer.Option(False, "--check", help="Exit 1 if a generated file differs from what would be written."),
    effective: bool = typer.Option(False, "--effective", help="Write only params_effective/, each stage's resolved "
                                   "params and code digest, which its DVC stage depends on (dvc.yaml's first stage "
                                   "runs this when params.yaml, profiles.yaml or the project's code changes)."),
):
    from bertpipe.core.outputs import atomic_write_text
    from bertpipe.doors.dvc.dvcfile import (EFFECTIVE, SPLIT_DIR, dvcignore_lines, foreign_stages, leftover_effective,
                                  leftover_files, refuse_foreign, render_effective, render_files, split_stages)

    cfg = load(params, profile, set_)
    eff = render_effective(cfg)  # what each DVC stage depends on
    if effective:
        for p in leftover_effective(cfg.root, eff):
            (cfg.root / p).unlink()
        for p, text in eff.items():
            (cfg.root / p).parent.mkdir(parents=True, exist_ok=True)
            if not (cfg.root / p).is_file() or (cfg.root / p).read_text(encoding="utf-8") != text:
                atomic_write_text(cfg.root / p, text)
        typer.echo(f"wrote {cfg.root / EFFECTIVE}/")
        return
    files = {**render_files(cfg), **eff}  # everything rendered before anything is written
    leftover = leftover_files(cfg.root, files) + leftover_effective(cfg.root, eff)
    split = split_stages(files)
    if check:
        stale = [p for p, text in files.items()
                 if not (cfg.root / p).exists() or (cfg.root / p).read_text(encoding="utf-8") != text] + leftover
        if stale:
            shown = stale if len(stale) <= 6 else stale[:6] + [f"{len(stale) - 6} more"]
            typer.echo(f"{', '.join(shown)} out of date in {cfg.root}: run `bertpipe dvc-yaml`", err=True)
            raise typer.Exit(1)
        typer.echo(f"{cfg.root / 'dvc.yaml'} and {EFFECTIVE}/ are current")
        return
    refuse_foreign(cfg.root, files)
    dropped = foreign_stages(cfg.root, files)
    for p, text in files.items():
        (cfg.root / p).parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(cfg.root / p, text)
        if p not in eff:
            typer.echo(f"wrote {cfg.root / p}")
    typer.echo(f"wrote {cfg.root / EFFECTIVE}/")
    for p in leftover:  # a stage no longer in a file of its own: a second definition of it would break DVC
        (cfg.root / p).unlink()
        typer.echo(f"removed {cfg.root / p} (no longer generated)")
    if dropped:  # said, with where such a stage belongs: dvc.yaml is rewritten whole
        typer.echo(f"note: dropped the stage(s) {', '.join(dropped)} that {cfg.root / 'dvc.yaml'} held but bertpipe "
                   "does not generate (`git diff dvc.yaml` shows them); a stage of your own goes in a dvc.yaml of "
                   "another folder, which DVC reads too")
    ignore = dvcignore_lines(cfg)
    if ignore:  # a line appended to the user's file, which keeps everything it had
        with open(cfg.root / ".dvcignore", "a", encoding="utf-8") as f:
            f.write("".join(f"{ln}\n" for ln in ignore))
        typer.echo(f"added {', '.join(ignore)} to {cfg.root / '.dvcignore'} (bytecode is no code change)")
    if split:
        typer.echo(f"note: git-track the stages' own files (`git add {SPLIT_DIR}/ {EFFECTIVE}/`): a `dvc exp run "
                   "--temp` copy holds only tracked files")


@app.command("gc", help="Remove token stores (paths.state/tokstore) that no stage output uses, keeping the most "
             "recently used few.")
@user_errors
def gc_cmd(
    params: str = ParamsOpt, profile: Optional[str] = ProfileOpt, set_: Optional[List[str]] = SetOpt,
    keep_recent: int = typer.Option(4, "--keep-recent", min=0, help="Unreferenced stores kept, most recent first."),
    json_: bool = JsonOpt,
):
    from bertpipe.lib import keyedstore

    cfg = load(params, profile, set_)
    root = keyedstore.root_of(cfg.state)
    res = keyedstore.collect(root, keyedstore.referenced(cfg.work), keep_recent, log=lambda m: None)
    if json_:
        echo_json(res)
        return
    typer.echo(f"{root}: removed {len(res['removed'])} token store(s) ({res['bytes'] / 1e6:.1f} MB), kept "
               f"{len(res['kept'])}" + (f", {len(res['in_use'])} in use by another process" if res["in_use"] else ""))


@data_app.command("samples", help="Download (cached) and unpack the pinned sample corpora into paths.raw.")
@user_errors
def samples_cmd(
    names: Optional[List[str]] = typer.Argument(None, help="Samples to fetch (default: the demo's; optional: envtext, minilm)."),
    params: str = ParamsOpt, profile: Optional[str] = ProfileOpt, set_: Optional[List[str]] = SetOpt,
    dvc: bool = typer.Option(True, "--dvc/--no-dvc", help="`dvc add` the raw folder when inside a DVC repo."),
):
    from bertpipe.lib.samples import DEFAULT_SAMPLES, fetch_samples

    cfg = load(params, profile, set_)
    fetch_samples(cfg.raw, cfg.state, tuple(names or DEFAULT_SAMPLES), log=typer.echo)
    if dvc:
        from bertpipe.infra.versioning import dvc_add_if_repo

        dvc_add_if_repo(cfg.raw, cfg.root, log=typer.echo)


@data_app.command("new-laws", help="Export the laws published on/after --since as jsonl: new data for `retrain`.")
@user_errors
def new_laws_cmd(
    out: str = typer.Option(..., "--out", help="The jsonl file to write."),
    since: str = typer.Option("2022-01-01", "--since", help="publish_date cutoff (YYYY-MM-DD)."),
    limit: int = typer.Option(0, "--limit", help="At most this many articles (0: all)."),
    params: str = ParamsOpt, profile: Optional[str] = ProfileOpt, set_: Optional[List[str]] = SetOpt,
):
    from bertpipe.lib.samples import export_laws_since

    cfg = load(params, profile, set_)
    n = export_laws_since(cfg.raw / "china_law" / "laws.db", since, Path(out), limit)
    typer.echo(f"wrote {n} articles of laws published since {since} to {out}")


def _registry(params: str, profile, set_):
    """The config and a client on its registry, which must exist: the `models` commands never create a store."""
    from bertpipe.infra.tracking import client

    cfg = load(params, profile, set_)
    return cfg, client(cfg, create=False)


@models_app.command("list", help="Registered models with their latest version and aliases.")
@user_errors
def models_list(params: str = ParamsOpt, profile: Optional[str] = ProfileOpt, set_: Optional[List[str]] = SetOpt,
                as_json: bool = JsonOpt):
    from bertpipe.lib.registered.champion import describe_models

    cfg, c = _registry(params, profile, set_)
    rows = describe_models(c)
    if as_json:
        return echo_json(rows)
    if not rows:
        typer.echo("no registered models")
    for r in rows:
        aliases = " ".join(f"{a}=v{v}" for a, v in sorted(r["aliases"].items())) or "-"
        typer.echo(f"{r['name']:40s} latest v{r['latest']:<4} {aliases}")


@models_app.command("show", help="Every version of a registered model: aliases, primary metric, decision.")
@user_errors
def models_show(
    name: str, params: str = ParamsOpt, profile: Optional[str] = ProfileOpt, set_: Optional[List[str]] = SetOpt,
    as_json: bool = JsonOpt,
):
    from bertpipe.lib.registered.champion import describe_versions

    cfg, c = _registry(params, profile, set_)
    rows = describe_versions(c, name)
    if as_json:
        return echo_json(rows)
    for r in rows:
        aliases = ",".join(r["aliases"]) or "-"
        typer.echo(f"v{r['version']:<4} {aliases:22s} {r['metric']}={r['value']}  {r['decision']}")


@models_app.command("promote", help="Make VERSION the champion of NAME.")
@user_errors
def models_promote(
    name: str, version: str, params: str = ParamsOpt, profile: Optional[str] = ProfileOpt,
    set_: Optional[List[str]] = SetOpt,
    force: bool = typer.Option(False, "--force", help="Promote a degenerate version too (one that learned nothing)."),
):
    from bertpipe.lib.registered.champion import promote

    cfg, c = _registry(params, profile, set_)
    promote(c, name, version, force)
    typer.echo(f"{name}: champion -> v{version}")


@models_app.command("rollback", help="Give the champion alias back to the previous champion of NAME.")
@user_errors
def models_rollback(
    name: str, params: str = ParamsOpt, profile: Optional[str] = ProfileOpt, set_: Optional[List[str]] = SetOpt
):
    from bertpipe.lib.registered.champion import rollback

    cfg, c = _registry(params, profile, set_)
    v = rollback(c, name)
    typer.echo(f"{name}: champion -> v{v}")


@models_app.command("serve", help="Serve NAME[@alias|/version] over HTTP with dynamic batching; follows the alias.")
@user_errors
def models_serve(
    model: str = typer.Argument(..., help="NAME (its serve.alias, champion by default), NAME@alias or NAME/version"),
    host: Optional[str] = typer.Option(None, help="bind address (serve.host; 127.0.0.1 unless told otherwise)"),
    port: Optional[int] = typer.Option(None, help="port (serve.port)"),
    max_batch_size: Optional[int] = typer.Option(None, "--max-batch-size", help="serve.max_batch_size (1: off)"),
    backend: Optional[str] = typer.Option(None, "--backend", help="torch, onnx or int8 (serve.backend; the ONNX "
                                          "files registered with the version)"),
    device: Optional[str] = typer.Option(None, "--device", help="auto, cpu or cuda (serve.device; auto: the GPU "
                                         "when there is one)"),
    params: str = ParamsOpt, profile: Optional[str] = ProfileOpt, set_: Optional[List[str]] = SetOpt,
):
    from bertpipe.infra.extras import require

    require("serve", "bertpipe models serve")
    from bertpipe.doors.serve.app import check_port, exposure_warning, listen_host, serve
    from bertpipe.doors.serve.predictor import ModelRef, Served, resolve_version

    extra = [f"serve.{k}={v}" for k, v in (("host", host), ("port", port), ("max_batch_size", max_batch_size),
                                            ("backend", backend), ("device", device)) if v is not None]
    overrides = list(set_ or []) + extra
    cfg, c = _registry(params, profile, overrides)
    sp = cfg.params.serve
    if exposure_warning(sp.host):
        typer.echo(exposure_warning(sp.host), err=True)
    sp.accelerator()  # --device cuda without a GPU: one error line before anything is loaded
    sp.host = listen_host(sp.host)  # an address LitServe does not take: the same
    check_port(sp.host, sp.port)  # a busy port: the same
    ref = ModelRef.parse(model, sp.alias)
    # Load it once here: a missing model or export is a one-line error now, not a worker that never becomes ready
    # (and the version's files are then cached for the worker).
    # (On the CPU: the worker loads it on serve.device; CUDA is never initialised in the process LitServe forks.)
    task = Served(cfg, ref.name, resolve_version(c, ref), sp.backend, sp.max_batch_size, "cpu").task
    serve(ref, (str(Path(params).resolve()), profile, overrides), sp, cfg.state, task=task,
          log=lambda m: typer.echo(m, err=True))


@models_app.command("predict", help="Score a jsonl/csv/txt file with a registered model (NAME, NAME@alias, NAME/3).")
@user_errors
def models_predict(
    model: str = typer.Argument(..., help="NAME (its champion), NAME@alias or NAME/version."),
    input_: str = typer.Option(..., "--input", "-i", help="jsonl ({text} or {question, context}), csv or txt."),
    output: str = typer.Option(..., "--output", "-o", help="jsonl: one line per input line, in order."),
    backend: str = typer.Option("torch", "--backend", help="torch, onnx or int8 (the version's export files)."),
    batch_size: int = typer.Option(32, "--batch-size", min=1),
    device: str = typer.Option("auto", "--device", help="auto, cpu or cuda (auto: the GPU when there is one)."),
    strict: bool = typer.Option(False, "--strict", help="Stop at the first bad line (default: report it, go on)."),
    force: bool = typer.Option(False, "--force", help="Replace an existing --output file."),
    params: str = ParamsOpt, profile: Optional[str] = ProfileOpt, set_: Optional[List[str]] = SetOpt,
) -> None:
    from bertpipe.lib.inference.files import check_paths, predict_file
    from bertpipe.lib.inference.predictor import Predictor, resolve_device
    from bertpipe.lib.registered.files import local_version

    check_paths(Path(input_), Path(output), force)  # before the model is loaded (seconds)
    cfg = load(params, profile, set_)
    device = resolve_device(device)
    lv = local_version(cfg, model)
    predictor = Predictor.from_dir(lv.model_dir, lv.files_dir, backend=backend, batch_size=batch_size,
                                   device=device)
    stats = predict_file(predictor, Path(input_), Path(output), strict=strict, force=force)
    typer.echo(f"{lv.name} v{lv.version} ({backend}, {device}): {stats['predicted']} of {stats['lines']} lines "
               f"predicted, {stats['bad']} bad -> {output}")


def main() -> None:  # pragma: no cover
    import signal

    from bertpipe.infra import lifeline, progress

    lifeline.start()  # what this command starts (stages, servers, pools) ends with it, even on SIGKILL
    progress.lines_unless_terminal()  # stderr to a file or pipe: progress bars as occasional whole lines
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    # SIGTERM (a scheduler stopping the job, `kill`) unwinds like Ctrl-C: temp dirs removed, MLflow run KILLED.
    signal.signal(signal.SIGTERM, raise_terminated)
    app()

