"""A `dvc repro` with nothing to do runs no heavy command, and DVC tracks the effective params only.

Real `dvc` in a temp git repo over the sample data (splits, prepare, start), the chain built in the test process and
recorded as `dvc repro` records it (`dvc commit`; a `dvc repro` of a whole chain is test_pipeline_e2e's):
- a second `dvc repro` of start (its own file, stages/start/dvc.yaml) runs only start (``always_changed``: the
  registry is its external input) and leaves the root dvc.lock untouched (DVC rewrites start's small lock only);
  start's command says cached without importing MLflow, torch or Prefect (its registry digest is unchanged);
- once the registry changes (a version and alias registered from outside), start asks MLflow again;
- editing the active profile changes params_effective/prepare.json, and DVC reruns exactly the stages that read the
  changed key (prepare and what is below it, not tasks); the stage files hold resolved values, no profiles;
- a `start` entry in the root dvc.lock (written by a dvc.yaml that held start): `bertpipe dvc-yaml` says so and
  leaves the file alone, and DVC ignores the entry (`dvc status` and `dvc repro` see start's own lock only) and keeps it.
"""

from __future__ import annotations

import json
import re
import sys

import pytest
import yaml

from tests.e2e_project import build_chain, invoke, one_task, run, write_project

pytestmark = pytest.mark.slow

HEAVY = ("mlflow", "torch", "prefect", "transformers")
START = "stages/start/dvc.yaml:start"  # DVC's name of the stage in its own file (bertpipe.doors.dvc.dvcfile)


def register_elsewhere(root) -> None:
    """A model version and alias registered in the project's MLflow store by a client that is no stage (this
    process's)."""
    from mlflow import MlflowClient

    uri = f"sqlite:///{root / '.bertpipe' / 'mlflow.db'}"
    c = MlflowClient(tracking_uri=uri, registry_uri=uri)
    c.create_registered_model("elsewhere")
    v = c.create_model_version("elsewhere", source="file:///nonexistent")
    c.set_registered_model_alias("elsewhere", "champion", v.version)


def start_cmd(root) -> tuple[set[str], str]:
    """(the heavy top-level modules `bertpipe start` imports (python -X importtime), built / cached)."""
    proc = run([sys.executable, "-X", "importtime", "-m", "bertpipe", "start"], root)
    mods = {ln.rsplit("|", 1)[-1].strip() for ln in proc.stderr.splitlines() if ln.startswith("import time:")}
    assert mods, proc.stderr[-2000:]
    return mods & set(HEAVY), proc.stdout.split()[1]


def ran(proc) -> list[str]:
    return re.findall(r"Running stage '([^']+)'", proc.stdout)


def test_noop_repro_runs_nothing_and_profile_edits_rerun_what_they_change(tmp_path, sample_raw):
    root = tmp_path
    write_project(root, sample_raw, extra={"profile": "p", "profiles": {"p": {"prepare": {"split": {"valid": 0.05}}}},
                                          "finetune": one_task()})
    run(["git", "init", "-q"], root)
    (root / ".gitignore").write_text("/.bertpipe/\n/data/\n")
    run(["dvc", "init", "-q"], root)
    assert invoke(["dvc-yaml"], root).returncode == 0
    dvc = yaml.safe_load((root / "dvc.yaml").read_text())["stages"]
    assert "params" not in dvc["prepare"] and "params_effective/prepare.json" in dvc["prepare"]["deps"], dvc["prepare"]

    build_chain(root, "start")
    run(["dvc", "commit", "-f", "-q", "--with-deps", START], root)
    lock = root / "dvc.lock"
    before = (lock.read_bytes(), lock.stat().st_mtime_ns)
    assert "start" not in yaml.safe_load(lock.read_text())["stages"]  # start's lock is its own file's
    second = run(["dvc", "repro", START], root)
    assert ran(second) == [START] and "cached" in second.stdout, second.stdout
    assert (lock.read_bytes(), lock.stat().st_mtime_ns) == before, "the root dvc.lock was rewritten"
    assert "start" in yaml.safe_load((root / "stages" / "start" / "dvc.lock").read_text())["stages"]
    for stage in ("params", "splits", "prepare"):
        assert f"Stage '{stage}' didn't change, skipping" in second.stdout, second.stdout
    assert start_cmd(root) == (set(), "cached")  # the decision stands without asking MLflow

    register_elsewhere(root)  # the registry changed: start must ask MLflow again
    heavy, status = start_cmd(root)
    # The same answer (start.json's bytes stay): nothing is rebuilt, the manifest records the registry's new digest
    assert "mlflow" in heavy and status == "cached", (heavy, status)
    assert start_cmd(root) == (set(), "cached")  # ... so the next run needn't ask MLflow

    eff = json.loads((root / "params_effective" / "prepare.json").read_text())["params"]
    assert eff["prepare"]["split"]["valid"] == 0.05 and "profiles" not in eff and "profile" not in eff
    params = yaml.safe_load((root / "params.yaml").read_text())
    params["profiles"]["p"]["prepare"]["split"]["valid"] = 0.1  # a profile edit, not a top-level key
    (root / "params.yaml").write_text(yaml.safe_dump(params, allow_unicode=True, sort_keys=False))
    third = run(["dvc", "repro", START], root)
    assert ran(third)[:2] == ["params", "prepare"] and "splits" not in ran(third), third.stdout
    assert json.loads((root / "params_effective" / "prepare.json").read_text())["params"]["prepare"]["split"][
        "valid"] == 0.1

    lock = yaml.safe_load((root / "dvc.lock").read_text())
    lock["stages"]["start"] = yaml.safe_load((root / "stages" / "start" / "dvc.lock").read_text())["stages"]["start"]
    (root / "dvc.lock").write_text(yaml.safe_dump(lock, sort_keys=False))  # a dvc.yaml that held start wrote this entry
    old = (root / "dvc.lock").read_bytes()
    assert invoke(["dvc-yaml"], root).returncode == 0
    assert (root / "dvc.lock").read_bytes() == old
    status = json.loads(run(["dvc", "status", "--json", "--with-deps", START], root).stdout)
    assert set(status) == {START}, status  # always changed; params, tasks, prepare (from the root lock) unchanged
    assert ran(run(["dvc", "repro", START], root)) == [START]
    run(["dvc", "commit", "-f", "params"], root)  # DVC rewrites the root lock and keeps the entry
    assert "start" in yaml.safe_load((root / "dvc.lock").read_text())["stages"]
