"""Typed Prefect UI parameters, on a real Prefect server (the run's shared one: nothing here needs its scheduler or
triggers): the deployment `bertpipe schedule` serves has a parameter schema the UI renders as a form (a Knobs object
of typed number fields; ``until`` and ``profile`` as choices), and a flow run given knobs runs with them: the stage's
fingerprint is the one the same `--set` override gives."""

from __future__ import annotations

import json
import sys
import uuid

import pytest

from tests.e2e_project import env_for, one_task, run, write_project

pytestmark = pytest.mark.slow

SCRIPT = r"""
import json, sys
from prefect.client.orchestration import get_client
from bertpipe.core.stage import fingerprint, read_manifest
from bertpipe.graph.pipeline import all_stages, load_config
from bertpipe_prefect.flows.domain_adaptation import domain_adaptation
from bertpipe_prefect.flows.schedule import deployment

dep_id = deployment("params.yaml", until="splits", name=sys.argv[1]).apply()
state = domain_adaptation("params.yaml", None, [], "splits", knobs={"finetune_max_train_examples": 100000},
                          return_state=True)
assert state.is_completed(), state
with get_client(sync_client=True) as c:
    schema = c.read_deployment(dep_id).parameter_openapi_schema
    run_params = c.read_flow_run(state.state_details.flow_run_id).parameters
cfg = load_config("params.yaml")
st = all_stages(cfg)["splits"]
fps = {"plain": fingerprint(st, cfg)[0],
       "override": fingerprint(st, load_config("params.yaml", None,
                                               ["finetune.train.max_train_examples=100000"]))[0],
       "built": read_manifest(st.output(cfg))["fingerprint"]}
print("OUT=" + json.dumps({"schema": schema, "run_params": run_params, "fps": fps}))
"""


def test_deployment_schema_is_typed_and_knobs_take_effect(tmp_path, sample_raw):
    from bertpipe.graph.pipeline import COMMANDS

    root = tmp_path / "proj"
    # One small default task: the knob reaches the splits stage whatever it holds (MSRA's 2.2M lines only add time).
    write_project(root, sample_raw, extra={"profile": "small", "profiles": {"small": {"pretrain": {"max_steps": 3}},
                                                                            "big": {"pretrain": {"max_steps": 9}}},
                                           "finetune": one_task()})
    env = env_for(root)
    # a deployment name of its own on the shared server
    proc = run([sys.executable, "-c", SCRIPT, f"typed-{uuid.uuid4().hex[:8]}"], root, check=False, env=env)
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("OUT=")]
    assert line, proc.stdout[-3000:] + proc.stderr[-5000:]
    out = json.loads(line[-1][4:])
    schema = out["schema"]
    props, defs = schema["properties"], schema.get("definitions") or schema.get("$defs")
    knobs = defs["Knobs"]["properties"]
    assert knobs["pretrain_max_steps"]["anyOf"][0] == {"type": "integer", "minimum": 1}, knobs["pretrain_max_steps"]
    assert knobs["finetune_lr"]["anyOf"][0]["type"] == "number" and knobs["finetune_lr"]["title"] == "finetune.train.lr"
    assert "Knobs" in json.dumps(props["knobs"])
    assert props["until"]["anyOf"][0]["enum"] == list(COMMANDS)
    assert props["profile"]["anyOf"][0]["enum"] == ["big", "small"]
    # the run: the knob reached the stage as the override it stands for
    assert out["run_params"]["knobs"]["finetune_max_train_examples"] == 100000, out["run_params"]
    fps = out["fps"]
    assert fps["override"] != fps["plain"] and fps["built"] == fps["override"], fps
