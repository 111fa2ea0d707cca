"""`bertpipe models serve`: the real service (LitServe) on a free loopback port over a real MLflow registry, driven by
real HTTP — single and concurrent requests, bad inputs, overload, an alias move, and a graceful SIGTERM. The tests
that neither overload nor kill the service share one (the ``svc`` fixture: each start costs ~20 CPU-s, the service
and its inference worker importing torch, transformers and mlflow); the overload with a killed worker and the
SIGKILLed service each start their own."""

from __future__ import annotations

import concurrent.futures as cf
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from e2e_project import BIN, env_for, invoke  # noqa: E402
from serve_registry import build_registry  # noqa: E402

from bertpipe.doors.serve.app import exposure_warning, predict_isolated, respond  # noqa: E402
from bertpipe.doors.serve.schema import TextRequest, decode  # noqa: E402

NAME = "bertpipe-sentiment"


# ---------------------------------------------------------------- request validation (no server needed)


@pytest.mark.parametrize("body,kind,status,words", [
    (b'{"text": "\xe5\xa5\xbd"}', "text", None, ""),
    (b'{"text": ["a", "b"]}', "text", None, ""),
    (b"\xff\xfe{}", "text", 400, "UTF-8"),
    (b'{"text": "a"', "text", 400, "not JSON"),
    (b'{"text": "\\ud800abc"}', "text", 400, "not JSON"),  # a lone surrogate: json.loads let it through
    (b'{"text": ' + b"[" * 10_000 + b"]" * 10_000 + b"}", "text", 400, "recursion"),  # was RecursionError -> 500
    (b'["a"]', "text", 422, "JSON object"),
    (b'{"txt": "a"}', "text", 422, "unknown: txt"),
    (b'{"text": 3}', "text", 422, "string"),
    (b'{"text": [1]}', "text", 422, "string"),
    (b'{"text": "   "}', "text", 422, "empty"),
    (b'{"text": []}', "text", 422, "empty list"),
    (b'{"text": ["a", " "]}', "text", 422, '"text"[1] is empty'),
    (b'{"text": "\\u200b\\u200d\\u2060\\ufeff"}', "text", 422, "zero-width"),  # the tokenizer keeps nothing of it
    (b'{"text": "\\u0000\\u0007\\u007f\\u009f"}', "text", 422, "empty"),
    (b'{"text": ["a", "\\u200e\\u00ad"]}', "text", 422, '"text"[1] is empty'),
    (b'{"text": "' + b"a" * 101 + b'"}', "text", 413, "limit is 100"),
    (b'{"text": ["a", "a", "a", "a"]}', "text", 413, "4 items; the limit is 3"),
    (b'{"question": "q", "context": "c"}', "qa", None, ""),
    (b'{"question": ["q"], "context": "c"}', "qa", 422, "lists of one length"),
    (b'{"text": "q"}', "qa", 422, '"question", "context"'),
])
def test_decode(body, kind, status, words):
    got = decode(body, kind, max_chars=100, max_items=3)
    if status is None:
        assert not isinstance(got, tuple), got
    else:
        assert isinstance(got, tuple) and got[0] == status and words in got[1] and "\n" not in got[1], got


def test_one_failing_request_fails_alone():
    """A request the model raises on gets its own error; the others of its batch are answered."""

    def predict(records):
        if any(r["text"] == "boom" for r in records):
            raise ValueError("cannot tokenize")
        return [{"label": "pos" if "好" in r["text"] else "neg", "score": 0.9} for r in records]

    reqs = [TextRequest(text="很好"), TextRequest(text="boom"), TextRequest(text=["坏", "好"])]
    outs = predict_isolated(predict, [r.records() for r in reqs])
    answers = [respond("m", "1", r, o) for r, o in zip(reqs, outs)]
    assert answers[0] == {"model": "m", "version": "1", "label": "pos", "score": 0.9}
    assert answers[1]["status"] == 500 and "error" in answers[1]
    assert [p["label"] for p in answers[2]["predictions"]] == ["neg", "pos"]
    assert predict_isolated(predict, [[{"text": "a"}], [{"text": "b"}]]) == [[{"label": "neg", "score": 0.9}]] * 2


@pytest.mark.parametrize("kind,field", [("text", "text"), ("qa", "question")])
def test_openapi_shows_the_typed_request_and_responses(kind, field, tmp_path):
    import litserve as ls

    from bertpipe.doors.serve.app import QAModelAPI, RegistryModelAPI
    from bertpipe.doors.serve.predictor import ModelRef
    from bertpipe.lib.inference.serve_params import ServeParams

    api = (QAModelAPI if kind == "qa" else RegistryModelAPI)(ModelRef("m", "champion"), ("p", None, []),
                                                             ServeParams(), tmp_path / "state.json")
    schema = ls.LitServer(api, accelerator="cpu").app.openapi()  # the worker (setup) is not started
    post = schema["paths"]["/predict"]["post"]
    ref = post["requestBody"]["content"]["application/json"]["schema"]["$ref"].rsplit("/", 1)[1]
    req = schema["components"]["schemas"][ref]
    assert field in req["properties"] and req["examples"], req
    answers = post["responses"]["200"]["content"]["application/json"]["schema"]["anyOf"]
    assert {a["$ref"].rsplit("/", 1)[1] for a in answers} >= {"LabelResponse", "EntitiesResponse", "BatchResponse"}


def test_openapi_documents_every_answer_and_the_docs_need_no_cdn(tmp_path):
    """Each route's answers with their status and media type (text for / and /ready, Prometheus text for /metrics,
    the Guard's {"error"} for 400/408/413/422/503), the limits the service enforces, and /docs, /redoc offline."""
    import litserve as ls
    from fastapi.testclient import TestClient

    from bertpipe.doors.serve import contract
    from bertpipe.doors.serve.app import RegistryModelAPI
    from bertpipe.doors.serve.predictor import ModelRef
    from bertpipe.lib.inference.serve_params import ServeParams

    sp = ServeParams(max_text_chars=100, max_items=3)
    server = ls.LitServer(RegistryModelAPI(ModelRef("m", "champion"), ("p", None, []), sp, tmp_path / "s.json"),
                          accelerator="cpu", healthcheck_path="/ready")
    server.app.add_api_route("/metrics", lambda: None, methods=["GET"])
    contract.install(server.app, sp)
    client = TestClient(server.app)
    doc = client.get("/openapi.json").json()
    paths = doc["paths"]
    assert list(paths["/"]["get"]["responses"]["200"]["content"]) == ["text/plain"]
    assert {c: list(r["content"]) for c, r in paths["/ready"]["get"]["responses"].items()} == {
        "200": ["text/plain"], "503": ["text/plain"]}
    assert list(paths["/metrics"]["get"]["responses"]["200"]["content"]) == ["text/plain"]
    answers = paths["/predict"]["post"]["responses"]
    for code in ("400", "408", "413", "422", "503"):
        assert answers[code]["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/Error"}
    assert "Retry-After" in answers["503"]["headers"] and "HTTPValidationError" not in doc["components"]["schemas"]
    text = doc["components"]["schemas"]["TextRequest"]["properties"]["text"]["anyOf"]
    one, many = (text[0], text[1]) if text[0]["type"] == "string" else (text[1], text[0])
    assert one["minLength"] == 1 and one["maxLength"] == 100 and "pattern" in one
    assert many["minItems"] == 1 and many["maxItems"] == 3 and many["items"]["maxLength"] == 100
    for page in ("/docs", "/redoc"):
        html = client.get(page).text
        assert "cdn" not in html and "https://" not in html, html
        for asset in re.findall(r'(?:src|href)="(/docs-assets/[^"]+)"', html):
            assert client.get(asset).status_code == 200, asset


def test_listen_host_is_what_litserve_takes_or_one_line():
    from bertpipe.doors.serve.app import listen_host
    from bertpipe.infra.errors import BertpipeError

    assert listen_host("localhost") == "127.0.0.1" and listen_host("::") == "::"
    with pytest.raises(BertpipeError, match=r"--host 192\.168\.1\.5: the service listens on 127\.0\.0\.1"):
        listen_host("192.168.1.5")


def test_exposure_warning():
    assert exposure_warning("127.0.0.1") is None and exposure_warning("localhost") is None
    assert exposure_warning("::1") is None
    for host in ("0.0.0.0", "::", "192.168.1.5", "myhost"):
        assert "no authentication" in exposure_warning(host)


# ---------------------------------------------------------------- the real service


def _sleeper():
    time.sleep(60)


def test_a_worker_replaced_between_two_looks_still_counts_as_a_death():
    """LitServe's monitor replaces a dead worker every 2 s at any phase, so it can put a new process in the list
    before the supervisor next looks; the requests the dead one held must still be answered 503 (CI saw one hang)."""
    import multiprocessing as mp
    import threading
    from types import SimpleNamespace

    from litserve.utils import WorkerSetupStatus

    from bertpipe.doors.serve.app import supervise
    from bertpipe.doors.serve.guard import Shared

    ctx = mp.get_context("fork")
    first = ctx.Process(target=_sleeper, daemon=True)
    first.start()
    server = SimpleNamespace(inference_workers=[first], workers_setup_status={0: WorkerSetupStatus.READY})
    shared, stop = Shared(), threading.Event()
    t = threading.Thread(target=supervise, args=(server, shared, stop, 1.0), daemon=True)
    t.start()
    replacement = None
    try:
        deadline = time.monotonic() + 10
        while not shared.worker_up.value and time.monotonic() < deadline:
            time.sleep(0.02)
        assert shared.worker_up.value == 1 and shared.worker_gen.value == 0
        time.sleep(0.3)  # just after a look: the next one is ~0.7 s away
        first.kill()
        first.join(5)
        replacement = ctx.Process(target=_sleeper, daemon=True)
        replacement.start()
        server.inference_workers[0] = replacement  # what LitServe's monitor does, before the next look
        deadline = time.monotonic() + 5
        while shared.worker_gen.value == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert shared.worker_gen.value == 1
        time.sleep(1.2)  # a later look counts it once, not again
        assert shared.worker_gen.value == 1 and shared.worker_up.value == 1
    finally:
        stop.set()
        t.join(5)
        for p in (first, replacement):
            if p is not None and p.is_alive():
                p.kill()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def registry(tmp_path_factory, zh_tokenizer_dir):
    root, versions = build_registry(tmp_path_factory.mktemp("serve") / "project", zh_tokenizer_dir, versions=2)
    assert versions == ["1", "2"]
    return root


class Service:
    def __init__(self, root: Path, *sets: str):
        self.root, self.port = root, free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [str(BIN / "bertpipe"), "models", "serve", NAME, "--port", str(self.port)]
        for s in sets:
            cmd += ["--set", s]
        self.log = open(root / f"serve-{self.port}.log", "w")
        self.proc = subprocess.Popen(cmd, cwd=root, env=env_for(root), stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, self.output()
            try:
                if self.get("/health")[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.5)
        self.stop()
        raise AssertionError("service never became healthy:\n" + self.output())

    def output(self) -> str:
        if not self.log.closed:
            self.log.flush()
        return (self.root / f"serve-{self.port}.log").read_text()[-4000:]

    def request(self, method: str, path: str, body: bytes | None = None, timeout: float = 60):
        import urllib.error
        import urllib.request

        req = urllib.request.Request(self.url + path, data=body, method=method)
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:
                return r.status, json.loads(r.read() or b"null"), dict(r.headers)
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"null"), dict(e.headers)

    def get(self, path: str):
        return self.request("GET", path, timeout=15)

    def raw(self, path: str) -> str:
        import urllib.request

        with urllib.request.urlopen(self.url + path, timeout=15) as r:
            return r.read().decode()

    def predict(self, text: str, timeout: float = 60):
        return self.request("POST", "/predict", json.dumps({"text": text}, ensure_ascii=False).encode(), timeout)

    def stop(self, sig=signal.SIGTERM, timeout: float = 60) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        return self.proc.returncode


@pytest.fixture(scope="module")
def svc(registry):
    """One `bertpipe models serve` for the tests that neither overload nor kill it, with settings that serve each
    one's claims: the registry polled every 0.5 s (an alias move is seen at once), a 50 ms batch wait (concurrent
    requests share batches), 16 requests admitted at once (16 concurrent clients all get in; the slow senders are more
    than that), 1.5 s for a request's head and for its body (slow senders are timed out within the test)."""
    shared = Service(registry, "serve.poll_s=0.5", "serve.batch_wait_ms=50", "serve.max_queue=16",
                     "serve.body_timeout_s=1.5", "serve.head_timeout_s=1.5")
    yield shared
    rc = shared.stop()  # stopped already by test_the_shared_service_exits_0_on_sigterm unless that test was deselected
    assert rc == 0, shared.output()


@pytest.mark.slow
def test_serves_batches_follows_alias_and_refuses_bad_input(svc, registry):
    status, health, _ = svc.get("/health")
    assert status == 200 and health["version"] == "1" and health["task"] == "classification"
    status, out, _ = svc.predict("这个产品很好")
    assert status == 200 and out["version"] == "1" and out["label"] in ("neg", "pos") and 0 <= out["score"] <= 1
    # Concurrent requests are answered one-to-one (batched inside), each with its own text's prediction.
    texts = ["很好很好", "太坏了", "非常好", "坏透了"] * 8
    with cf.ThreadPoolExecutor(16) as ex:
        answers = list(ex.map(svc.predict, texts))
    assert all(a[0] == 200 for a in answers)
    alone = {t: svc.predict(t)[1]["label"] for t in set(texts)}
    assert [a[1]["label"] for a in answers] == [alone[t] for t in texts]
    # Bad input: a 4xx with a one-line reason, never a 5xx; the service stays up.
    long_text = "好" * 30_000
    for body, code in [(b"\xff\xfe", 400), (b"{", 400), (b'{"texts": ["a"]}', 422), (b'{"text": ""}', 422),
                       (json.dumps({"text": long_text}).encode(), 413)]:
        status, out, _ = svc.request("POST", "/predict", body)
        assert status == code and "\n" not in out["error"], (body[:20], status, out)
    assert svc.request("GET", "/predict")[0] == 405
    # A text longer than the model's 64 positions is truncated, not an error.
    assert svc.predict("好" * 500)[0] == 200
    # Promote v2 with the real CLI while requests keep coming: none fails, and the service switches.
    promote = invoke(["models", "promote", NAME, "2"], registry, env_for(registry))
    assert promote.returncode == 0, promote.stderr
    seen, deadline = [], time.monotonic() + 60
    while time.monotonic() < deadline and (not seen or seen[-1] != "2"):
        status, out, _ = svc.predict("很好")
        assert status == 200, out
        seen.append(out["version"])
    assert seen[-1] == "2", seen
    assert svc.get("/health")[1]["version"] == "2"


def _slow_body(port: int) -> socket.socket:
    """A connection that sends its headers and one byte of a 100-byte body, then nothing."""
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    s.sendall(b"POST /predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{")
    return s


@pytest.mark.slow
def test_no_request_can_break_another(svc, registry):
    """On real HTTP: a lone surrogate in a burst, deep nesting, slow bodies (a killed worker: test_overload_...);
    lists of texts, typed OpenAPI, /metrics, the version in /info; connections without a request head time out;
    schemathesis finds nothing the OpenAPI document does not say."""
    # (3) a lone surrogate inside a burst of valid requests: it alone is refused, every other one answered.
    bad = b'{"text": "\\ud800abc"}'
    with cf.ThreadPoolExecutor(8) as ex:
        futs = [ex.submit(svc.predict, "很好") for _ in range(6)] + [ex.submit(svc.request, "POST", "/predict", bad)]
        futs += [ex.submit(svc.predict, "太坏了") for _ in range(6)]
        answers = [f.result() for f in futs]
    assert [a[0] for a in answers] == [200] * 6 + [400] + [200] * 6, answers
    # (4) nesting 10,000 deep: a 4xx, not RecursionError -> 500
    status, out, _ = svc.request("POST", "/predict", b'{"text": ' + b"[" * 10_000 + b"]" * 10_000 + b"}")
    assert status == 400 and "\n" not in out["error"], out
    # (5) more slow senders than max_queue: real requests still get through; the slow ones get 408.
    slow = [_slow_body(svc.port) for _ in range(24)]
    try:
        time.sleep(0.3)
        assert all(svc.predict("很好")[0] == 200 for _ in range(3))
        for s in slow:
            s.settimeout(10)
            assert s.recv(100).startswith(b"HTTP/1.1 408"), "a slow body was not timed out"
    finally:
        for s in slow:
            s.close()
    # A list of texts in one request, answered in order; typed schema; metrics; version in /info.
    served = svc.get("/health")[1]["version"]  # the champion (the test above promotes v2)
    status, out, _ = svc.request("POST", "/predict", json.dumps({"text": ["很好很好", "太坏了"]}).encode())
    assert status == 200 and out["version"] == served and len(out["predictions"]) == 2, out
    assert [p["label"] for p in out["predictions"]] == [svc.predict(t)[1]["label"] for t in ("很好很好", "太坏了")]
    schema = svc.get("/openapi.json")[1]
    assert "text" in schema["components"]["schemas"]["TextRequest"]["properties"]
    assert "LabelResponse" in schema["components"]["schemas"]
    assert svc.get("/info")[1]["model"]["version"] == served
    metrics = svc.raw("/metrics")
    assert 'bertpipe_requests_total{status="200"}' in metrics and 'bertpipe_requests_total{status="400"}' in metrics
    assert "bertpipe_batch_size_count" in metrics and 'bertpipe_model_version{' in metrics
    # A connection that sends nothing, or its head a byte at a time, is answered 408 and closed.
    idle, trickle = (socket.create_connection(("127.0.0.1", svc.port), timeout=15) for _ in range(2))
    try:
        for ch in b"GET /health HTTP/1.1\r\nHost: x\r\n":
            try:
                trickle.send(bytes([ch]))
            except OSError:  # closed by the server: what is checked below
                break
            time.sleep(0.2)
        for s in (idle, trickle):
            assert s.recv(100).startswith(b"HTTP/1.1 408"), "a connection without a request head stayed open"
    finally:
        idle.close()
        trickle.close()
    # The service against its own OpenAPI document: every documented operation, positive and negative data.
    # schemathesis expects a schema-violating body to get 400 or 422; a text over serve.max_text_chars is 413
    # here (as documented), so 413 is added to what that check accepts.
    conf = registry / "schemathesis.toml"
    conf.write_text("[checks.negative_data_rejection]\nexpected-statuses = [400, 405, 413, 422]\n")
    st = subprocess.run([str(BIN / "st"), "--config-file", str(conf), "run", f"{svc.url}/openapi.json",
                         "--checks", "all", "-w", "1",
                         "--max-examples", "10", "--request-timeout", "30", "--suppress-health-check", "all",
                         "--seed", "1"], cwd=registry, capture_output=True, text=True, timeout=300)
    assert st.returncode == 0, st.stdout[-6000:]


@pytest.mark.slow
def test_the_shared_service_exits_0_on_sigterm(svc):
    """SIGTERM ends the service the tests above used with status 0 and frees its port; stopped here rather than at
    the module's end, so it does not idle beside the services of the tests below."""
    assert svc.stop() == 0, svc.output()
    with pytest.raises(OSError):
        svc.get("/health")


def wait_inflight(svc: Service, n: int, timeout: float = 60) -> None:
    """Until the service has ``n`` requests admitted (its /health count): what a test does next is then about
    them, however slowly a loaded machine got them there."""
    deadline = time.monotonic() + timeout
    while svc.get("/health")[1]["inflight"] != n:
        assert time.monotonic() < deadline, svc.get("/health")
        time.sleep(0.05)


@pytest.mark.slow
def test_overload_and_a_killed_worker_get_503_and_sigterm_finishes_in_flight(registry):
    # A long batch wait keeps requests queued, so the bound is reached; max_queue 4 admits four at a time. The
    # waits below are on the service's own counts, not on times, so the test holds on a machine busy with others.
    svc = Service(registry, "serve.max_queue=4", "serve.batch_wait_ms=3000", "serve.max_batch_size=64")
    try:
        with cf.ThreadPoolExecutor(12) as ex:
            answers = list(ex.map(svc.predict, ["很好"] * 12))
        codes = sorted(a[0] for a in answers)
        assert codes.count(200) >= 4 and 503 in codes, codes
        refused = [a for a in answers if a[0] == 503]
        assert all(a[2].get("retry-after") or a[2].get("Retry-After") for a in refused)
        assert svc.get("/health")[1]["rejected"] >= len(refused)
        # SIGKILL the inference worker while it holds a request (waiting 3 s for company): that
        # request gets 503 + Retry-After at once instead of hanging; so do new ones until the restarted worker is
        # ready; then the service answers again (it neither exits nor stays down).
        # (Hanging would mean serve.request_timeout_s, 60 s; the bound leaves room for a loaded machine.)
        with cf.ThreadPoolExecutor(1) as ex:
            held = ex.submit(svc.predict, "很好", 50)
            wait_inflight(svc, 1)  # admitted, and waiting 3 s in the batch for company
            t0 = time.monotonic()
            os.kill(svc.get("/health")[1]["worker_pid"], signal.SIGKILL)
            status, out, headers = held.result()
        assert status == 503 and time.monotonic() - t0 < 20, out
        assert "retry-after" in {k.lower() for k in headers}
        deadline = time.monotonic() + 120
        while svc.get("/health")[0] != 200:
            assert time.monotonic() < deadline and svc.proc.poll() is None, svc.output()
            assert svc.predict("好", 20)[0] == 503
            time.sleep(0.5)
        assert svc.get("/health")[1]["worker_restarts"] == 1 and svc.predict("很好")[0] == 200
        # In-flight requests when SIGTERM arrives still get their answers; then the process exits 0.
        with cf.ThreadPoolExecutor(3) as ex:
            futures = [ex.submit(svc.predict, "好") for _ in range(3)]
            wait_inflight(svc, 3)
            svc.proc.send_signal(signal.SIGTERM)
            assert [f.result()[0] for f in futures] == [200, 200, 200]
    finally:
        rc = svc.stop()
    assert rc == 0, svc.output()
    with pytest.raises(OSError):
        svc.get("/health")


@pytest.mark.slow
def test_unknown_model_is_one_line_error(registry):
    proc = invoke(["models", "serve", "no-such-model", "--port", str(free_port())], registry, env_for(registry))
    assert proc.returncode != 0
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "no-such-model" in lines[0], proc.stderr


@pytest.mark.slow
def test_mlflow_models_serve_answers_the_champion(registry):
    """Users who prefer MLflow's own scoring server can serve the same registered model."""
    port = free_port()
    env = env_for(registry)
    env["MLFLOW_TRACKING_URI"] = f"sqlite:///{registry / '.bertpipe' / 'mlflow.db'}"
    proc = subprocess.Popen([str(BIN / "mlflow"), "models", "serve", "-m", f"models:/{NAME}@champion",
                             "--env-manager", "local", "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
                            cwd=registry, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    import urllib.request

    try:
        deadline = time.monotonic() + 180
        while True:
            assert proc.poll() is None, proc.stdout.read().decode()[-3000:]
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/ping", timeout=2)
                break
            except OSError:
                assert time.monotonic() < deadline, "mlflow models serve never answered /ping"
                time.sleep(1)
        req = urllib.request.Request(f"http://127.0.0.1:{port}/invocations", method="POST",
                                     data=json.dumps({"inputs": ["这个产品很好", "这" * 300]},
                                                     ensure_ascii=False).encode(),
                                     headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as r:
            out = json.loads(r.read())
        # the second text is past the 64 positions: truncated by the flavor's model_config
        assert r.status == 200 and [p["label"] in ("neg", "pos") for p in out["predictions"]] == [True, True], out
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


@pytest.mark.slow
def test_a_sigkilled_service_leaves_nothing_on_its_port_and_a_busy_port_is_one_error_line(registry):
    import psutil

    svc = Service(registry)
    try:
        tree = [p for p in psutil.Process(svc.proc.pid).children(recursive=True)]
        assert len(tree) >= 3, [p.cmdline() for p in tree]  # the watcher, the API server, the inference worker
        second = invoke(["models", "serve", NAME, "--port", str(svc.port)], registry, env_for(registry))
        lines = [ln for ln in second.stderr.splitlines() if ln.strip()]
        assert second.returncode == 2 and len(lines) == 1, second.stderr
        assert lines[0].startswith(f"error: --port {svc.port}: cannot listen on 127.0.0.1:{svc.port}"), lines
        svc.proc.kill()
        svc.proc.wait(10)
        gone, alive = psutil.wait_procs(tree, timeout=60)
        assert not alive, [p.cmdline() for p in alive]
        with pytest.raises(OSError):
            svc.get("/health")
    finally:
        svc.stop()


@pytest.mark.slow
def test_cli_warns_on_public_host_and_refuses_cuda_without_gpu(registry):
    import torch
    from typer.testing import CliRunner

    from bertpipe.doors.cli.commands import app

    p = str(registry / "params.yaml")
    res = CliRunner().invoke(app, ["models", "serve", "no-such-model", "--host", "0.0.0.0", "--params", p])
    assert res.exit_code != 0 and "warning: --host 0.0.0.0: the service has no authentication" in res.output
    if not torch.cuda.is_available():
        (registry / "in.txt").write_text("很好\n", encoding="utf-8")
        for cmd in (["models", "serve", NAME],
                    ["models", "predict", NAME, "-i", str(registry / "in.txt"), "-o", str(registry / "o.jsonl")]):
            res = CliRunner().invoke(app, cmd + ["--device", "cuda", "--params", p])
            lines = [ln for ln in res.output.splitlines() if ln.strip()]
            assert res.exit_code != 0 and len(lines) == 1 and lines[0].startswith("error: --device cuda: no CUDA"), \
                res.output


@pytest.mark.slow
def test_champion_truncates_long_text_however_it_is_loaded(registry):
    """The README's pyfunc call on a text past the 64-position table: every way of loading the transformers-flavor
    champion truncates it as `models predict` does (head), with no size mismatch."""
    from bertpipe.graph.pipeline import load_config
    from bertpipe.infra.tracking import fluent_mlflow
    from bertpipe.lib.inference.predictor import Predictor
    from bertpipe.lib.registered.files import local_version

    cfg = load_config(registry / "params.yaml")
    long_text, head = "这" * 300 + "好", "这" * 62  # 62 characters + [CLS] + [SEP] = the 64 positions
    uri = f"models:/{NAME}@champion"
    with fluent_mlflow(cfg) as mlflow:
        out = mlflow.pyfunc.load_model(uri).predict(["很好", long_text, head])
        pipe = mlflow.transformers.load_model(uri)
        assert pipe.tokenizer.model_max_length == 64
        native = pipe([long_text, head], truncation=True)
        by_default = mlflow.transformers.load_model(uri, truncation=True)(long_text)  # what docs/serving.md says
    assert len(out) == 3 and set(out["label"]) <= {"neg", "pos"}
    assert out["label"][1] == out["label"][2] and out["score"][1] == pytest.approx(out["score"][2], abs=1e-5)
    assert native[0]["score"] == pytest.approx(out["score"][1], abs=1e-5)
    assert by_default[0]["score"] == pytest.approx(out["score"][1], abs=1e-5)
    lv = local_version(cfg, f"{NAME}@champion")
    ours = Predictor.from_dir(lv.model_dir, lv.files_dir).predict([{"text": long_text}])[0]
    assert ours["label"] == out["label"][1] and ours["score"] == pytest.approx(out["score"][1], abs=1e-4)
