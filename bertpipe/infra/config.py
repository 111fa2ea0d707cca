"""params.yaml: the single source of configuration for the CLI, the Prefect flows and dvc.yaml.

The file holds one section per stage plus a few shared ones, and a ``profiles`` mapping of scale presets
(``profile: demo`` chooses one; ``--profile`` switches). Precedence, lowest first: code defaults < the chosen profile <
the file's own top-level keys < ``--set a.b=c``. So a key written at the top level means what it says whatever the
profile (as Hydra's primary config wins over its defaults list), and ``dvc exp run -S key=value``, which edits the
file's top level, changes the effective value; a key that differs between scales lives in the profiles only.
Every section is a pydantic model with ``extra="forbid"``, so an unknown key, a wrong type or an out-of-range value
is a one-line error naming the key path. The merges and ``--set`` paths are this module's own rather than OmegaConf's,
which would save four lines but keep the profile's keys first (a task order is the file's), replace a scalar on a
``--set`` path instead of saying it is not a section, refuse a YAML date, and add its import to every command.

This module holds the machinery and the shared sections (paths, model, tracking, flow); each stage package declares
its own sections (``<stage>/declare.py``), and the graph composes them into one model (``compose_params``) and
loads params.yaml with it (``bertpipe.graph.pipeline.load_config``), so nothing here imports a stage.
"""

from __future__ import annotations

import copy
import hashlib
import json
import warnings
from pathlib import Path
from typing import Annotated, Any, Callable, Literal, Union

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, create_model

from bertpipe.infra.errors import BertpipeError

DEFAULT_PARAMS = "params.yaml"
PROFILES_FILE = "profiles.yaml"  # optional, beside the params file: more entries of `profiles:`


class Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class PathsParams(Section):
    raw: str = "data/raw"  # corpora and task data as fetched by `bertpipe data samples` (DVC-tracked)
    work: str = "work"  # stage outputs: work/<stage>/...
    state: str = ".bertpipe"  # MLflow store, Prefect home, hash cache, checkpoints of unfinished runs


class ModelParams(Section):
    # "scratch" bootstraps a small general-domain base (stage `base`) from `base_config`; anything else is a
    # save_pretrained directory or a hub id loaded with the Auto classes.
    base: str = "scratch"
    # Tokenizer of the base model. Empty means "the one saved with `base`".
    tokenizer: str = ""
    language: Literal["zh", "en"] = "zh"
    # Force where domain adaptation starts (a save_pretrained dir): the vocab stage extends this encoder and
    # pretraining continues from it. Empty: bertpipe.lib.lineage decides (the base, or the champion per
    # flow.retrain_from).
    continue_from: str = ""


class TrackingParams(Section):
    experiment: str = "bertpipe"
    # Empty: $MLFLOW_TRACKING_URI if set, else an embedded sqlite store under paths.state. "none": no tracking at
    # all (bertpipe.infra.tracking.tracking_off): stage commands log no runs and never import MLflow; pretraining starts
    # from the base (no registry to read a champion from); what needs the registry (register, the flows, `models`)
    # refuses with one error line.
    uri: str = ""


class FlowParams(Section):
    cron: str = "0 3 * * 1"  # the `bertpipe serve` deployment's schedule
    timezone: str = "UTC"
    # New domain files land here (`bertpipe retrain --add`). When it holds files matching the incoming source's glob,
    # they join the domain corpus as one more prepare source, for every front door alike.
    drop_dir: str = "data/incoming"
    incoming_source: dict[str, Any] = Field(
        default_factory=lambda: {"format": "jsonl", "glob": "*.jsonl", "text_field": "text", "id_field": "id",
                                 "group_field": "group", "name": "incoming"}
    )
    retrain_from: Literal["champion", "base"] = "champion"
    # Stages the graph lets run at once (e.g. finetunes, or base finetunes beside pretraining) run this many at a
    # time, each in its own process with cores / max_parallel torch threads; 1 runs everything in the flow's process
    # on all cores. auto: by the usable core count (see tasks.parallel.auto_workers, measured in bench/bench_flow.py).
    max_parallel: Union[Literal["auto"], Annotated[int, Field(ge=1, le=64)]] = "auto"
    # Where the flow's stage tasks run (docs/distributed.md). local: threads and child processes of the flow's
    # process. dask: a Dask cluster, the one at `cluster_address` (e.g. "tcp://10.0.0.5:8786"; every worker sees the
    # project at the same path) or, when empty, a local cluster of `max_parallel` single-threaded worker processes
    # started for the run and closed after it.
    runner: Literal["local", "dask"] = "local"
    cluster_address: str = ""
    # prepare's per-document work (cleaning, MinHash) on this many workers; auto: one per cluster worker under the
    # dask runner, one per core elsewhere. Any number gives the same output, so it is not part of prepare's fingerprint.
    prepare_shards: Union[Literal["auto"], Annotated[int, Field(ge=1, le=1024)]] = "auto"
    # Flow stage tasks: a failure that is not the user's (a tracking-server blip, a crashed child process) is retried
    # this many times, after retry_delay_s, 2x, 4x... (exponential backoff); a user error (bad params or data) is not.
    # stage_timeout_s > 0 fails a stage that runs longer (its process is stopped); 0: no limit.
    stage_retries: int = Field(2, ge=0, le=20)
    retry_delay_s: float = Field(10.0, ge=0)
    stage_timeout_s: float = Field(0.0, ge=0)


# `register` is also ABCMeta.register on the class; instances still see the field, so silence pydantic's warning.
warnings.filterwarnings("ignore", message='Field name "register"', category=UserWarning)


class CoreParams(Section):
    """The sections every pipeline has; ``compose_params`` adds the stages' own."""

    profile: str = ""
    profiles: dict[str, dict[str, Any]] = Field(default_factory=dict)
    paths: PathsParams = Field(default_factory=PathsParams)
    model: ModelParams = Field(default_factory=ModelParams)
    tracking: TrackingParams = Field(default_factory=TrackingParams)
    flow: FlowParams = Field(default_factory=FlowParams)


def compose_params(sections: dict[str, type[BaseModel]], module: str) -> type[CoreParams]:
    """The params model of a pipeline: the shared sections plus ``sections`` ({name: model}, each defaulted). The
    caller binds it to the name ``Params`` in ``module``, where pickle (a Dask worker, a child process) finds it."""
    clash = sorted(set(sections) & set(CoreParams.model_fields))
    if clash:
        raise ValueError(f"params sections {clash} are shared sections; a stage cannot declare them")
    fields: dict[str, Any] = {name: (model, Field(default_factory=model)) for name, model in sections.items()}
    return create_model("Params", __base__=CoreParams, __module__=module, **fields)


class Config:
    """Validated params plus where they came from; paths resolve against the params file's directory."""

    def __init__(self, params: CoreParams, root: Path, source: Path | None = None):
        self.params = params
        self.root = root
        self.source = source

    def path(self, p: str | Path) -> Path:
        """A path from params: ``{raw}`` stands for paths.raw; relative paths resolve against the params file."""
        s = str(p)
        if "{raw}" in s:
            s = s.replace("{raw}", self.params.paths.raw)
        p = Path(s).expanduser()
        return p if p.is_absolute() else (self.root / p)

    @property
    def work(self) -> Path:
        return self.path(self.params.paths.work)

    @property
    def raw(self) -> Path:
        return self.path(self.params.paths.raw)

    @property
    def state(self) -> Path:
        return dvc_exp_state(self.root, self.path(self.params.paths.state))

    def section(self, name: str) -> Any:
        """A params section by dotted path, e.g. ``pretrain`` or ``finetune.tasks.sentiment``."""
        node: Any = self.params
        for part in name.split("."):
            node = node[part] if isinstance(node, dict) else getattr(node, part)
        return node

    def section_dict(self, name: str) -> Any:
        node = self.section(name)
        return node.model_dump(mode="json") if isinstance(node, BaseModel) else node

    def section_shown(self, name: str) -> Any:
        """``section_dict`` fit to print, log or store: credentials in the tracking URI are dropped."""
        value = self.section_dict(name)
        if name == "tracking" and isinstance(value, dict) and value.get("uri"):
            from bertpipe.infra.redact import mask_uri as display_uri

            value = {**value, "uri": display_uri(value["uri"])}
        return value

    def section_hash(self, *names: str) -> str:
        blob = json.dumps({n: self.section_dict(n) for n in names}, sort_keys=True, ensure_ascii=False)
        return hashlib.sha256(blob.encode()).hexdigest()

    def with_overrides(self, overrides: list[str]) -> "Config":
        """This config with ``--set``-style overrides applied over every value, defaults included: a view (other
        paths) for places and files, not for resolving a stage's settings (which tell a value set from a default,
        ``bertpipe.lib.training.params.resolve``; load the params file with the overrides for that)."""
        data = self.params.model_dump(mode="json")
        for item in overrides:
            _apply_override(data, item)
        return Config(validated(type(self.params), data, str(self.source or "params")), self.root, self.source)


def dvc_exp_project(root: Path) -> Path:
    """The project a ``dvc exp run`` copy at ``<project>/.dvc/tmp/exps/<name>/...`` belongs to (a queued or
    ``--temp`` experiment works in such a copy of the repo); any other ``root`` is its own project."""
    parts = root.resolve().parts
    for i in range(len(parts) - 3):
        if parts[i:i + 3] == (".dvc", "tmp", "exps"):
            return Path(*parts[:i])
    return root.resolve()


def dvc_exp_state(root: Path, state: Path) -> Path:
    """The state dir for a project at ``root``. A queued or ``--temp`` `dvc exp run` works in a copy of the repo
    (``dvc_exp_project``), which lacks the git-ignored state dir: it uses the project's own instead, so its MLflow
    runs and registered versions (and the champion lineage reads) are the project's, as in a workspace
    experiment."""
    project = dvc_exp_project(root)
    if project == root.resolve():
        return state
    try:
        return project / state.resolve().relative_to(root.resolve())
    except ValueError:  # an absolute state dir outside the copy is shared already
        return state


def _parse_override(item: str) -> tuple[list[str], Any]:
    if "=" not in item:
        raise BertpipeError(f"--set {item!r}: expected KEY.PATH=VALUE, e.g. --set pretrain.max_steps=100")
    key, raw = item.split("=", 1)
    keys = [k for k in key.strip().split(".") if k]
    if not keys:
        raise BertpipeError(f"--set {item!r}: empty key path")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw  # not YAML (e.g. an SQL fragment with ': '): the string as typed
    return keys, value


def _apply_override(data: dict, item: str) -> None:
    keys, value = _parse_override(item)
    node = data
    for i, k in enumerate(keys[:-1]):
        nxt = node.get(k) if isinstance(node, dict) else None
        if not isinstance(nxt, dict):
            if isinstance(node, dict) and k not in node:
                nxt = node[k] = {}  # let validation name the unknown key
            else:
                raise BertpipeError(f"--set {item!r}: {'.'.join(keys[: i + 1])} is not a section")
        node = nxt
    node[keys[-1]] = value


def deep_merge(base: dict, over: dict) -> dict:
    out = copy.deepcopy(base)
    for k, v in over.items():
        if "." in k:  # profiles may use dotted keys: {pretrain.max_steps: 100}
            head, rest = k.split(".", 1)
            v, k = {rest: v}, head
        if isinstance(v, dict) and isinstance(out.get(k), dict):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v) if not isinstance(v, dict) else deep_merge({}, v)
    return out


def _under(profile: dict, data: dict) -> dict:
    """``data`` deep-merged over ``profile``: the file's own keys win, in the file's order (task order matters)."""
    out = copy.deepcopy(data)
    for k, v in profile.items():
        if k not in out:
            out[k] = copy.deepcopy(v)
        elif isinstance(v, dict) and isinstance(out[k], dict):
            out[k] = _under(v, out[k])
    return out


def format_validation(err: ValidationError, source: str) -> str:
    first = err.errors()[0]
    loc = ".".join(str(p) if len(str(p)) <= 80 else str(p)[:60] + "..." for p in first["loc"]) or "(top level)"
    msg = first["msg"]
    if first["type"] == "extra_forbidden":
        msg = "unknown key"
    elif "input" in first and not isinstance(first["input"], (dict, list)):
        got = repr(first["input"])
        msg = f"{msg} (got {got if len(got) <= 80 else got[:60] + f'... ({len(got):,} chars)'})"
    more = f" (+{len(err.errors()) - 1} more)" if len(err.errors()) > 1 else ""
    return f"{source}: {loc}: {msg}{more}"


def validated(model: type[BaseModel], data: Any, source: str):
    """``model.model_validate(data)``, or one ``error:`` line naming ``source`` and the first bad key."""
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise BertpipeError(format_validation(e, source)) from None


def read_config(model: type[CoreParams], path: str | Path | None = None, profile: str | None = None,
                overrides: list[str] | None = None,
                after: tuple[Callable[[Any, Path, str], Any], ...] = ()) -> Config:
    """Read params.yaml into ``model`` (or use the embedded defaults when ``path`` is None and no params.yaml
    exists); ``after``: adjustments of the validated params, in order (see
    ``bertpipe.core.declared.Family.on_load``)."""
    src = Path(path) if path is not None else Path(DEFAULT_PARAMS)
    if src.exists():
        from bertpipe.infra.yamlio import load_yaml_mapping  # duplicate keys, non-mappings, alias bombs, deep nesting

        data = load_yaml_mapping(src)
    elif path is not None:
        raise BertpipeError(f"{src}: params file does not exist")
    else:
        data = {}
    root = src.resolve().parent
    data = copy.deepcopy(data)
    for item in overrides or []:
        keys, value = _parse_override(item)
        if keys == ["profile"]:
            profile = value
    chosen = profile if profile is not None else data.get("profile", "")
    if chosen is None:
        chosen = ""
    if not isinstance(chosen, str):
        raise BertpipeError(f"{src}: profile: expected a profile name, got {chosen!r}")
    profiles = data.get("profiles") or {}
    if not isinstance(profiles, dict):
        raise BertpipeError(f"{src}: profiles: expected a mapping of profile name -> overrides")
    shelf = src.with_name(PROFILES_FILE)  # profiles kept out of params.yaml: out of DVC's view (README, DVC)
    if src.exists() and shelf.exists():
        from bertpipe.infra.yamlio import load_yaml_mapping

        profiles = {**load_yaml_mapping(shelf, "a mapping of profile name -> overrides"), **profiles}
        data["profiles"] = profiles  # a profile of the same name in params.yaml wins
    if chosen:
        if chosen not in profiles:
            raise BertpipeError(f"{src}: profile {chosen!r} is not defined under profiles: (have {sorted(profiles)})")
        if not isinstance(profiles[chosen], dict):
            raise BertpipeError(f"{src}: profiles.{chosen}: expected a mapping of section -> values")
        # The profile is the layer *under* the file's own keys (see the module docstring).
        data = _under(deep_merge({}, profiles[chosen]), data)
        data["profile"] = chosen
    for item in overrides or []:
        _apply_override(data, item)
    params = validated(model, data, str(src))
    for adjust in after:
        params = adjust(params, root, str(src))
    cfg = Config(params, root, src.resolve() if src.exists() else None)
    # how to load it again in another process (bertpipe.stages.pretrain.run relaunches base/pretrain under torchrun)
    cfg.launch_args = (str(src.resolve()) if src.exists() else None, profile, list(overrides or []))
    return cfg
