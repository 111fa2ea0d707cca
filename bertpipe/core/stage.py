"""The stage contract shared by every stage and every front door.

A stage is (inputs: paths, params sections, version) -> one output directory. ``run_stage``:

1. computes the fingerprint: sha256 over the inputs' contents (a stage output contributes the fingerprint in its
   manifest rather than its bytes), the named params sections, the stage version and the code that builds the output
   (its source modules and library versions, ``bertpipe.core.codeid``);
2. if ``out/manifest.json`` holds that fingerprint, skips and says so;
3. otherwise builds into a temp dir beside ``out`` under a per-output lock, writes ``manifest.json`` last and renames
   the temp dir into place, so a crash never leaves a directory that looks complete;
4. logs params, metrics, the manifest and the stage's reports to MLflow.

What a build may write: its output (``ctx.out``), its ``ctx.scratch``, the keyed stores its Stage names in ``stores``
(folders under paths.state shared between runs and stages, each entry named by what it derives from: the token and
window stores, search trials, registered versions exported as plain dirs), and, for the one Stage with ``registry``
set (register), the model registry. The rest of paths.state is the runner's and the doors': the hash cache, the
output locks, scratch, the open-run markers, the MLflow tracking store, Prefect's home and logs.

The Prefect tasks use the fingerprint as their cache key, and dvc.yaml declares the same deps/params/outs (code
files included), so the three front doors agree on what is fresh. ``bertpipe.graph.freshness`` computes what a stage's
fingerprint *will be* once its upstream stages are rebuilt, so staleness propagates down the graph.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib
import json
import platform
import re
import shutil
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from pydantic import BaseModel

from bertpipe.core.outputs import (  # noqa: F401 (atomic_replace_dir, read_manifest: stages import them from here)
    MANIFEST, atomic_replace_dir, atomic_write_text, check_replaceable, missing_parents, output_lock, read_manifest,
    remove_stale, sigterm_raises, written_files,
)
from bertpipe.infra.config import Config
from bertpipe.infra.diskfull import disk_full, full_line
from bertpipe.infra.errors import BertpipeError


@dataclass
class StageContext:
    """What a stage's ``build`` receives. It writes under ``out`` (a temp dir renamed into place on success) and
    ``scratch``, and besides them only into its Stage's ``stores`` under paths.state and, when its Stage says
    ``registry``, the model registry (see the module docstring)."""

    name: str
    cfg: Config
    params: Any  # the stage's own params section (a pydantic model)
    inputs: dict[str, Path | str]
    out: Path
    # Survives a crash and is keyed by fingerprint, so a rerun of the same work finds its checkpoints; removed on
    # success.
    scratch: Path
    fingerprint: str
    tracker: Any = None  # bertpipe.infra.tracking.StageRun or None
    counts: dict[str, Any] = field(default_factory=dict)
    # The upstream Stage behind an input key, for stages that read fanned-out outputs (evaluate, register): its
    # family/task/encoder/model say what the input is, so no stage parses names.
    sources: dict[str, "Stage"] = field(default_factory=dict)
    external: Any = None  # Stage.external's answer for this run

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        if self.tracker is not None:
            self.tracker.log_metrics(metrics, step=step)

    def log_child(self, name: str, params: dict, curve: dict[str, list[float]], tags: dict) -> None:
        """A finished MLflow run nested under this stage's (e.g. one search trial)."""
        if self.tracker is not None:
            self.tracker.log_child(name, params, curve, tags)

    def log_artifact(self, path: Path | str, artifact_path: str | None = None) -> None:
        """Log a file (e.g. a PNG or report) written under ``out``; it is uploaded once the stage succeeds."""
        if self.tracker is not None:
            self.tracker.defer_artifact(Path(path), artifact_path)

    def log(self, message: str) -> None:
        print(f"[{self.name}] {message}", file=sys.stderr, flush=True)


@dataclass(frozen=True)
class Deferred:
    """A function named by ``"module:function"``, its module imported when it is first called, plus keyword arguments
    it is always called with. A declare.py names its stage's ``build`` (and start's ``external``) this way, so walking
    the graph (`bertpipe stages`, dvc.yaml, a fresh stage's freshness check) never imports what builds an output:
    torch, transformers, MLflow."""

    target: str  # e.g. "bertpipe.stages.finetune.stage:build"
    kwargs: tuple[tuple[str, Any], ...] = ()

    def __call__(self, *args: Any) -> Any:
        module, _, name = self.target.partition(":")
        return getattr(importlib.import_module(module), name)(*args, **dict(self.kwargs))


def deferred(target: str, **kwargs: Any) -> Deferred:
    """``Deferred(target)`` called with ``kwargs`` too: ``deferred("bertpipe.stages.finetune.stage:build", task=t)``."""
    return Deferred(target, tuple(kwargs.items()))


@dataclass
class Stage:
    """Everything the front doors need about one stage: the CLI, the flow and dvc.yaml are generated from these."""

    name: str  # e.g. "prepare", "finetune/sentiment/adapted"
    version: str  # a knob to force a rebuild for a reason the code digest cannot see; code changes need no bump
    sections: tuple[str, ...]  # params sections it reads; sections[0] is the stage's own (see ``spec``)
    inputs: Callable[[Config], dict[str, Path | str]]
    output: Callable[[Config], Path]
    build: Callable[[StageContext], dict | None]  # a declare.py gives a Deferred: imported only when it runs
    params_section: str | None = None  # defaults to sections[0]
    code: tuple[str, ...] = ()  # packages under bertpipe/ whose code (and what it imports) builds the output
    libs: tuple[str, ...] = ()  # distributions whose installed versions are fingerprinted
    cli: tuple[str, ...] = ()  # the `bertpipe` arguments that run it (default: its name)
    # Runs it in one process: run_stage, or for base/pretrain bertpipe.stages.pretrain.run.run (works in every torchrun
    # rank).
    launcher: Callable[..., "StageResult | None"] | None = None
    # Structured identity of the fanned-out stages, so no door parses names: finetune (task, encoder), distill
    # (task), export (model = the export key, task = its task or None for the encoder).
    family: str = ""
    task: str | None = None
    encoder: str | None = None
    model: str | None = None
    # For stages that read fanned-out outputs: {input key: the upstream Stage} (see StageContext.sources). A stage
    # declares the families it reads that way (``sources_from``); the graph fills ``sources`` from its inputs.
    sources: Callable[[Config], dict[str, "Stage"]] | None = None
    sources_from: tuple[str, ...] = ()
    # What the output also depends on that no file holds (the start stage: the registry's champion). Asked by
    # run_stage on every run, never by the graph (inputs/output stay functions of config and files); a fresh
    # output whose recorded answer (manifest "external") differs is rebuilt. Doors never cache such a stage.
    external: Callable[[Config], Any] | None = None
    # Keys of the external answer (a dict) that are memos of how it was reached, not part of it (the start stage's
    # registry digest): when only they differ the output stands and its manifest records the new answer.
    external_memo: tuple[str, ...] = ()
    # Does no work worth a core (the start stage: a registry lookup). The flow does not count it when it decides
    # which stages share the cores: a stage that may only ever run beside light ones (base, beside the start
    # decision) gets every core.
    light: bool = False
    # The folders under paths.state whose keyed stores the build (or ``external``) writes: builds, leases or prunes,
    # e.g. ``keyedstore.FOLDER``. The stage's only writes outside ``out`` and ``scratch`` besides the registry.
    stores: tuple[str, ...] = ()
    # Whether the build writes the model registry (versions, aliases, their tags): register alone.
    registry: bool = False
    # What the output records outside its directory (register: the model versions its registry.json names, kept in
    # the tracking store), asked once the fingerprint matches: why that record is gone, or None. An output whose
    # record is gone (the store deleted, a new paths.state) is stale at every door that asks ``is_fresh``.
    lost: Callable[[Config, Path], str | None] | None = None
    # The settings the stage reads, resolved: {params key: value} (a value may be a pydantic model). None: its
    # ``sections`` as configured. A stage that reads only part of a section, or a section with per-task overrides
    # folded in, says so here (splits: each task's data definition; finetune: the task's resolved training and
    # search), so a setting it does not read cannot make it stale. See ``settings``.
    spec: Callable[[Config], dict[str, Any]] | None = None

    def __post_init__(self) -> None:
        self.family = self.family or self.name.split("/")[0]

    @property
    def command(self) -> tuple[str, ...]:
        return self.cli or (self.name,)

    def launch(self, cfg: Config, force: bool = False) -> "StageResult | None":
        return (self.launcher or run_stage)(self, cfg, force=force)

    def settings(self, cfg: Config, shown: bool = False) -> dict[str, Any]:
        """The stage's resolved spec as JSON values: what its fingerprint hashes, its manifest (``params``) and
        MLflow run record, ``params_effective/`` holds and `bertpipe config --stage` prints. ``shown``: fit to
        print or store (credentials in a tracking URI dropped)."""
        if self.spec is None:
            return {s: cfg.section_shown(s) if shown else cfg.section_dict(s) for s in self.sections}
        return {k: v.model_dump(mode="json") if isinstance(v, BaseModel) else v for k, v in self.spec(cfg).items()}

    def code_identity(self) -> dict:
        from bertpipe.core.codeid import code_identity

        return code_identity(self.code, self.libs)


@dataclass
class StageResult:
    name: str
    out: Path
    fingerprint: str
    skipped: bool
    metrics: dict[str, Any]
    run_id: str | None = None


# ---------------------------------------------------------------- hashing


def _hash_cache_path(cfg: Config) -> Path:
    return cfg.state / "hashcache.json"


class _HashCache:
    """Content hashes of big files, reused while the file's stat stamp is unchanged: a 90 MB checkpoint is hashed once.

    The stamp is (size, mtime_ns, ctime_ns, inode). mtime alone is not enough: a rewrite of the same size whose
    mtime is set back (``touch -r``, ``os.utime``, a copy tool preserving times) keeps size and mtime, but every
    write and every ``utime`` call sets ctime to the present (no call sets it to a chosen value), and replacing the
    file by a rename gives a new inode."""

    def __init__(self, path: Path):
        self.path = path
        try:
            self.data = json.loads(path.read_text())
        except (OSError, ValueError):
            self.data = {}
        self.dirty = False

    def file_hash(self, p: Path) -> str:
        st = p.stat()
        key = str(p.resolve())
        stamp = [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]
        hit = self.data.get(key)
        if hit and hit[0] == stamp:
            return hit[1]
        h = hashlib.sha256()
        with open(p, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        digest = h.hexdigest()
        self.data[key] = [stamp, digest]
        self.dirty = True
        return digest

    def save(self) -> None:
        if not self.dirty:
            return
        atomic_write_text(self.path, json.dumps(self.data))


def path_digest(p: Path | str, cache: _HashCache, name: str = "") -> str:
    """Content digest of an input: a stage output's manifest fingerprint, a file's bytes, or a directory's files."""
    if isinstance(p, str) and not Path(p).exists():
        return "id:" + p  # a hub id or other non-path reference: only its name can be hashed
    p = Path(p)
    if not p.exists():
        label = f"input '{name}': " if name else "input "
        raise BertpipeError(f"{label}{p} does not exist (run the stage that makes it first)")
    if p.is_file():
        return cache.file_hash(p)
    manifest = p / MANIFEST
    if manifest.is_file():
        try:
            return "stage:" + json.loads(manifest.read_text())["fingerprint"]
        except (ValueError, KeyError):
            pass
    h = hashlib.sha256()
    for f in sorted(x for x in p.rglob("*") if x.is_file() and not x.name.startswith(".")):
        h.update(str(f.relative_to(p)).encode())
        h.update(cache.file_hash(f).encode())
    return h.hexdigest()


def content_digest(p: Path | str, cfg: Config) -> str:
    """``path_digest`` of one path through the project's hash cache: unchanged big files are not read again."""
    cache = _HashCache(_hash_cache_path(cfg))
    digest = path_digest(p, cache)
    cache.save()
    return digest


def fingerprint(stage: Stage, cfg: Config, known: Callable[[str, Path | str], str | None] | None = None,
                ) -> tuple[str, dict[str, str]]:
    """(fingerprint, input digests). ``known(name, path)`` may supply an input's digest instead of reading it
    (``bertpipe.graph.freshness``: an upstream stage's output as it will be once rebuilt)."""
    cache = _HashCache(_hash_cache_path(cfg))
    inputs = stage.inputs(cfg)
    digests = {}
    for name, p in sorted(inputs.items()):
        d = known(name, p) if known is not None else None
        digests[name] = d if d is not None else path_digest(p, cache, name)
    cache.save()
    blob = json.dumps(
        {
            "stage": stage.name,
            "version": stage.version,
            "code": stage.code_identity()["digest"],
            "inputs": digests,
            "params": stage.settings(cfg),
        },
        sort_keys=True,
        ensure_ascii=False,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:32], digests


def is_fresh(stage: Stage, cfg: Config) -> tuple[bool, str]:
    fp, _ = fingerprint(stage, cfg)
    m = read_manifest(stage.output(cfg))
    return (m is not None and m.get("fingerprint") == fp and lost_record(stage, cfg) is None), fp


def lost_record(stage: Stage, cfg: Config) -> str | None:
    """Why what ``stage``'s output records outside its directory is gone (``Stage.lost``), or None."""
    if stage.lost is None:
        return None
    why = stage.lost(cfg, stage.output(cfg))
    if why and (stage.name, why) not in _SAID_LOST:
        _SAID_LOST.add((stage.name, why))
        print(f"[{stage.name}] its output is stale: {why}", file=sys.stderr, flush=True)
    return why


_SAID_LOST: set[tuple[str, str]] = set()


def library_versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": platform.python_version()}
    for pkg in ("bertpipe", "torch", "transformers", "tokenizers", "datasets", "mlflow", "jieba", "datasketch"):
        try:
            out[pkg] = version(pkg)
        except PackageNotFoundError:
            pass
    return out


@functools.lru_cache(maxsize=1)
def environment() -> dict:
    """The resolved environment a stage ran in: how many distributions are installed and a digest of every one's
    normalised name and version (what `uv pip freeze` lists; scripts/setup.sh installs them from requirements.lock),
    so two runs tell at once whether they ran with the same libraries."""
    from importlib.metadata import distributions

    pins = sorted({f"{re.sub(r'[-_.]+', '-', d.metadata['Name']).lower()}=={d.version}"
                   for d in distributions() if d.metadata["Name"]})
    return {"distributions": len(pins), "digest": hashlib.sha256("\n".join(pins).encode()).hexdigest()[:32]}


def _json_default(o: Any) -> Any:
    if isinstance(o, Path):
        return str(o)
    if hasattr(o, "item"):
        return o.item()
    return str(o)


def _json_text(obj: Any) -> str:
    return json.dumps(obj, indent=2, ensure_ascii=False, default=_json_default) + "\n"


def write_json(path: Path, obj: Any) -> None:
    Path(path).write_text(_json_text(obj), encoding="utf-8")


def scratch_dir(stage: Stage, cfg: Config, fp: str) -> Path:
    """Where a stage keeps what must survive a crash (checkpoints), keyed by fingerprint so a rerun resumes."""
    return cfg.state / "scratch" / f"{stage.name.replace('/', '__')}-{fp[:16]}"


def NO_TRACKING(stage: Stage, cfg: Config, fp: str) -> contextlib.AbstractContextManager[None]:  # noqa: N802
    """The tracker factory of a run that logs nowhere (``tracking.uri: none``, ``python -m bertpipe.doors.cli.torchrun
    --no-tracking``): the stage's ``ctx.tracker`` is None."""
    return contextlib.nullcontext()


def run_stage(stage: Stage, cfg: Config, force: bool = False, tracker_factory: Callable | None = None) -> StageResult:
    """Run ``stage`` unless its output is already fresh. ``tracker_factory(stage, cfg, fp)`` opens an MLflow run
    (default: ``bertpipe.infra.tracking.stage_run``, or NO_TRACKING when tracking is off)."""
    out = stage.output(cfg)
    if tracker_factory is None:
        from bertpipe.infra.tracking import close_orphans, tracking_off

        if tracking_off(cfg):  # tracking.uri: none
            tracker_factory = NO_TRACKING
        else:
            close_orphans(cfg)  # runs a SIGKILL left RUNNING are closed even when this stage turns out fresh
    fp, digests = fingerprint(stage, cfg)
    external = stage.external(cfg) if stage.external is not None else None

    def answer(e: Any) -> Any:
        return {k: v for k, v in e.items() if k not in stage.external_memo} if isinstance(e, dict) else e

    def current(m: dict | None) -> bool:
        return (not force and m is not None and m.get("fingerprint") == fp
                and (stage.external is None or answer(m.get("external")) == answer(external))
                and lost_record(stage, cfg) is None)

    m = read_manifest(out)
    if current(m):
        if m.get("external", external) != external:  # same answer, new memo: record it, rebuild nothing
            with output_lock(out, cfg.state / "locks"):
                m = read_manifest(out)
                if current(m) and m.get("external") != external:
                    atomic_write_text(out / MANIFEST, _json_text({**m, "external": external}))
        print(f"[{stage.name}] up to date (fingerprint {fp[:12]}), skipping", file=sys.stderr, flush=True)
        return StageResult(stage.name, out, fp, True, m.get("metrics", {}), m.get("mlflow_run_id"))

    with output_lock(out, cfg.state / "locks"), sigterm_raises():
        remove_stale(out, log=lambda msg: print(f"[{stage.name}] {msg}", file=sys.stderr, flush=True))
        m = read_manifest(out)  # another process may have built it while we waited (or it was just restored)
        if current(m):
            print(f"[{stage.name}] up to date (fingerprint {fp[:12]}), skipping", file=sys.stderr)
            return StageResult(stage.name, out, fp, True, m.get("metrics", {}), m.get("mlflow_run_id"))
        check_replaceable(out)  # before the work, not after it
        scratch = scratch_dir(stage, cfg, fp)
        if tracker_factory is None:
            from bertpipe.infra.tracking import stage_run as tracker_factory  # noqa: N806 (lazy: mlflow is slow to import)
        manifest, metrics = _build_into(stage, cfg, out, fp, digests, external, scratch, tracker_factory)
        shutil.rmtree(scratch, ignore_errors=True)
    print(f"[{stage.name}] done in {manifest['duration_s']:.1f}s -> {out}", file=sys.stderr, flush=True)
    return StageResult(stage.name, out, fp, False, metrics, manifest["mlflow_run_id"])


def _build_into(stage: Stage, cfg: Config, out: Path, fp: str, digests: dict[str, str], external: Any,
                scratch: Path, tracker_factory: Callable) -> tuple[dict, dict]:
    """(manifest, metrics) of one build of ``stage`` into a temp dir beside ``out``, renamed into place once its
    manifest is written; a failed build leaves neither the temp dir nor the work/ dirs it created."""
    tmp = out.parent / f".{out.name}.tmp-{uuid.uuid4().hex[:8]}"
    made = missing_parents(out, cfg.root)
    started = time.time()
    try:
        tmp.mkdir(parents=True)
        with tracker_factory(stage, cfg, fp) as tracker:
            ctx = StageContext(stage.name, cfg, cfg.section(stage.params_section or stage.sections[0]),
                               stage.inputs(cfg), tmp, scratch, fp, tracker,
                               sources=stage.sources(cfg) if stage.sources else {}, external=external)
            print(f"[{stage.name}] building (fingerprint {fp[:12]})", file=sys.stderr, flush=True)
            metrics = stage.build(ctx) or {}
            manifest = _manifest(stage, cfg, ctx, digests, metrics, started, tracker, external)
            write_json(tmp / MANIFEST, manifest)
            if tracker is not None:
                tracker.finish(metrics, manifest, tmp, out)
            atomic_replace_dir(tmp, out)
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        for d in made:  # the work/ dirs this failed build created, so nothing new is left behind
            with contextlib.suppress(OSError):
                d.rmdir()
        if isinstance(e, Exception) and disk_full(e):
            # pyarrow, torch, SQLite and safetensors report a full disk in their own words, mostly without a
            # file name: the directory named is the one whose filesystem is full (work/ or paths.state)
            raise BertpipeError(full_line([out.parent, cfg.state], f"building {stage.name}", e)) from None
        raise
    return manifest, metrics


def _manifest(stage: Stage, cfg: Config, ctx: StageContext, digests: dict[str, str], metrics: dict, started: float,
              tracker: Any, external: Any) -> dict:
    """manifest.json of a finished build: what it was built from (fingerprint, inputs, params, code, libraries),
    what it measured and wrote, how long it took, its MLflow run."""
    return {
        "stage": stage.name,
        "version": stage.version,
        "fingerprint": ctx.fingerprint,
        "inputs": {k: {"path": str(v), "digest": digests[k]} for k, v in ctx.inputs.items()},
        "params": stage.settings(cfg, shown=True),
        "metrics": metrics,
        "counts": ctx.counts,
        "started": started,
        "duration_s": round(time.time() - started, 3),
        "versions": library_versions(),
        "environment": environment(),
        "code": stage.code_identity(),
        "mlflow_run_id": getattr(tracker, "run_id", None),
        "files": written_files(ctx.out),
        **({"external": external} if stage.external is not None else {}),
    }
