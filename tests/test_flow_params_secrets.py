"""A ``--set`` of `bertpipe run` / `retrain` / `schedule` becomes a Prefect flow (or deployment) parameter, which
Prefect stores in its database and shows in its UI: one carrying a credential is refused with one line, before
Prefect (or anything else) starts, and the line itself does not repeat the secret."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from bertpipe.doors.cli.commands import flow_overrides
from bertpipe.infra.errors import BertpipeError

SECRET = "pa55-Wx9"


@pytest.mark.parametrize("command", [["run"], ["retrain", "--add", "new.jsonl"], ["schedule"]])
def test_a_credential_in_set_is_refused_before_prefect_starts(tmp_path, command):
    env = {**os.environ, "HOME": str(tmp_path / "home")}
    env.pop("PREFECT_API_URL", None)
    proc = subprocess.run([sys.executable, "-m", "bertpipe", *command, "--set",
                           f"tracking.uri=https://alice:{SECRET}@mlflow.example", "--set", "pretrain.max_steps=2"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: --set tracking.uri=https://mlflow.example"), proc.stderr
    assert "MLFLOW_TRACKING_URI" in lines[0] and "Traceback" not in proc.stderr
    assert SECRET not in proc.stdout + proc.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no Prefect home, no state dir, nothing


def test_items_without_credentials_pass_unchanged():
    items = ["tracking.uri=http://127.0.0.1:5000", "finetune.train.lr=1e-5", "prepare.domain.sources=[]"]
    assert flow_overrides(items) == items and flow_overrides(None) == []
    with pytest.raises(BertpipeError, match=r"tracking.uri=http://h/\?token=\*\*\*") as e:
        flow_overrides([f"tracking.uri=http://h/?token={SECRET}"])
    assert SECRET not in str(e.value)
