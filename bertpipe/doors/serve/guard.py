"""``Guard``: the ASGI middleware in front of `/predict` (runs in LitServe's API-server process).

Order matters, and each step is why a past failure cannot recur:
1. draining or no live inference worker -> 503 + Retry-After (a killed worker is restarted by LitServe's
   ``restart_workers``; until the new one is ready nothing is queued for it);
2. the body is read under ``serve.body_timeout_s`` for the whole body and ``serve.max_body_bytes`` -> 408 / 413.
   A request is NOT counted in flight while its body trickles in: 256 connections sending headers and one byte used
   to fill ``max_queue`` and turn every real request into 503;
3. the body is decoded once by ``bertpipe.doors.serve.schema.decode`` (the same pydantic types FastAPI and the worker
   see) -> 400 / 413 / 422 with a one-line reason;
4. only then is it admitted (at most ``max_queue`` at once, else 503) and passed on; if the inference worker dies
   while the request waits, it is answered 503 instead of hanging until the request timeout;
5. a response the worker marked as a per-item failure (``{"error": ..., "status": N}``) gets that status, so one
   request that breaks the model fails alone, not its whole batch.
"""

from __future__ import annotations

import asyncio
import json
import time

from bertpipe.doors.serve import metrics as M
from bertpipe.doors.serve.schema import decode
from bertpipe.lib.inference.serve_params import ServeParams


class Shared:
    """Counters shared by the API-server process (forked by LitServe) and the main process (signals, supervisor)."""

    def __init__(self):
        import multiprocessing as mp

        self.inflight = mp.Value("i", 0)
        self.rejected = mp.Value("i", 0)
        self.draining = mp.Value("b", 0)
        self.worker_up = mp.Value("b", 0)  # set by the supervisor thread in the main process
        self.worker_gen = mp.Value("i", 0)  # +1 each time an inference worker is found dead


class Guard:
    def __init__(self, app, sp: ServeParams, kind: str, shared: Shared, refresh_info=None):
        self.app, self.sp, self.kind, self.shared, self.refresh_info = app, sp, kind, shared, refresh_info
        self._waiting: dict = {}  # request task -> {"responded", "killed"} while it waits for the worker
        self._watcher = None

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and scope["path"] == "/info" and self.refresh_info:
            self.refresh_info()  # LitServe's /info shows the version being served now, not the one at start
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        if scope["path"] != "/predict":
            return await self.app(scope, receive, _typed(send))
        t0 = time.perf_counter()
        status = await self._predict(scope, receive, send)
        M.observe_request(status, time.perf_counter() - t0)

    async def _predict(self, scope, receive, send) -> int:
        sp, sh = self.sp, self.shared
        if scope["method"] != "POST":
            return await _reply(send, 405, "use POST with a JSON body", extra=[(b"allow", b"POST")])
        if sh.draining.value:
            return await _reply(send, 503, "shutting down", retry=sp.retry_after_s)
        if not sh.worker_up.value:
            return await _reply(send, 503, "the model worker is (re)starting", retry=sp.retry_after_s)
        body, problem = await _read_body(receive, sp.max_body_bytes, sp.body_timeout_s)
        if problem:
            return await _reply(send, *problem)
        req = decode(body, self.kind, sp.max_text_chars, sp.max_items)
        if isinstance(req, tuple):
            return await _reply(send, *req)
        with sh.inflight.get_lock():
            full = sh.inflight.value >= sp.max_queue
            if not full:
                sh.inflight.value += 1
        if full:
            with sh.rejected.get_lock():
                sh.rejected.value += 1
            return await _reply(send, 503, f"queue full ({sp.max_queue} requests in flight)", retry=sp.retry_after_s)
        try:
            return await self._pass_on(scope, body, receive, send)
        finally:
            with sh.inflight.get_lock():
                sh.inflight.value -= 1

    async def _pass_on(self, scope, body: bytes, receive, send) -> int:
        sent, status = False, [0]
        started = None
        me = asyncio.current_task()
        state = {"responded": False, "killed": False}

        async def replay():
            nonlocal sent
            if sent:
                return await receive()
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}

        async def send_marked(msg):
            # Hold the start line until the body shows whether the worker marked this item as failed.
            nonlocal started
            if msg["type"] == "http.response.start":
                started = dict(msg)
                return
            if started is not None:
                head, started = started, None
                if head["status"] == 200 and msg.get("body", b"").startswith(b'{"error"'):
                    try:
                        head["status"] = int(json.loads(msg["body"]).get("status", 500))
                    except ValueError:
                        head["status"] = 500
                status[0], state["responded"] = head["status"], True
                await send(head)
            await send(msg)

        # The body is JSON whatever the client's Content-Type said (curl -d sends form-urlencoded).
        headers = [(k, v) for k, v in scope["headers"] if k.lower() != b"content-type"]
        scope = {**scope, "headers": headers + [(b"content-type", b"application/json")]}
        self._waiting[me] = state
        self._watch()
        try:
            await self.app(scope, replay, send_marked)
            return status[0]
        except asyncio.CancelledError:
            if not state["killed"]:
                raise
            _uncancel(me)
            # The worker that had this request died: answer now instead of after serve.request_timeout_s.
            return await _reply(send, 503, "the model worker died while answering; retry",
                                retry=self.sp.retry_after_s)
        finally:
            self._waiting.pop(me, None)

    def _watch(self) -> None:
        """One watcher per event loop (not a poll per request): when the supervisor counts a dead worker, the
        requests waiting for an answer at that moment are cancelled and answered 503."""
        if self._watcher is not None and not self._watcher.done():
            return

        async def watch():
            gen = self.shared.worker_gen.value
            while True:
                await asyncio.sleep(0.1)
                if self.shared.worker_gen.value != gen:
                    gen = self.shared.worker_gen.value
                    for task, state in list(self._waiting.items()):
                        if not state["responded"]:
                            state["killed"] = True
                            task.cancel()

        self._watcher = asyncio.get_running_loop().create_task(watch())


def _uncancel(task) -> None:
    if hasattr(task, "uncancel"):  # Python 3.11+: the cancellation was handled here
        task.uncancel()


async def _read_body(receive, max_bytes: int, timeout_s: float) -> tuple[bytes, tuple | None]:
    """The whole body, or (b"", (status, reason)) when it is too big or does not arrive within ``timeout_s``.
    (One timer for the whole body, not a wait_for task per chunk: this runs for every request.)"""
    chunks, size = [], 0
    me, expired = asyncio.current_task(), []
    timer = asyncio.get_running_loop().call_later(timeout_s, lambda: (expired.append(1), me.cancel()))
    try:
        while True:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                return b"", (400, "client disconnected before the body was complete")
            chunk = msg.get("body", b"")
            size += len(chunk)
            if size > max_bytes:
                return b"", (413, f"body over {max_bytes} bytes")
            chunks.append(chunk)
            if not msg.get("more_body"):
                return b"".join(chunks), None
    except asyncio.CancelledError:
        if not expired:
            raise
        _uncancel(me)
        return b"", (408, f"the request body did not arrive within {timeout_s:g} s")
    finally:
        timer.cancel()


def _typed(send):
    """``send`` that gives a response without a Content-Type (LitServe's ``/`` and ``/ready`` answer bare text) the
    one its OpenAPI document states: text/plain."""

    async def typed(msg):
        if msg["type"] == "http.response.start" and not any(k.lower() == b"content-type"
                                                            for k, _ in msg.get("headers", [])):
            msg = {**msg, "headers": [*msg.get("headers", []), (b"content-type", b"text/plain; charset=utf-8")]}
        await send(msg)

    return typed


async def _reply(send, status: int, reason: str, retry: int | None = None, extra: list | None = None) -> int:
    body = json.dumps({"error": reason}, ensure_ascii=False).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), *(extra or [])]
    if retry is not None:
        headers.append((b"retry-after", str(retry).encode()))
    if status == 408:
        headers.append((b"connection", b"close"))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
    return status
