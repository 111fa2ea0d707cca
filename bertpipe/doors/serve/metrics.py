"""Prometheus metrics of the service, in prometheus_client's multiprocess mode.

Requests are counted and timed in LitServe's API-server process (the Guard), batch sizes and the served version in
the inference worker: two processes, so each writes its values to files under ``PROMETHEUS_MULTIPROC_DIR`` and
`GET /metrics` merges them (``MultiProcessCollector``). ``enable`` must run before prometheus_client is imported
in any of those processes — the API server is forked from the main process and the worker is spawned with its
environment — so this module imports prometheus_client only inside functions (``enable`` copes with an earlier
import).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from functools import lru_cache

ENV = "PROMETHEUS_MULTIPROC_DIR"
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


def enable() -> str:
    """A fresh metrics dir for this service (removed by ``disable``)."""
    import sys

    d = tempfile.mkdtemp(prefix="bertpipe-metrics-")
    os.environ[ENV] = d
    if "prometheus_client" in sys.modules:
        # imported before (Prefect imports it): its value class was chosen without the env, and values would stay in
        # this process's memory where /metrics cannot see them. Metrics read the class when they are created (ours
        # are created lazily, after this), so choosing it again is enough.
        from prometheus_client import values

        values.ValueClass = values.get_value_class()
    return d


def disable(d: str) -> None:
    shutil.rmtree(d, ignore_errors=True)


@lru_cache(maxsize=None)
def _m():
    if not os.environ.get(ENV):
        return None  # not running under `models serve` (e.g. the worker class used directly in a test)
    from prometheus_client import Counter, Gauge, Histogram

    return {
        "requests": Counter("bertpipe_requests", "Requests to /predict by HTTP status", ["status"]),
        "latency": Histogram("bertpipe_request_seconds", "Time from request start to response, /predict",
                             buckets=LATENCY_BUCKETS),
        "batch": Histogram("bertpipe_batch_size", "Examples per model call (after dynamic batching)",
                           buckets=BATCH_BUCKETS),
        "version": Gauge("bertpipe_model_version", "1 for the registered version being served", ["model", "version"],
                         multiprocess_mode="mostrecent"),
    }


def observe_request(status: int, seconds: float) -> None:
    m = _m()
    if m:
        m["requests"].labels(str(status)).inc()
        m["latency"].observe(seconds)


def observe_batch(n: int) -> None:
    m = _m()
    if m:
        m["batch"].observe(n)


def serving(model: str, version: str, previous: str | None) -> None:
    m = _m()
    if m:
        if previous and previous != version:
            m["version"].labels(model, previous).set(0)
        m["version"].labels(model, version).set(1)


def exposition() -> tuple[bytes, str]:
    from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
    from prometheus_client.multiprocess import MultiProcessCollector

    registry = CollectorRegistry()
    MultiProcessCollector(registry)
    return generate_latest(registry), CONTENT_TYPE_LATEST
