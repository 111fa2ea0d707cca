"""A Prefect API that stops answering while a flow runs: the run's outcome follows its stages, not the API.

Task states reach the API as events, so the stages go on when the Prefect server dies; what fails is the flow's own
calls (its artifacts, its final state). ``best_effort`` makes the artifact calls skip once the API is gone;
``outcome`` decides a run whose flow call raised because the API was gone: every stage it was to run finished
(fresh on disk) -> the results, and the caller says the Prefect server was lost; otherwise one error line naming
the stages that did not finish (or the stage's own error, when one failed).
"""

from __future__ import annotations

import contextlib
import logging
import os
import traceback
from typing import Any, Callable

from bertpipe.infra.errors import BertpipeError

_lost: list[str] = []  # why the API was found gone in this process (the first time)


def api_lost(e: BaseException) -> str | None:
    """How the Prefect API failed, when ``e`` (or what caused it) is Prefect's client not reaching its API (a
    connection error raised through Prefect's code: a stage's own network error is not one); else None."""
    seen: set[int] = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        mod, name = type(e).__module__ or "", type(e).__name__
        transport = mod.startswith(("httpx", "httpcore")) and "Error" in name and "Status" not in name
        unreached = isinstance(e, RuntimeError) and str(e).startswith("Failed to reach API")
        if (transport or unreached) and _through_prefect(e):
            return f"{name}: {str(e)[:200]}"
        e = e.__cause__ or e.__context__
    return None


def _through_prefect(e: BaseException) -> bool:
    return any(f"{os.sep}prefect{os.sep}" in frame.f_code.co_filename
               for frame, _ in traceback.walk_tb(e.__traceback__))


def lost() -> str | None:
    return _lost[0] if _lost else None


def refused() -> str | None:
    """Why nothing listens where the configured Prefect API should be (a connection refused), else None. One
    request, no retries: Prefect's client retries a refused connection with backoff for about a minute per call,
    which is right for a server restarting under load and wrong for one that is gone. A slow answer is not refusal.
    No configured URL (Prefect's temporary server, started and stopped with the flow): None."""
    from prefect.settings import PREFECT_API_URL

    url = PREFECT_API_URL.value()
    if not url:
        return None
    import httpx

    try:
        httpx.get(f"{url.rstrip('/')}/health", timeout=5.0)
    except httpx.ConnectError as e:
        return f"{type(e).__name__}: {str(e)[:200]}"
    except httpx.HTTPError:
        return None
    return None


def best_effort(call: Callable[..., Any], *args, **kwargs) -> Any:
    """``call`` (a flow's call of the Prefect API); once the API is found gone (its call failed, or its server
    refuses connections: ``refused``), nothing more is asked of it."""
    if _lost:
        return None
    why = refused()
    if why is not None:
        gone(why)
        return None
    try:
        return call(*args, **kwargs)
    except Exception as e:  # noqa: BLE001 (only the API being gone is swallowed; the rest is re-raised)
        why = api_lost(e)
        if why is None:
            raise
        gone(why)
        return None


def gone(why: str, say: bool = True) -> None:
    """The API was found gone: say so once, and let each later Prefect call of this process (the flow's final
    state, the log worker's last batches) try once instead of retrying for a minute each."""
    if _lost:
        return
    _lost.append(why)
    if say:
        print(f"warning: the Prefect API stopped answering ({why}); the stages go on without it", flush=True)
    os.environ["PREFECT_CLIENT_MAX_RETRIES"] = "0"
    with contextlib.suppress(Exception):  # Prefect reads its settings from a context, refreshed from the env here
        from prefect.context import refresh_global_settings_context

        refresh_global_settings_context()


def quiet_engine_tracebacks() -> None:
    """Prefect's engine logs the lost API with a traceback when it cannot record the flow's state, and a stage's
    user error (BertpipeError) with one when the flow fails with it; those records keep their one line (the outcome
    line follows from the stages; a user error is its own one line)."""
    for name in ("prefect.flow_runs", "prefect.task_runs", "prefect.flow_engine", "prefect.task_engine"):
        logging.getLogger(name).addFilter(_no_engine_traceback)


def _no_engine_traceback(record: logging.LogRecord) -> bool:
    e = record.exc_info[1] if record.exc_info else None
    if e is not None and (isinstance(e, BertpipeError) or api_lost(e) is not None):
        record.exc_info, record.exc_text = None, None
    return True


def outcome(cfg, until: str | None, started: float, error: BaseException) -> dict[str, dict]:
    """The results of a run whose flow call raised ``error`` because the Prefect API was gone (see module doc)."""
    from bertpipe.core.stage import read_manifest
    from bertpipe.graph.freshness import plan
    from bertpipe.graph.pipeline import all_stages, until_targets, upstream
    from bertpipe_prefect.tasks.parallel import select

    stages = all_stages(cfg)
    graph = select({n: upstream(n, cfg, stages) for n in stages}, until_targets(list(stages), until))
    states = plan(cfg, stages, only=list(graph))
    unfinished = [n for n in graph if not states[n].fresh]
    why = api_lost(error) or lost() or str(error)
    if unfinished:
        cause = _user_error(error)
        if cause is not None:
            raise cause
        more = f" (+{len(unfinished) - 6} more)" if len(unfinished) > 6 else ""
        raise BertpipeError(f"the Prefect API stopped answering during the run ({why}); "
                            f"{len(unfinished)} stage(s) did not finish: {', '.join(unfinished[:6])}{more}; rerun "
                            "when the Prefect server answers (finished stages are kept)")
    results = {}
    for name, st in stages.items():
        if name not in graph:
            results[name] = {"stage": name, "out": str(st.output(cfg)), "status": "skipped"}
            continue
        m = read_manifest(st.output(cfg)) or {}
        results[name] = {"stage": name, "out": str(st.output(cfg)), "fingerprint": states[name].fingerprint,
                         "status": "built" if m.get("started", 0) >= started else "cached",
                         "metrics": m.get("metrics") or {}, "mlflow_run_id": m.get("mlflow_run_id")}
    return results


def _user_error(e: BaseException | None) -> BertpipeError | None:
    seen: set[int] = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, BertpipeError):
            return e
        e = e.__cause__ or e.__context__
    return None
