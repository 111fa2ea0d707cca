"""The Prefect door installs as bertpipe_prefect.flows / bertpipe_prefect.tasks, never as top-level `flows` / `tasks`:
a user project's own flows/ and tasks/ packages (the cwd is first on sys.path) cannot shadow it.

- the wheel, built from a copy of the repo, holds bertpipe and bertpipe_prefect only (and bertpipe/serve, a
  namespace package a plain find would skip);
- in a project that has its own flows/ and tasks/ (which leave a marker file when imported), the deployment
  `bertpipe schedule` serves has a module entrypoint that resolves to bertpipe's flow, and a real flow door
  (`python -m bertpipe_prefect.flows.domain_adaptation --until splits`) runs bertpipe's flow; the project's packages are never imported.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.e2e_project import REPO, copy_code, one_task, run, write_project

USER_PKG = """from pathlib import Path
Path(__file__).resolve().parents[1].joinpath("imported-{name}").write_text("the project's own {name}/ was imported")
raise ImportError("the project's own {name}/ shadowed bertpipe's")
"""


def test_wheel_installs_the_prefect_door_under_bertpipe_prefect(tmp_path):
    src = tmp_path / "src"
    copy_code(src)
    for f in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / f, src / f)
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", str(src),
                           "-w", str(tmp_path / "dist")], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    (wheel,) = (tmp_path / "dist").glob("bertpipe-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names if not n.startswith("bertpipe-")} == {"bertpipe", "bertpipe_prefect"}
    for f in ("bertpipe_prefect/flows/domain_adaptation.py", "bertpipe_prefect/tasks/stages.py",
              "bertpipe/serve/app.py", "bertpipe/cli.py"):
        assert f in names, f


def shadowing_project(root: Path, sample_raw: Path) -> Path:
    write_project(root, sample_raw, {"finetune": one_task()})
    for name in ("flows", "tasks"):
        (root / name).mkdir()
        (root / name / "__init__.py").write_text(USER_PKG.format(name=name))
        (root / name / "domain_adaptation.py").write_text("raise ImportError('the project flows module')\n")
    return root


RESOLVE = """
import inspect, json, os
from bertpipe_prefect.flows.serve import deployment
from prefect.flows import load_flow_from_entrypoint
dep = deployment("params.yaml", until="splits")
flow = load_flow_from_entrypoint(dep.entrypoint)
print("OUT=" + json.dumps({"entrypoint": dep.entrypoint, "flow": flow.name,
                           "file": os.path.realpath(inspect.getfile(flow.fn))}))
"""


def test_a_project_s_own_flows_and_tasks_do_not_shadow_the_deployment_entrypoint(tmp_path, sample_raw):
    root = shadowing_project(tmp_path / "proj", sample_raw)
    proc = run([sys.executable, "-c", RESOLVE], root, timeout=300)
    out = json.loads([ln for ln in proc.stdout.splitlines() if ln.startswith("OUT=")][-1][4:])
    assert out["entrypoint"] == "bertpipe_prefect.flows.domain_adaptation.domain_adaptation", out
    assert out["flow"] == "domain_adaptation"
    assert out["file"] == str((REPO / "flows" / "domain_adaptation.py").resolve()), out
    assert not list(root.glob("imported-*"))


@pytest.mark.slow
def test_a_project_s_own_flows_and_tasks_do_not_shadow_the_flow_door(tmp_path, sample_raw):
    # `python -m`, like Prefect's runner process for a deployment run, puts the cwd first on sys.path
    root = shadowing_project(tmp_path / "proj", sample_raw)
    proc = run([sys.executable, "-m", "bertpipe_prefect.flows.domain_adaptation", "--until", "splits"], root,
               timeout=600)
    assert (root / "work" / "splits" / "manifest.json").is_file(), proc.stdout[-2000:]
    assert not list(root.glob("imported-*")), proc.stdout[-2000:] + proc.stderr[-2000:]
