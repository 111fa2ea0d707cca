"""`bertpipe models serve`: a LitServe service for one registered model that follows its registry alias.

Why LitServe (docs/serving.md has the measurements): dynamic batching (max batch size / max wait) and a separate
inference worker process come with it; it is a FastAPI app, so the guard below is ordinary ASGI middleware.

What bertpipe adds around it:
- ``Guard`` (ASGI middleware, in the API-server thread): every request is checked before it reaches the queue —
  body size, UTF-8, a JSON object, the task's field names and types, empty/too-long text — and refused with a 4xx and a
  one-line reason; at most ``max_queue`` requests are admitted at once, beyond that 503 + ``Retry-After``; while
  draining (SIGTERM/SIGINT) new requests get 503 and in-flight ones finish.
- ``RegistryModelAPI`` (in the inference worker): loads the version the alias points at, checks the alias every
  ``poll_s`` in a background thread and swaps in a new version under the same lock the batches run under, so no
  request is dropped or answered by a half-loaded model; every response names the version that produced it, and a
  state file lets ``/health`` report it.
"""

from __future__ import annotations

import json
import signal
import threading
import time
from pathlib import Path

import litserve as ls

from bertpipe.serve.predictor import ModelRef, Served, input_kind, resolve_version
from bertpipe.serve.params import ServeParams


class RegistryModelAPI(ls.LitAPI):
    def __init__(self, ref: ModelRef, config: tuple, sp: ServeParams, state_file: Path):
        super().__init__(max_batch_size=sp.max_batch_size, batch_timeout=sp.batch_wait_ms / 1000.0)
        # (params path, profile, overrides): the worker is a spawned process and loads the config itself
        self.ref, self.config, self.sp, self.state_file = ref, config, sp, Path(state_file)

    # ------------------------------------------------------------ worker process
    def setup(self, device) -> None:
        from bertpipe.config import load_config
        from bertpipe.tracking import client

        if self.sp.num_threads:
            import torch

            torch.set_num_threads(self.sp.num_threads)
        self.cfg = load_config(*self.config)
        self.client = client(self.cfg)
        self.lock = threading.Lock()
        self.model = self._load(resolve_version(self.client, self.ref))
        if self.ref.alias:  # a pinned version never moves
            threading.Thread(target=self._follow, name="follow-alias", daemon=True).start()

    def _load(self, version: str) -> Served:
        model = Served(self.cfg, self.ref.name, version, self.sp.backend, self.sp.max_batch_size)
        _write_state(self.state_file, {"model": self.ref.name, "alias": self.ref.alias, "version": model.version,
                                       "task": model.task, "backend": self.sp.backend, "loaded_at": time.time()})
        return model

    def _follow(self) -> None:
        while True:
            time.sleep(self.sp.poll_s)
            try:
                version = resolve_version(self.client, self.ref)
            except Exception:  # registry briefly unreachable or alias removed: keep serving what we have
                continue
            if version != self.model.version:
                with self.lock:  # loading while a batch runs breaks transformers' meta-device init
                    self.model = self._load(version)

    def decode_request(self, request: dict) -> dict:
        return request  # validated by Guard before it was queued

    def batch(self, inputs: list) -> list:
        return list(inputs)

    def predict(self, rows):
        single = not isinstance(rows, list)
        rows = [rows] if single else rows
        with self.lock:
            model = self.model
            preds = model.predict(rows)
        out = [{"model": self.ref.name, "version": model.version, **p} for p in preds]
        return out[0] if single else out

    def unbatch(self, output: list) -> list:
        return list(output)

    def encode_response(self, output: dict) -> dict:
        return output


def _write_state(path: Path, state: dict) -> None:
    from bertpipe.outputs import atomic_write_text

    atomic_write_text(path, json.dumps(state))


# ---------------------------------------------------------------- API-server side


class Shared:
    """Counters shared by the API-server process (forked by LitServe) and the main process that handles signals."""

    def __init__(self):
        import multiprocessing as mp

        self.inflight = mp.Value("i", 0)
        self.rejected = mp.Value("i", 0)
        self.draining = mp.Value("b", 0)


class Guard:
    """ASGI middleware: validate, bound and drain."""

    def __init__(self, app, sp: ServeParams, kind_of, shared: Shared):
        self.app, self.sp, self.kind_of, self.shared = app, sp, kind_of, shared

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http" or scope["path"] != "/predict":
            return await self.app(scope, receive, send)
        if scope["method"] != "POST":
            return await _reply(send, 405, "use POST with a JSON body")
        sh = self.shared
        if sh.draining.value:
            return await _reply(send, 503, "shutting down", retry=self.sp.retry_after_s)
        with sh.inflight.get_lock():
            full = sh.inflight.value >= self.sp.max_queue
            if not full:
                sh.inflight.value += 1
        if full:
            with sh.rejected.get_lock():
                sh.rejected.value += 1
            return await _reply(send, 503, f"queue full ({self.sp.max_queue} requests in flight)",
                                retry=self.sp.retry_after_s)
        try:
            body, too_big = b"", False
            while True:
                msg = await receive()
                body += msg.get("body", b"")
                if len(body) > self.sp.max_body_bytes:
                    too_big = True
                    break
                if not msg.get("more_body"):
                    break
            if too_big:
                return await _reply(send, 413, f"body over {self.sp.max_body_bytes} bytes")
            problem = validate(body, self.kind_of(), self.sp.max_text_chars)
            if problem:
                return await _reply(send, *problem)
            sent = False

            async def replay():
                nonlocal sent
                if sent:
                    return await receive()
                sent = True
                return {"type": "http.request", "body": body, "more_body": False}

            # The body is JSON whatever the client's Content-Type said (curl -d sends form-urlencoded).
            headers = [(k, v) for k, v in scope["headers"] if k.lower() != b"content-type"]
            scope = {**scope, "headers": headers + [(b"content-type", b"application/json")]}
            return await self.app(scope, replay, send)
        finally:
            with sh.inflight.get_lock():
                sh.inflight.value -= 1


def validate(body: bytes, kind: str, max_chars: int) -> tuple[int, str] | None:
    """(status, one-line reason) for a bad request body, or None when it is fine."""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as e:
        return 400, f"body is not UTF-8 (byte {e.start})"
    try:
        req = json.loads(text)
    except ValueError as e:
        return 400, f"body is not JSON ({e.msg} at line {e.lineno} column {e.colno})"
    if not isinstance(req, dict):
        return 422, 'expected a JSON object such as {"text": "..."}'
    fields = ("question", "context") if kind == "qa" else ("text",)
    missing = [f for f in fields if f not in req]
    extra = sorted(set(req) - set(fields))
    if missing or extra:
        want = ", ".join(f'"{f}"' for f in fields)
        return 422, f"expected field(s) {want}" + (f"; unknown: {', '.join(extra)}" if extra else "")
    for f in fields:
        v = req[f]
        if not isinstance(v, str):
            return 422, f'"{f}" must be a string'
        if not v.strip():
            return 422, f'"{f}" is empty'
        if len(v) > max_chars:
            return 413, f'"{f}" has {len(v)} characters; the limit is {max_chars}'
    return None


async def _reply(send, status: int, reason: str, retry: int | None = None) -> None:
    body = json.dumps({"error": reason}, ensure_ascii=False).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if retry is not None:
        headers.append((b"retry-after", str(retry).encode()))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def serve(ref: ModelRef, config: tuple, sp: ServeParams, state_dir: Path, log=print) -> None:
    """Run the service until SIGTERM/SIGINT; then stop admitting, let in-flight requests finish, exit."""
    from fastapi.responses import JSONResponse

    state_file = Path(state_dir) / f"serve-{sp.port}.json"
    state_file.unlink(missing_ok=True)
    shared = Shared()

    def served() -> dict:
        try:
            return json.loads(state_file.read_text())
        except (OSError, ValueError):
            return {}

    api = RegistryModelAPI(ref, config, sp, state_file)
    server = ls.LitServer(
        api, accelerator="cpu", devices=1, workers_per_device=1, timeout=sp.request_timeout_s,
        healthcheck_path="/ready", fast_queue=True, middlewares=[(Guard, {"sp": sp, "shared": shared,
                                                         "kind_of": lambda: input_kind(served().get("task", ""))})],
    )

    async def health():
        s = served()
        draining = bool(shared.draining.value)
        body = {"status": "draining" if draining else ("ok" if s else "loading"), **s,
                "inflight": shared.inflight.value, "rejected": shared.rejected.value}
        return JSONResponse(body, status_code=200 if s and not draining else 503)

    server.app.add_api_route("/health", health, methods=["GET"])

    def drain(signum, frame):
        if shared.draining.value:
            return
        shared.draining.value = 1
        log(f"signal {signum}: draining {shared.inflight.value} in-flight request(s)")

        def wait_then_stop():
            end = time.monotonic() + sp.graceful_timeout_s
            while shared.inflight.value > 0 and time.monotonic() < end:
                time.sleep(0.05)
            server._shutdown_event.set()  # LitServe's own stop signal (it then joins its workers)

        threading.Thread(target=wait_then_stop, daemon=True).start()

    signal.signal(signal.SIGTERM, drain)
    signal.signal(signal.SIGINT, drain)
    log(f"serving {ref} on http://{sp.host}:{sp.port}/predict (health: /health)")
    server.run(host=sp.host, port=sp.port, num_api_servers=1, api_server_worker_type="process",
               generate_client_file=False, log_level="warning")
