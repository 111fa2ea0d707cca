"""The `bertpipe` command. Every subcommand is a thin call into the library; errors are one line and exit 2."""

from __future__ import annotations

import functools
import os
import sys
from pathlib import Path
from typing import Callable, List, Optional

import typer

from bertpipe.errors import BertpipeError

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Domain-adapt, finetune, evaluate and register BERT-family models. Configuration: params.yaml.",
    pretty_exceptions_enable=False,
)
data_app = typer.Typer(no_args_is_help=True, help="Sample data shipped inside PyPI packages.")
app.add_typer(data_app, name="data")
models_app = typer.Typer(no_args_is_help=True, help="The MLflow model registry: list, show, promote, rollback.")
app.add_typer(models_app, name="models")

ParamsOpt = typer.Option("params.yaml", "--params", "-p", help="Params file (the single source of configuration).")
ProfileOpt = typer.Option(None, "--profile", help="Profile under `profiles:` to apply (overrides `profile:`).")
SetOpt = typer.Option(None, "--set", "-s", help="Override a param: --set pretrain.max_steps=100 (repeatable).")
ForceOpt = typer.Option(False, "--force", help="Rebuild even if the output is up to date.")


def user_errors(fn: Callable) -> Callable:
    """Turn BertpipeError (and a missing-file OSError) into `error: ...` on stderr and exit status 2."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except BertpipeError as e:
            typer.echo(f"error: {e}", err=True)
            raise typer.Exit(2)
        except FileNotFoundError as e:
            typer.echo(f"error: {e.filename or e}: no such file or directory", err=True)
            raise typer.Exit(2)

    return wrapper


def load(params: str, profile: Optional[str], overrides: Optional[List[str]]):
    from bertpipe.config import load_config

    explicit = params if (params != "params.yaml" or Path(params).exists()) else None
    return load_config(explicit, profile, overrides or [])


def _run_one(stage_name: str, params: str, profile, overrides, force: bool) -> None:
    from bertpipe.pipeline import all_stages
    from bertpipe.stage import run_stage

    cfg = load(params, profile, overrides)
    stages = all_stages(cfg)
    if stage_name not in stages:
        raise BertpipeError(f"stage {stage_name!r} is not part of this config's pipeline (have {list(stages)})")
    if stage_name in ("base", "pretrain"):
        # Under torchrun every rank trains; only rank 0 writes the output (see bertpipe.pretrain.run).
        from bertpipe.pretrain.run import run as run_ranked

        res = run_ranked(stages[stage_name], cfg, force=force)
        if res is None:  # a rank > 0: rank 0 reports
            return
    else:
        res = run_stage(stages[stage_name], cfg, force=force)
    from flows.summary import stage_line

    typer.echo(stage_line(res.name, "cached" if res.skipped else "built", res.out))


def _stage_command(name: str, help_text: str) -> None:
    @app.command(name, help=help_text)
    @user_errors
    def command(
        params: str = ParamsOpt, profile: Optional[str] = ProfileOpt, set_: Optional[List[str]] = SetOpt,
        force: bool = ForceOpt,
    ) -> None:
        _run_one(name, params, profile, set_, force)


_stage_command("prepare", "Ingest, clean, deduplicate and split the raw corpora into work/prepare.")
_stage_command("base", "Pretrain a small general-domain base from scratch (when model.base: scratch).")
_stage_command("vocab", "Mine domain words, extend the tokenizer and initialise the new embeddings.")
_stage_command("pretrain", "Continued MLM pretraining on the domain corpus (torchrun-compatible).")
_stage_command("evaluate", "Evaluate finetuned models; base vs adapted report.")
_stage_command("register", "Register the finetuned models in the MLflow registry (champion/challenger).")


@app.command("finetune", help="Finetune a task head (every task x encoder in params, or one with --task/--encoder).")
@user_errors
def finetune_cmd(
    task: Optional[str] = typer.Option(None, "--task", help="One task from finetune.tasks."),
    encoder: Optional[str] = typer.Option(None, "--encoder", help="base or adapted."),
    params: str = ParamsOpt, profile: Optional[str] = ProfileOpt, set_: Optional[List[str]] = SetOpt,
    force: bool = ForceOpt,
) -> None:
    from bertpipe.pipeline import finetune_pairs

    cfg = load(params, profile, set_)
    pairs = [(t, e) for t, e in finetune_pairs(cfg) if (task in (None, t)) and (encoder in (None, e))]
    if not pairs:
        raise BertpipeError(f"no finetune task matches --task {task} --encoder {encoder} (params: finetune.tasks)")
    for t, e in pairs:
        _run_one(f"finetune/{t}/{e}", params, profile, set_, force)


@app.command("stages", help="List the stages of this config's pipeline and whether each is up to date.")
@user_errors
def stages_cmd(params: str = ParamsOpt, profile: Optional[str] = ProfileOpt, set_: Optional[List[str]] = SetOpt):
    from bertpipe.pipeline import all_stages
    from bertpipe.stage import is_fresh

    cfg = load(params, profile, set_)
    for name, st in all_stages(cfg).items():
        try:
            fresh, fp = is_fresh(st, cfg)
            state = "fresh" if fresh else "stale"
        except BertpipeError:
            state, fp = "waiting for inputs", ""
        typer.echo(f"{name:40s} {state:20s} {fp[:12]}")


@app.command("config", help="Print the resolved configuration (profile and --set applied) as YAML.")
@user_errors
def config_cmd(
    params: str = ParamsOpt, profile: Optional[str] = ProfileOpt, set_: Optional[List[str]] = SetOpt,
    section: Optional[str] = typer.Argument(None, help="Only this section, e.g. pretrain."),
):
    import yaml

    cfg = load(params, profile, set_)
    data = cfg.section_dict(section) if section else cfg.params.model_dump(mode="json", exclude={"profiles"})
    typer.echo(yaml.safe_dump(data, sort_keys=False, allow_unicode=True).rstrip())


def _prefect_env(cfg, params: str) -> None:
    """Prefect's home under paths.state, set before the flows (and Prefect) are imported."""
    os.environ.setdefault("BERTPIPE_ROOT", str(Path(params).resolve().parent))
    from tasks.env import prefect_env

    prefect_env(cfg)


@app.command("run", help="Run the domain_adaptation Prefect flow (every stage; cached stages are skipped).")
@user_errors
def run_cmd(
    params: str = ParamsOpt, profile: Optional[str] = ProfileOpt, set_: Optional[List[str]] = SetOpt,
    until: Optional[str] = typer.Option(None, "--until", help="Stop after this stage (e.g. prepare, pretrain)."),
):
    cfg = load(params, profile, set_)  # fail fast, with a one-line error, before Prefect starts
    _prefect_env(cfg, params)
    from bertpipe.pipeline import all_stages
    from flows.domain_adaptation import domain_adaptation, targets  # the CLI is a front door; the library is not
    from flows.summary import summary

    targets(list(all_stages(cfg)), until)  # a wrong --until is a one-line error before Prefect starts
    results = domain_adaptation(params, profile, list(set_ or []), until)
    typer.echo(summary(results, cfg))


@app.command("retrain", help="Add new domain files, re-run what they invalidate, challenger vs champion.")
@user_errors
def retrain_cmd(
    add: List[str] = typer.Option(..., "--add", help="New domain file(s) (jsonl, as flow.incoming_source says)."),
    params: str = ParamsOpt, profile: Optional[str] = ProfileOpt, set_: Optional[List[str]] = SetOpt,
):
    cfg = load(params, profile, set_)
    for p in add:
        if not Path(p).is_file():
            raise BertpipeError(f"--add {p}: not a file")
    _prefect_env(cfg, params)
    from flows.retrain import retrain
    from flows.summary import summary

    out = retrain(params, list(add), profile, list(set_ or []))
    typer.echo(f"added: {', '.join(out['added'])}")
    typer.echo(summary(out["results"], load(params, profile, out["overrides"])))


@app.command("serve", help="Serve a scheduled Prefect deployment of domain_adaptation (cron from flow.cron).")
@user_errors
def serve_cmd(
    params: str = ParamsOpt, profile: Optional[str] = ProfileOpt, set_: Optional[List[str]] = SetOpt,
    until: Optional[str] = typer.Option(None, "--until", help="Runs stop after this stage."),
    name: str = typer.Option("bertpipe-domain-adaptation", "--name", help="Deployment name."),
):
    cfg = load(params, profile, set_)
    _prefect_env(cfg, params)
    if not os.environ.get("PREFECT_API_URL"):
        typer.echo("note: PREFECT_API_URL is not set; serving against a temporary local server. For a UI, run "
                   "`prefect server start --host 127.0.0.1` and export PREFECT_API_URL=http://127.0.0.1:4200/api",
                   err=True)
    from flows.serve import serve

    serve(params, profile, list(set_ or []), until, name)


@app.command("dvc-yaml", help="Write dvc.yaml from the stage graph and params (or --check that it is current).")
@user_errors
def dvc_yaml_cmd(
    params: str = ParamsOpt, profile: Optional[str] = ProfileOpt, set_: Optional[List[str]] = SetOpt,
    check: bool = typer.Option(False, "--check", help="Exit 1 if dvc.yaml differs from what would be written."),
):
    from bertpipe.dvcfile import render

    cfg = load(params, profile, set_)
    text = render(cfg)
    target = cfg.root / "dvc.yaml"
    if check:
        current = target.read_text(encoding="utf-8") if target.exists() else ""
        if current != text:
            typer.echo(f"{target} is out of date: run `bertpipe dvc-yaml`", err=True)
            raise typer.Exit(1)
        typer.echo(f"{target} is current")
        return
    tmp = target.with_suffix(".yaml.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, target)
    typer.echo(f"wrote {target}")


@data_app.command("samples", help="Download (cached) and unpack the pinned sample corpora into paths.raw.")
@user_errors
def samples_cmd(
    names: Optional[List[str]] = typer.Argument(None, help="Samples to fetch (default: the demo's)."),
    params: str = ParamsOpt, profile: Optional[str] = ProfileOpt, set_: Optional[List[str]] = SetOpt,
    dvc: bool = typer.Option(True, "--dvc/--no-dvc", help="`dvc add` the raw folder when inside a DVC repo."),
):
    from bertpipe.samples import DEFAULT_SAMPLES, fetch_samples

    cfg = load(params, profile, set_)
    fetch_samples(cfg.raw, cfg.state, tuple(names or DEFAULT_SAMPLES), log=typer.echo)
    if dvc:
        from bertpipe.versioning import dvc_add_if_repo

        dvc_add_if_repo(cfg.raw, cfg.root, log=typer.echo)


@data_app.command("new-laws", help="Export the laws published on/after --since as jsonl: new data for `retrain`.")
@user_errors
def new_laws_cmd(
    out: str = typer.Option(..., "--out", help="The jsonl file to write."),
    since: str = typer.Option("2022-01-01", "--since", help="publish_date cutoff (YYYY-MM-DD)."),
    limit: int = typer.Option(0, "--limit", help="At most this many articles (0: all)."),
    params: str = ParamsOpt, profile: Optional[str] = ProfileOpt, set_: Optional[List[str]] = SetOpt,
):
    from bertpipe.samples import export_laws_since

    cfg = load(params, profile, set_)
    n = export_laws_since(cfg.raw / "china_law" / "laws.db", since, Path(out), limit)
    typer.echo(f"wrote {n} articles of laws published since {since} to {out}")


def _registry(params: str, profile, set_):
    from bertpipe.tracking import client

    cfg = load(params, profile, set_)
    return cfg, client(cfg)


@models_app.command("list", help="Registered models with their latest version and aliases.")
@user_errors
def models_list(params: str = ParamsOpt, profile: Optional[str] = ProfileOpt, set_: Optional[List[str]] = SetOpt):
    from bertpipe.register.registry import describe_models

    cfg, c = _registry(params, profile, set_)
    rows = describe_models(c)
    if not rows:
        typer.echo("no registered models")
    for r in rows:
        aliases = " ".join(f"{a}=v{v}" for a, v in sorted(r["aliases"].items())) or "-"
        typer.echo(f"{r['name']:40s} latest v{r['latest']:<4} {aliases}")


@models_app.command("show", help="Every version of a registered model: aliases, primary metric, decision.")
@user_errors
def models_show(
    name: str, params: str = ParamsOpt, profile: Optional[str] = ProfileOpt, set_: Optional[List[str]] = SetOpt
):
    from bertpipe.register.registry import describe_versions

    cfg, c = _registry(params, profile, set_)
    for r in describe_versions(c, name):
        aliases = ",".join(r["aliases"]) or "-"
        typer.echo(f"v{r['version']:<4} {aliases:22s} {r['metric']}={r['value']}  {r['decision']}")


@models_app.command("promote", help="Make VERSION the champion of NAME.")
@user_errors
def models_promote(
    name: str, version: str, params: str = ParamsOpt, profile: Optional[str] = ProfileOpt,
    set_: Optional[List[str]] = SetOpt,
):
    from bertpipe.register.registry import promote

    cfg, c = _registry(params, profile, set_)
    promote(c, name, version)
    typer.echo(f"{name}: champion -> v{version}")


@models_app.command("rollback", help="Give the champion alias back to the previous champion of NAME.")
@user_errors
def models_rollback(
    name: str, params: str = ParamsOpt, profile: Optional[str] = ProfileOpt, set_: Optional[List[str]] = SetOpt
):
    from bertpipe.register.registry import rollback

    cfg, c = _registry(params, profile, set_)
    v = rollback(c, name)
    typer.echo(f"{name}: champion -> v{v}")


def main() -> None:  # pragma: no cover
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    app()


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
