"""The Prefect door installs as bertpipe_prefect.flows / bertpipe_prefect.tasks, never as top-level `flows` / `tasks`:
a user project's own flows/ and tasks/ packages (the cwd is first on sys.path) cannot shadow it.

- the wheel, built from a copy of the repo, holds bertpipe and bertpipe_prefect only (and bertpipe/doors/serve, a
  namespace package a plain find would skip);
- in a project that has its own flows/ and tasks/ (which leave a marker file when imported), the deployment
  `bertpipe schedule` serves has a module entrypoint that resolves to bertpipe's flow, and a real flow door
  (`python -m bertpipe_prefect.flows.domain_adaptation --until tasks`) runs bertpipe's flow; the project's packages are never imported.
- installed from that wheel (not `-e`), a git+DVC project built by `dvc repro` and then moved keeps its stages
  fresh for `bertpipe stages`, `dvc status`, `dvc repro` and the stage's own command.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import yaml

from tests.e2e_project import REPO, copy_code, one_task, run, write_project

USER_PKG = """from pathlib import Path
Path(__file__).resolve().parents[1].joinpath("imported-{name}").write_text("the project's own {name}/ was imported")
raise ImportError("the project's own {name}/ shadowed bertpipe's")
"""


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """bertpipe's wheel, built from a copy of the repo."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    copy_code(src)
    for f in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy(REPO / f, src / f)
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", str(src),
                           "-w", str(tmp / "dist")], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    (built,) = (tmp / "dist").glob("bertpipe-*.whl")
    return built


def test_wheel_installs_the_prefect_door_under_bertpipe_prefect(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    assert {n.split("/")[0] for n in names if not n.startswith("bertpipe-")} == {"bertpipe", "bertpipe_prefect"}
    for f in ("bertpipe_prefect/flows/domain_adaptation.py", "bertpipe_prefect/tasks/stages.py",
              "bertpipe/doors/serve/app.py", "bertpipe/doors/cli/commands.py"):
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
from bertpipe_prefect.flows.schedule import deployment
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


@pytest.mark.slow
def test_a_project_moved_under_a_non_editable_install_keeps_its_stages_and_dvc_lock(wheel, tmp_path, sample_raw):
    """bertpipe installed from its wheel (not `-e`: `pip install --target`, its `bertpipe` first on PATH and its
    package first on PYTHONPATH), a git+DVC project that `dvc repro` built a stage of, then moved: in its new place
    dvc.yaml is current, `bertpipe stages` calls the stage fresh, `dvc status` does not list it, `dvc repro` runs
    nothing and the stage's command finds its output fresh. DVC tracks no code folder (the code is not the
    project's); the stage's fingerprint carries the code's digest, the same as a checkout's."""
    site = tmp_path / "site"
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--target", str(site),
                           str(wheel)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    env = {**os.environ, "PATH": f"{site / 'bin'}{os.pathsep}{os.environ['PATH']}", "PYTHONPATH": str(site),
           "DVC_NO_ANALYTICS": "1", "DVC_SITE_CACHE_DIR": str(tmp_path / "dvc-site"),
           "PREFECT_HOME": str(tmp_path / "prefect")}

    def sh(cmd: list[str], root: Path) -> str:
        done = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, f"{cmd}: {done.stdout[-3000:]}\n{done.stderr[-3000:]}"
        return done.stdout

    root = write_project(tmp_path / "proj", sample_raw, {"finetune": one_task()}).parent
    probe = "import bertpipe, bertpipe_prefect.flows as f; print(bertpipe.__file__, *f.__path__)"
    assert sh([sys.executable, "-c", probe], root).split() == [
        str(site / "bertpipe" / "__init__.py"), str(site / "bertpipe_prefect" / "flows")]
    for cmd in (["git", "init", "-q"], ["dvc", "init", "-q"], ["bertpipe", "dvc-yaml"], ["dvc", "repro", "splits"]):
        sh(cmd, root)
    dvc_yaml = yaml.safe_load((root / "dvc.yaml").read_text())["stages"]
    assert dvc_yaml["params"]["deps"] == ["params.yaml"], dvc_yaml["params"]  # no code folder in the project
    fp = json.loads((root / "work" / "splits" / "manifest.json").read_text())["fingerprint"]

    moved = tmp_path / "elsewhere" / "proj"
    moved.parent.mkdir()
    root.rename(moved)
    assert "are current" in sh(["bertpipe", "dvc-yaml", "--check"], moved)
    states = {ln.split()[0]: ln.split()[1] for ln in sh(["bertpipe", "stages"], moved).splitlines() if ln.strip()}
    assert states["splits"] == "fresh", states
    status = json.loads(sh(["dvc", "status", "--json"], moved) or "{}")
    assert "splits" not in status and "params" not in status, status
    assert "Running stage" not in sh(["dvc", "repro", "splits"], moved)
    assert "cached" in sh(["bertpipe", "splits"], moved)
    assert json.loads((moved / "work" / "splits" / "manifest.json").read_text())["fingerprint"] == fp
