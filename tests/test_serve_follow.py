"""The service's alias follower over a real MLflow registry: a promoted version whose files do not load leaves the last
good one serving, says so in the state /health reads, and the next good version is still picked up."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from serve_registry import build_registry, tiny_model  # noqa: E402

NAME = "bertpipe-sentiment"


def _register_broken(root: Path, tokenizer_dir: Path) -> str:
    """A version registered like any other whose weights in the artifact store are then damaged (a disk error, a
    half-copied store): its files fail to load."""
    from bertpipe.graph.pipeline import load_config
    from bertpipe.infra.tracking import experiment_id, fluent_mlflow
    from bertpipe.stages.register.record import log_and_register

    cfg = load_config(root / "params.yaml")
    before = set((root / ".bertpipe").rglob("*.safetensors"))
    model_dir = tiny_model(root / "models" / "broken", tokenizer_dir, "cls", seed=7)
    with fluent_mlflow(cfg) as mlflow:
        with mlflow.start_run(experiment_id=experiment_id(cfg)):
            version = log_and_register(mlflow, NAME, model_dir, "text-classification", "zh", [])
    damaged = [p for p in (root / ".bertpipe").rglob("*.safetensors") if p not in before]  # this version's only
    assert damaged, "the new version's weights were not found in the artifact store"
    for p in damaged:  # a new file in its place: a process that mapped the old one keeps its pages
        p.with_suffix(".tmp").write_bytes(b"not a safetensors file")
        p.with_suffix(".tmp").replace(p)
    return version


def _until(check, timeout: float = 60.0, what: str = ""):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.slow
def test_a_version_that_fails_to_load_does_not_stop_alias_following(tmp_path, zh_tokenizer_dir):
    from bertpipe.doors.serve.app import RegistryModelAPI
    from bertpipe.doors.serve.predictor import ModelRef
    from bertpipe.doors.serve.schema import TextRequest
    from bertpipe.graph.pipeline import load_config
    from bertpipe.infra.tracking import client
    from bertpipe.lib.inference.serve_params import ServeParams
    from bertpipe.lib.registered.champion import promote

    root, made = build_registry(tmp_path / "project", zh_tokenizer_dir, versions=2)
    state = tmp_path / "state.json"
    api = RegistryModelAPI(ModelRef(NAME, "champion"), (str(root / "params.yaml"), None, []),
                           ServeParams(poll_s=0.2), state)
    api.setup("cpu")  # the inference worker's start, in this process: v1, and the follow-alias thread
    assert api.model.version == "1"
    broken = _register_broken(root, zh_tokenizer_dir)
    c = client(load_config(root / "params.yaml"))
    promote(c, NAME, broken)
    got = _until(lambda: json.loads(state.read_text()).get("load_error"), what="the load error in the state")
    assert got["version"] == broken and got["error"], got
    assert json.loads(state.read_text())["version"] == "1" and api.model.version == "1"
    assert api.predict(TextRequest(text="很好"))["version"] == "1"  # still answering, from the last good version
    promote(c, NAME, made[1])
    _until(lambda: api.model.version == made[1], what="the next good version")
    after = json.loads(state.read_text())
    assert after["version"] == made[1] and "load_error" not in after, after
    assert api.predict(TextRequest(text="很好"))["version"] == made[1]
