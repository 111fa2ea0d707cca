"""A flow run cancelled through the Prefect API (the UI's Cancel, `prefect flow-run cancel`) while `bertpipe run` runs
it in its own process.

Prefect stops a cancelled flow run only where a worker or runner started it; `bertpipe run` calls the flow itself, so
the flow watches its own state. Once it reads Cancelling (or Cancelled): the running stage processes are stopped (each
removes its temp dir and ends its MLflow run KILLED), no stage starts any more (``tasks.stages.terminate_children``),
and the flow, once its stage tasks are done, ends its MLflow run KILLED and its flow run Cancelled. On a Dask cluster
the stages already running there finish.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Iterator

from prefect.runtime import flow_run

from bertpipe_prefect.tasks.stages import terminate_children

from .lost_api import best_effort, lost


class FlowCancelled(KeyboardInterrupt):
    """Raised in the flow once its stage tasks are done: an interruption, so its MLflow run ends KILLED."""


@contextlib.contextmanager
def watching(every_s: float = 2.0) -> Iterator[threading.Event]:
    """Watch this flow run's state every ``every_s`` seconds; the event is set once it was cancelled."""
    run_id, cancelled, done = flow_run.id, threading.Event(), threading.Event()

    def watch() -> None:
        from prefect import get_client

        with get_client(sync_client=True) as client:
            while not done.wait(every_s) and lost() is None:  # a lost API: nothing to watch (lost_api)
                try:
                    run = best_effort(client.read_flow_run, run_id)
                except Exception:  # noqa: BLE001 - an error answer of a live API: asked again next time
                    continue
                state = run.state if run is not None else None
                if state is not None and (state.is_cancelling() or state.is_cancelled()):
                    cancelled.set()
                    n = terminate_children()
                    print(f"cancelled through the Prefect API: stopped {n} running stage process(es); no stage "
                          "starts")
                    return

    if run_id is not None:
        threading.Thread(target=watch, name="bertpipe-cancel-watch", daemon=True).start()
    try:
        yield cancelled
    finally:
        done.set()
