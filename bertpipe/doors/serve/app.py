"""`bertpipe models serve`: a LitServe service for one registered model that follows its registry alias.

Why LitServe (docs/serving.md has the measurements): dynamic batching (max batch size / max wait) and a separate
inference worker process come with it; it is a FastAPI app, so the guard is ordinary ASGI middleware.

What bertpipe adds around it:
- ``bertpipe.doors.serve.guard.Guard`` (API-server process): every body is read under a timeout and decoded once by the
  typed request models of ``bertpipe.doors.serve.schema`` before it is admitted; bad ones get a 4xx and a one-line
  reason, overload 503 + Retry-After, and while draining (SIGTERM/SIGINT) or while the inference worker restarts, 503.
- ``RegistryModelAPI`` (inference worker): loads the version the alias points at, checks the alias every ``poll_s``
  in a background thread and swaps in a new version under the same lock the batches run under, so no request is
  dropped or answered by a half-loaded model; every response names the version that produced it, and a state file
  lets ``/health`` and ``/info`` report it. A version that fails to load leaves the last good one serving and is
  reported in ``/health`` (``degraded``, ``load_error``) until a later load succeeds. A request the model fails on
  fails alone (its batch is re-run item by item), never its neighbours.
- A supervisor thread (main process) tells the Guard whether a live, ready worker exists; LitServe's
  ``restart_workers`` starts a new one when it dies.
- ``/metrics``: Prometheus (``bertpipe.doors.serve.metrics``); ``/openapi.json``, ``/docs``, ``/redoc``: a document true
  to every answer, pages that work offline (``bertpipe.doors.serve.contract``); a deadline for each request head
  (``bertpipe.doors.serve.conn``).

No ``from __future__ import annotations`` here: LitServe hands the annotations of ``decode_request`` and
``encode_response`` to FastAPI as types, and strings would not resolve there.
"""

import ipaddress
import json
import logging
import os
import signal
import threading
import time
from pathlib import Path

import litserve as ls

from bertpipe.doors.serve import contract
from bertpipe.doors.serve import metrics as M
from bertpipe.doors.serve.conn import head_timeout_protocol
from bertpipe.doors.serve.predictor import ModelRef, Served, input_kind, resolve_version
from bertpipe.doors.serve.schema import PredictResponse, QARequest, TextRequest
from bertpipe.lib.inference.serve_params import ServeParams

log_ = logging.getLogger(__name__)
RETRY_MAX_S = 300.0  # the longest wait before a version that failed to load is tried again


class RegistryModelAPI(ls.LitAPI):
    def __init__(self, ref: ModelRef, config: tuple, sp: ServeParams, state_file: Path):
        super().__init__(max_batch_size=sp.max_batch_size, batch_timeout=sp.batch_wait_ms / 1000.0)
        # (params path, profile, overrides): the worker is a spawned process and loads the config itself
        self.ref, self.config, self.sp, self.state_file = ref, config, sp, Path(state_file)

    # ------------------------------------------------------------ worker process
    def setup(self, device) -> None:
        from bertpipe.graph.pipeline import load_config
        from bertpipe.infra.tracking import client

        if self.sp.num_threads:
            import torch

            torch.set_num_threads(self.sp.num_threads)
        self.device = str(device)
        self.cfg = load_config(*self.config)
        self.client = client(self.cfg)
        self.lock = threading.Lock()
        self.model = None
        self.model = self._load(resolve_version(self.client, self.ref))
        if self.ref.alias:  # a pinned version never moves
            threading.Thread(target=self._follow, name="follow-alias", daemon=True).start()

    def _load(self, version: str, load_error: dict | None = None) -> Served:
        model = Served(self.cfg, self.ref.name, version, self.sp.backend, self.sp.max_batch_size, self.device)
        self._state(model, load_error)
        M.serving(self.ref.name, model.version, self.model.version if self.model else None)
        return model

    def _state(self, model: Served, load_error: dict | None) -> None:
        state = {"model": self.ref.name, "alias": self.ref.alias, "version": model.version, "task": model.task,
                 "backend": self.sp.backend, "device": self.device, "worker_pid": os.getpid(),
                 "loaded_at": self.loaded_at if load_error else time.time()}
        self.loaded_at = state["loaded_at"]
        if load_error:
            state["load_error"] = load_error
        _write_state(self.state_file, state)

    def _follow(self) -> None:
        """Swap in the version the alias points at. A version that fails to load is logged and reported in
        /health (``load_error``) while the last good one keeps serving; it is tried again after a back-off
        (doubling up to ``RETRY_MAX_S``), and a later move of the alias is followed as usual."""
        failed, tries, retry_at = None, 0, 0.0
        while True:
            time.sleep(self.sp.poll_s)
            try:
                version = resolve_version(self.client, self.ref)
            except Exception:  # noqa: BLE001 (registry briefly unreachable or alias removed: keep serving)
                continue
            if version == self.model.version or (version == failed and time.monotonic() < retry_at):
                continue
            try:
                with self.lock:  # loading while a batch runs breaks transformers' meta-device init
                    self.model = self._load(version)
                failed, tries = None, 0
            except Exception as e:  # noqa: BLE001 (any failure of a version's files: the service goes on)
                tries = tries + 1 if version == failed else 1
                failed, wait = version, min(RETRY_MAX_S, self.sp.poll_s * 2 ** tries)
                retry_at = time.monotonic() + wait
                why = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}".rstrip(": ")
                log_.error("%s@%s -> v%s failed to load (%s); still serving v%s, retrying in %.0f s",
                           self.ref.name, self.ref.alias, version, why, self.model.version, wait)
                self._state(self.model, {"version": version, "error": why, "at": time.time()})

    def decode_request(self, request: TextRequest):  # the annotation is what FastAPI validates and documents
        return request  # decoded by the Guard (the same type) before it was queued

    def batch(self, inputs: list) -> list:
        return list(inputs)

    def predict(self, reqs):
        single = not isinstance(reqs, list)
        reqs = [reqs] if single else reqs
        groups = [r.records() for r in reqs]
        with self.lock:
            model = self.model
            outs = predict_isolated(model.predict, groups)
        M.observe_batch(sum(len(g) for g in groups))
        res = [respond(model.name, model.version, r, o) for r, o in zip(reqs, outs)]
        return res[0] if single else res

    def unbatch(self, output: list) -> list:
        return list(output)

    def encode_response(self, output: dict) -> PredictResponse:
        return output


class QAModelAPI(RegistryModelAPI):
    def decode_request(self, request: QARequest):
        return request


def predict_isolated(predict, groups: list[list[dict]]) -> list:
    """One model call for every request's records; if it raises, each request alone, so that a request the model
    cannot handle fails by itself (its entry is the exception) and the rest of the batch is still answered."""
    try:
        flat = predict([x for g in groups for x in g])
        out, i = [], 0
        for g in groups:
            out.append(flat[i : i + len(g)])
            i += len(g)
        return out
    except Exception:  # noqa: BLE001 (which request broke it is found below)
        if len(groups) == 1:
            log_.exception("prediction failed")
            return [RuntimeError("prediction failed")]
    out = []
    for g in groups:
        try:
            out.append(predict(g))
        except Exception as e:  # noqa: BLE001
            log_.exception("prediction failed for one request of a batch")
            out.append(e)
    return out


def respond(name: str, version: str, req, preds) -> dict:
    if isinstance(preds, Exception):
        return {"error": f"the model failed on this request ({type(preds).__name__})", "status": 500}
    if req.many:
        return {"model": name, "version": version, "predictions": preds}
    return {"model": name, "version": version, **preds[0]}


def _write_state(path: Path, state: dict) -> None:
    from bertpipe.core.outputs import atomic_write_text

    atomic_write_text(path, json.dumps(state))


def exposure_warning(host: str) -> str | None:
    """A warning line when ``host`` is reachable from other machines (the service has no authentication)."""
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if loopback:
        return None
    return (f"warning: --host {host}: the service has no authentication and anyone who can reach this machine on "
            "the network can use it; bind 127.0.0.1 and put an authenticating proxy in front to expose it")


LISTEN_HOSTS = ("127.0.0.1", "0.0.0.0", "::")  # the addresses LitServe's run() accepts


def listen_host(host: str) -> str:
    """The address to give LitServe: ``localhost`` is 127.0.0.1; an address LitServe does not take is a one-line
    error here, before any model is loaded (LitServe raises ValueError only once everything is loaded)."""
    from bertpipe.infra.errors import BertpipeError

    if host == "localhost":
        return "127.0.0.1"
    if host not in LISTEN_HOSTS:
        raise BertpipeError(f"--host {host}: the service listens on 127.0.0.1 (this machine only), or on every "
                            "interface with 0.0.0.0 (IPv4) or :: (IPv6); one interface of several cannot be chosen")
    return host


def check_port(host: str, port: int) -> None:
    """A one-line error when ``host:port`` cannot be bound (another service, or an earlier one still running),
    before any model is loaded. Bound as uvicorn binds it (SO_REUSEADDR), so a port in TIME_WAIT is free."""
    import socket

    from bertpipe.infra.errors import BertpipeError

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            raise BertpipeError(f"--port {port}: cannot listen on {host}:{port} ({e.strerror}); another process "
                                "holds it (stop it, or choose another --port / serve.port)") from None


def supervise(server, shared, stop: threading.Event, every_s: float = 0.1) -> None:
    """Tell the Guard whether a live, ready inference worker exists; count worker deaths (LitServe restarts them)."""
    from litserve.utils import WorkerSetupStatus

    known: set[int] = set()  # the workers alive at the last look
    while not stop.is_set():
        procs = list(getattr(server, "inference_workers", None) or [])
        status = getattr(server, "workers_setup_status", None)
        try:
            ready = bool(status) and all(v == WorkerSetupStatus.READY for v in status.values())
        except Exception:  # noqa: BLE001 (the manager is gone: shutting down)
            ready = False
        living = {p.pid for p in procs if p.is_alive()}
        # A death is a worker alive at the last look and not now, whether it is still listed dead or LitServe's
        # monitor (every 2 s, at any phase) already put a new process in its place between two of these looks.
        died = len(known - living)
        if died:
            with shared.worker_gen.get_lock():
                shared.worker_gen.value += died
        known = living
        shared.worker_up.value = 1 if (procs and len(living) == len(procs) and ready) else 0
        stop.wait(every_s)


def serve(ref: ModelRef, config: tuple, sp: ServeParams, state_dir: Path, task: str = "", log=print) -> None:
    """Run the service until SIGTERM/SIGINT; then stop admitting, let in-flight requests finish, exit."""
    metrics_dir = M.enable()  # before anything below imports prometheus_client
    from fastapi.responses import JSONResponse, Response

    from bertpipe.doors.serve.guard import Guard, Shared

    state_file = Path(state_dir) / f"serve-{sp.port}.json"
    state_file.unlink(missing_ok=True)
    shared = Shared()

    def served() -> dict:
        try:
            return json.loads(state_file.read_text())
        except (OSError, ValueError):
            return {}

    from bertpipe import __version__ as bertpipe_version

    info = {"name": ref.name, "ref": str(ref), "task": task, "backend": sp.backend, "bertpipe": bertpipe_version}

    def refresh_info():
        s = served()
        info.update({k: s[k] for k in ("version", "alias", "device", "loaded_at") if k in s})

    kind = input_kind(task)
    api = (QAModelAPI if kind == "qa" else RegistryModelAPI)(ref, config, sp, state_file)
    server = ls.LitServer(
        api, accelerator=sp.accelerator(), devices=1, workers_per_device=1, timeout=sp.request_timeout_s,
        healthcheck_path="/ready", fast_queue=True, restart_workers=True, model_metadata=info,
        middlewares=[(Guard, {"sp": sp, "shared": shared, "kind": kind, "refresh_info": refresh_info})],
    )

    async def health():
        s = served()
        draining = bool(shared.draining.value)
        up = bool(shared.worker_up.value)
        status = "draining" if draining else ("loading" if not (s and up) else
                                              "degraded" if s.get("load_error") else "ok")
        body = {"status": status, **s,
                "inflight": shared.inflight.value, "rejected": shared.rejected.value,
                "worker_restarts": shared.worker_gen.value}
        return JSONResponse(body, status_code=200 if s and up and not draining else 503)

    async def metrics():
        data, ctype = M.exposition()
        return Response(data, media_type=ctype)

    server.app.add_api_route("/health", health, methods=["GET"])
    server.app.add_api_route("/metrics", metrics, methods=["GET"])
    contract.install(server.app, sp)  # an OpenAPI document true to every answer; /docs and /redoc offline
    stop = threading.Event()
    threading.Thread(target=supervise, args=(server, shared, stop), name="supervise-workers", daemon=True).start()

    def drain(signum, frame):
        if shared.draining.value:
            return
        shared.draining.value = 1
        log(f"signal {signum}: draining {shared.inflight.value} in-flight request(s)")

        def wait_then_stop():
            end = time.monotonic() + sp.graceful_timeout_s
            while shared.inflight.value > 0 and time.monotonic() < end:
                time.sleep(0.05)
            stop.set()
            server._shutdown_event.set()  # LitServe's own stop signal (it then joins its workers)

        threading.Thread(target=wait_then_stop, daemon=True).start()

    signal.signal(signal.SIGTERM, drain)
    signal.signal(signal.SIGINT, drain)
    log(f"serving {ref} on http://{sp.host}:{sp.port}/predict (health: /health, metrics: /metrics, "
        f"schema: /docs)")
    try:
        server.run(host=sp.host, port=sp.port, num_api_servers=1, api_server_worker_type="process",
                   generate_client_file=False, log_level="warning", timeout_keep_alive=sp.keep_alive_s,
                   http=head_timeout_protocol(sp.head_timeout_s))
    finally:
        stop.set()
        M.disable(metrics_dir)
