"""MLflow tracking: an embedded sqlite store under paths.state by default, any server via MLFLOW_TRACKING_URI.

Everything goes through ``MlflowClient`` with explicit run ids rather than mlflow's global active-run stack, because
Prefect runs tasks in worker threads and two stages may log at the same time.
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any, Iterator

from bertpipe.infra.config import Config
from bertpipe.infra.diskfull import disk_full, drop_partial_artifacts
from bertpipe.infra.errors import BertpipeError
from bertpipe.infra.orphans import close_orphans as _close_orphans
from bertpipe.infra.orphans import mark_closed, mark_open, owner_tags
from bertpipe.infra.redact import mask_text, mask_uri

PARENT_ENV = "BERTPIPE_MLFLOW_PARENT_RUN_ID"


def quiet_env(uri: str | None = None) -> None:
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    os.environ.setdefault("DO_NOT_TRACK", "true")
    # mlflow's log_model swaps os.environ's accessors process-wide to note which API-key variables a model reads
    # (for GenAI serving). bertpipe's models read none, and a stage thread reading the environment meanwhile fails
    # the logging ("Set changed size during iteration"): the flow runs stages side by side in threads.
    os.environ.setdefault("MLFLOW_RECORD_ENV_VARS_IN_MODEL_LOGGING", "false")
    if uri and display_uri(uri) != uri:
        # MLflow prints "View run ... at: <tracking URI>/#/..." to stdout when a run ends on a server, credentials
        # and all; with a credentialed URI that link is not printed (the run summary names the masked URI).
        os.environ["MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT"] = "true"


# tracking.uri's value that turns tracking off (as Hugging Face's ``report_to="none"``)
OFF = "none"


def tracking_off(cfg: Config) -> bool:
    """Whether ``tracking.uri: none`` turned tracking off: ``run_stage`` then opens no MLflow run (and imports no
    MLflow), and ``bertpipe.lib.lineage`` reads no registry."""
    return cfg.params.tracking.uri.strip().lower() == OFF


def tracking_uri(cfg: Config) -> str:
    """The project's tracking URI (tracking.uri, else $MLFLOW_TRACKING_URI, else the embedded store), checked to be
    one MLflow can open (``check_uri``). With tracking off, one error line: the caller needs a store."""
    if tracking_off(cfg):
        raise BertpipeError(f"tracking.uri: {OFF!r} turns tracking off, and this needs an MLflow store (the model "
                            "registry, or a flow's runs); set tracking.uri to a store, or leave it empty for the "
                            "embedded one")
    if cfg.params.tracking.uri:
        return check_uri(cfg.params.tracking.uri, "tracking.uri")
    if os.environ.get("MLFLOW_TRACKING_URI"):
        return check_uri(os.environ["MLFLOW_TRACKING_URI"], "$MLFLOW_TRACKING_URI")
    cfg.state.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{(cfg.state / 'mlflow.db').resolve()}"


_DB_SCHEMES = ("postgresql", "mysql", "mssql")
EXPECTED_URI = ("expected sqlite:///PATH, http(s)://HOST[:PORT] (an MLflow server), or a postgresql://, mysql:// or "
                "mssql:// database URL whose driver is installed")


def check_uri(uri: str, key: str) -> str:
    """``uri`` when MLflow can track to it; else one error line naming ``key`` and what is expected."""
    from urllib.parse import urlsplit

    shown = display_uri(uri)
    parts = urlsplit(uri)
    scheme = parts.scheme.lower()
    base = scheme.split("+", 1)[0]
    if scheme == "sqlite":
        if not uri.startswith("sqlite:///") or len(uri) <= len("sqlite:///"):
            raise BertpipeError(f"{key}: {shown!r} names no file; expected sqlite:///RELATIVE/PATH or "
                                "sqlite:////ABSOLUTE/PATH")
        return uri
    if scheme in ("http", "https"):
        if not parts.hostname:
            raise BertpipeError(f"{key}: {shown!r} names no host; {EXPECTED_URI}")
        return uri
    if scheme in ("databricks", "databricks-uc", "uc"):
        return uri
    if base in _DB_SCHEMES:
        try:
            from sqlalchemy.engine import make_url

            make_url(uri).get_dialect().import_dbapi()
        except ImportError as e:
            raise BertpipeError(f"{key}: {shown!r} needs a database driver that is not installed "
                                f"({e.name or e}); install it (e.g. psycopg2-binary for postgresql, pymysql for "
                                "mysql) or use another store") from None
        except Exception as e:  # noqa: BLE001 (SQLAlchemy's NoSuchModuleError / ArgumentError: an unknown dialect)
            raise BertpipeError(f"{key}: {shown!r} is not a database URL SQLAlchemy knows ({type(e).__name__}); "
                                f"{EXPECTED_URI}") from None
        return uri
    raise BertpipeError(f"{key}: {shown!r} is not a tracking store bertpipe can use; {EXPECTED_URI}")


def display_uri(uri: str) -> str:
    """A tracking URI fit to print or store (credentials dropped): ``bertpipe.infra.redact.mask_uri``, the one
    masker."""
    return mask_uri(uri)


def unreachable_line(e: BaseException) -> str | None:
    """The one error line for "the tracking server did not answer" (an environment problem, not a bug), with the
    URI MLflow quotes masked; None for any other exception."""
    if "database is locked" in str(e) and type(e).__name__ in ("MlflowException", "OperationalError"):
        from bertpipe.infra.sqlite_wait import BUSY_TIMEOUT_S

        return (f"the MLflow sqlite store stayed locked by another process for over {BUSY_TIMEOUT_S} s (another "
                "bertpipe, an `mlflow ui`, a DB browser?); nothing half-written was kept, rerun when it is free")
    if type(e).__name__ != "MlflowException" or not str(e).startswith("API request to "):
        return None
    msg = mask_text(str(e))
    return f"MLflow tracking server not reachable: {msg if len(msg) <= 400 else msg[:400] + '...'}"


def artifact_root(cfg: Config) -> str:
    return (cfg.state / "mlartifacts").resolve().as_uri()


_READY: set[str] = set()


def client(cfg: Config, create: bool = True):
    """An MlflowClient on the project's tracking store. The embedded sqlite store is created on first use, whole or
    not at all (``bertpipe.infra.mlflow_store``); ``create=False`` (commands that only read the registry) refuses, with
    one error line, a sqlite store that does not exist instead of creating it."""
    uri = tracking_uri(cfg)
    quiet_env(uri)
    from bertpipe.infra.sqlite_wait import db_path

    db = db_path(uri)
    if not create and db is not None and uri not in _READY:
        from bertpipe.infra.mlflow_store import require

        require(db, "tracking.uri" if cfg.params.tracking.uri else "the project's MLflow store")
    from mlflow.tracking import MlflowClient

    if db is None:
        if uri.startswith("http"):
            from bertpipe.infra.tracking_http import bound_retries

            bound_retries(uri)
        return MlflowClient(tracking_uri=uri, registry_uri=uri)
    from bertpipe.infra.sqlite_wait import install_busy_timeout, wait_until_unlocked

    install_busy_timeout()
    wait_until_unlocked(uri)
    if uri in _READY:
        return MlflowClient(tracking_uri=uri, registry_uri=uri)
    # Opening an sqlite store creates and migrates its tables; two flow runs starting at once would race on that,
    # so this process's first open of the store happens under a file lock.
    from filelock import FileLock

    from bertpipe.infra import mlflow_store

    lock = db.with_name(db.name + ".lock")
    lock.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(lock):
        mlflow_store.ensure(db)
        if _own_store(cfg, db):
            moved = mlflow_store.relocate(db, cfg.state / mlflow_store.ARTIFACTS_DIR)
            if moved:
                print(f"[tracking] {db}: artifact locations of {', '.join(moved)} (a copied or moved project) "
                      f"now point at {cfg.state / mlflow_store.ARTIFACTS_DIR}", file=sys.stderr, flush=True)
        c = MlflowClient(tracking_uri=uri, registry_uri=uri)
        c.search_experiments(max_results=1)
        c.search_registered_models(max_results=1)
    _READY.add(uri)
    return c


def store_file(uri: str) -> Path | None:
    """The sqlite file of a ``sqlite:///`` URI (None for a server or another database)."""
    from bertpipe.infra.sqlite_wait import db_path

    return db_path(uri)


_FILES_ONLY = contextvars.ContextVar("bertpipe_tracking_files_only", default=False)


@contextlib.contextmanager
def files_only() -> Iterator[None]:
    """While active, a question that can wait for the run (whether the registry still holds what an output names)
    is not asked of a tracking server or database: only a local sqlite store is read (``server_off_limits``).
    `bertpipe stages` reports from files alone."""
    token = _FILES_ONLY.set(True)
    try:
        yield
    finally:
        _FILES_ONLY.reset(token)


def server_off_limits(uri: str) -> bool:
    """``uri`` is a server or a database over the network and ``files_only`` is active."""
    return _FILES_ONLY.get() and store_file(uri) is None


def _own_store(cfg: Config, db: Path) -> bool:
    """Whether ``db`` is this project's own store (under paths.state), whose artifacts live beside it."""
    try:
        return db.resolve().is_relative_to(cfg.state.resolve())
    except OSError:
        return False


def experiment_id(cfg: Config, c=None) -> str:
    c = c or client(cfg)
    name = cfg.params.tracking.experiment
    exp = c.get_experiment_by_name(name)
    if exp is not None:
        return exp.experiment_id
    kwargs = {}
    if tracking_uri(cfg).startswith("sqlite:"):
        # Without this the artifacts land in ./mlruns relative to whatever the cwd happens to be.
        kwargs["artifact_location"] = artifact_root(cfg)
    try:
        return c.create_experiment(name, **kwargs)
    except Exception:  # created concurrently by another process
        return c.get_experiment_by_name(name).experiment_id


def git_commit(root: Path) -> str:
    try:
        return subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def _end_status(e: BaseException) -> str:
    return "KILLED" if isinstance(e, KeyboardInterrupt) else "FAILED"  # Ctrl-C and SIGTERM (errors.Terminated)


def _param_value(v: Any) -> str:
    s = str(v)
    return s if len(s) <= 6000 else s[:5997] + "..."


def dataset_inputs(datasets: list[tuple[Path | str, str, str, str]]) -> list:
    """MLflow dataset inputs of a run, each given as (local path, name, digest, context): the data a model saw,
    with its digest, under the run's Datasets."""
    import warnings

    from mlflow.data.dataset_source_registry import resolve_dataset_source
    from mlflow.data.meta_dataset import MetaDataset
    from mlflow.entities import DatasetInput, InputTag
    from mlflow.utils.mlflow_tags import MLFLOW_DATASET_CONTEXT

    out = []
    for path, name, digest, context in datasets:
        with warnings.catch_warnings():  # MLflow's "local" source is registered twice: silence its which-one warning
            warnings.simplefilter("ignore", UserWarning)
            source = resolve_dataset_source(str(path))
        out.append(DatasetInput(MetaDataset(source, name=name, digest=digest)._to_mlflow_entity(),
                                tags=[InputTag(MLFLOW_DATASET_CONTEXT, context)]))
    return out


class StageRun:
    def __init__(self, cfg: Config, run_id: str, c):
        self.cfg = cfg
        self.run_id = run_id
        self.client = c
        self._artifacts: list[tuple[Path, str | None]] = []

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        import time

        from mlflow.entities import Metric

        ts = int(time.time() * 1000)
        batch = [
            Metric(k, float(v), ts, step or 0) for k, v in metrics.items() if isinstance(v, (int, float)) and v == v
        ]
        if batch:
            self.client.log_batch(self.run_id, metrics=batch)

    def log_params(self, params: dict[str, Any]) -> None:
        from mlflow.entities import Param

        items = [Param(k[:250], _param_value(v)) for k, v in params.items()]
        for i in range(0, len(items), 100):
            self.client.log_batch(self.run_id, params=items[i : i + 100])

    def log_datasets(self, datasets: list[tuple[Path | str, str, str, str]]) -> None:
        """The run's data inputs (``dataset_inputs``)."""
        if datasets:
            self.client.log_inputs(self.run_id, datasets=dataset_inputs(datasets))

    def set_tags(self, tags: dict[str, Any]) -> None:
        for k, v in tags.items():
            self.client.set_tag(self.run_id, k, _param_value(v))

    def defer_artifact(self, path: Path, artifact_path: str | None = None) -> None:
        self._artifacts.append((path, artifact_path))

    def log_child(self, name: str, params: dict[str, Any], curve: dict[str, list[float]], tags: dict[str, Any]
                  ) -> str:
        """A finished run nested under this one (a search trial): its params, metric curves (one value per step)
        and tags. Returns its run id."""
        from mlflow.entities import Metric, Param, RunTag

        run = self.client.create_run(self.client.get_run(self.run_id).info.experiment_id, run_name=name,
                                     tags={"mlflow.parentRunId": self.run_id, **owner_tags()})
        rid = run.info.run_id
        import time

        ts = int(time.time() * 1000)
        metrics = [Metric(k, float(v), ts, i) for k, vs in curve.items() for i, v in enumerate(vs) if v == v]
        self.client.log_batch(rid, metrics=metrics, params=[Param(k[:250], _param_value(v)) for k, v in params.items()],
                              tags=[RunTag(k, _param_value(v)) for k, v in tags.items()])
        self.client.set_terminated(rid, "FINISHED")
        return rid

    def finish(self, metrics: dict, manifest: dict, tmp: Path, out: Path) -> None:
        self.log_metrics({k: v for k, v in metrics.items() if isinstance(v, (int, float))})
        self.client.log_artifact(self.run_id, str(tmp / "manifest.json"))
        for path, apath in self._artifacts:
            if path.exists():
                if path.is_dir():
                    self.client.log_artifacts(self.run_id, str(path), apath)
                else:
                    self.client.log_artifact(self.run_id, str(path), apath)
        self.client.set_tag(self.run_id, "bertpipe.output", str(out))


def close_orphans(cfg: Config) -> list[str]:
    """``bertpipe.infra.orphans.close_orphans`` with this project's client."""
    return _close_orphans(cfg, lambda: client(cfg))


def flatten(d: dict, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """Nested params as dotted keys (``pretrain.mask.prob``), the way MLflow params are logged."""
    for k, v in d.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            yield from flatten(v, key + ".")
        else:
            yield key, v


@contextlib.contextmanager
def stage_run(stage, cfg: Config, fingerprint: str) -> Iterator[StageRun]:
    """One MLflow run per stage execution, nested under the flow's parent run when there is one."""
    c = client(cfg)
    exp = experiment_id(cfg, c)
    tags = {
        "mlflow.runName": stage.name,
        "bertpipe.stage": stage.name,
        "bertpipe.stage_version": stage.version,
        "bertpipe.fingerprint": fingerprint,
        "bertpipe.params_hash": hashlib.sha256(json.dumps(stage.settings(cfg), sort_keys=True).encode()).hexdigest(),
        "bertpipe.base_model": cfg.params.model.base,
        "bertpipe.profile": cfg.params.profile or "(none)",
        "mlflow.source.git.commit": git_commit(cfg.root),
        **owner_tags(),
    }
    close_orphans(cfg)
    parent = os.environ.get(PARENT_ENV)
    if parent:
        tags["mlflow.parentRunId"] = parent
    run = c.create_run(exp, tags=tags, run_name=stage.name)
    mark_open(cfg, run.info.run_id)
    tracker = StageRun(cfg, run.info.run_id, c)
    params = {}
    for s, value in stage.settings(cfg, shown=True).items():  # the resolved spec: what the stage trains with
        params.update(dict(flatten(value, f"{s}.")) if isinstance(value, dict) else {s: value})
    tracker.log_params(params)
    try:
        yield tracker
    except BaseException as e:
        if isinstance(e, Exception) and disk_full(e):  # partial artifacts would keep the disk full
            drop_partial_artifacts(c, run.info.run_id)
        _end_after_error(cfg, c, run.info.run_id, e, error_tag=True)
        raise
    c.set_terminated(run.info.run_id, "FINISHED")
    mark_closed(cfg, run.info.run_id)


def _end_after_error(cfg: Config, c, run_id: str, e: BaseException, error_tag: bool = False) -> None:
    """Close a run that ended with ``e``, best effort. A SIGTERM can land inside an MLflow write and leave this
    client's sqlite session unusable, so a fresh client tries once more; if that fails too, the open-run marker stays
    and the next run's ``close_orphans`` closes it. The caller re-raises ``e``: that is what the user sees. When ``e``
    is a tracking server that stopped answering, each call tries once (``tracking_http.given_up``): waiting for it
    again here would double the wait before the error line."""
    gone = unreachable_line(e) is not None
    if gone:
        from bertpipe.infra.tracking_http import given_up

        given_up()
    for attempt in range(1 if gone else 2):
        try:
            cl = c if attempt == 0 else client(cfg)
            if error_tag:
                cl.set_tag(run_id, "bertpipe.error", mask_text(f"{type(e).__name__}: {e}")[:5000])
            cl.set_terminated(run_id, _end_status(e))
            mark_closed(cfg, run_id)
            return
        except Exception:  # noqa: BLE001 (see above)
            continue


@contextlib.contextmanager
def as_parent(run_id: str) -> Iterator[None]:
    """``run_id`` as the parent of the stage runs this process and its children make meanwhile (``PARENT_ENV``);
    the previous parent, or none, after. An empty ``run_id`` changes nothing."""
    if not run_id:
        yield
        return
    previous = os.environ.get(PARENT_ENV)
    os.environ[PARENT_ENV] = run_id
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(PARENT_ENV, None)
        else:
            os.environ[PARENT_ENV] = previous


@contextlib.contextmanager
def flow_run(cfg: Config, name: str, tags: dict[str, Any] | None = None) -> Iterator[StageRun]:
    """The parent run of one flow run; stages started inside it nest under it (via an env var the stages read)."""
    c = client(cfg)
    exp = experiment_id(cfg, c)
    all_tags = {
        "mlflow.runName": name,
        "bertpipe.flow": name,
        "bertpipe.base_model": cfg.params.model.base,
        "bertpipe.profile": cfg.params.profile or "(none)",
        "mlflow.source.git.commit": git_commit(cfg.root),
        **owner_tags(),
        **(tags or {}),
    }
    close_orphans(cfg)
    run = c.create_run(exp, tags={k: str(v) for k, v in all_tags.items()}, run_name=name)
    mark_open(cfg, run.info.run_id)
    with as_parent(run.info.run_id):
        try:
            yield StageRun(cfg, run.info.run_id, c)
        except BaseException as e:
            _end_after_error(cfg, c, run.info.run_id, e)
            raise
    c.set_terminated(run.info.run_id, "FINISHED")
    mark_closed(cfg, run.info.run_id)


@contextlib.contextmanager
def fluent_mlflow(cfg: Config) -> Iterator[Any]:
    """mlflow's fluent API (needed by ``mlflow.transformers.log_model``) pointed at this project's store.
    ``mlflow.set_tracking_uri``/``set_registry_uri`` set process globals and export MLFLOW_TRACKING_URI/
    MLFLOW_REGISTRY_URI; left behind, they would point the next project used in this process (or a plain
    ``MlflowClient(tracking_uri=...)``, whose registry falls back to the global) at this project's registry. So both
    the globals and the environment are reset on exit: bertpipe never relies on mlflow's global URIs."""
    uri = tracking_uri(cfg)
    quiet_env(uri)
    import mlflow

    saved = {k: os.environ.get(k) for k in ("MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI")}
    mlflow.set_tracking_uri(uri)
    mlflow.set_registry_uri(uri)
    try:
        yield mlflow
    finally:
        mlflow.set_tracking_uri(None)
        mlflow.set_registry_uri(None)
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
