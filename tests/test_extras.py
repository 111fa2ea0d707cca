"""A door whose optional extra is missing says so in one line, exit 2, no traceback, before anything runs.

The missing module is simulated (``sys.modules[name] = None``, which makes both ``import`` and ``find_spec`` fail as
for an uninstalled package), not uninstalled: the venv stays whole for the other tests.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from bertpipe.graph.pipeline import load_config
from bertpipe.infra.errors import BertpipeError
from tests.e2e_project import env_for

CLI = "import sys; sys.modules[sys.argv[1]] = None; sys.argv = ['bertpipe', *sys.argv[2:]]; " \
      "from bertpipe.doors.cli.commands import main; main()"


def test_models_serve_without_the_serve_extra_is_one_line(tmp_path):
    proc = subprocess.run([sys.executable, "-c", CLI, "litserve", "models", "serve", "sentiment"], cwd=tmp_path,
                          env=env_for(tmp_path), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert proc.stderr.strip().splitlines() == [
        "error: bertpipe models serve needs the 'serve' extra: pip install 'bertpipe[serve]'"], proc.stderr
    # (no params.yaml here: the check comes before anything reads one)


def test_models_serve_with_the_extra_gets_past_the_check(tmp_path):
    proc = subprocess.run([sys.executable, "-c", CLI, "not_a_module_of_any_extra", "models", "serve", "sentiment"],
                          cwd=tmp_path, env=env_for(tmp_path), capture_output=True, text=True, timeout=120)
    # it fails later (no params.yaml, no such model), as one line too
    assert proc.returncode == 2 and "extra" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def test_the_dask_runner_without_the_dask_extra_is_one_error(tmp_path, monkeypatch):
    from bertpipe_prefect.tasks.cluster import submitting

    (tmp_path / "params.yaml").write_text("flow: {runner: dask}\n")
    cfg = load_config(tmp_path / "params.yaml")
    monkeypatch.setitem(sys.modules, "prefect_dask", None)
    want = r"^flow\.runner: dask needs the 'dask' extra: pip install 'bertpipe\[dask\]'$"
    with pytest.raises(BertpipeError, match=want):
        with submitting(cfg):
            pass
