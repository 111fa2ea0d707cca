"""The shipped params.yaml profiles: each validates, and every budget in them is in steps (no wall clock), so a
stage's output depends on its fingerprint and not on the machine's load (docs/demo-budget.md)."""

from pathlib import Path

import pytest
import yaml

from bertpipe.config import load_config

PARAMS = Path(__file__).resolve().parents[1] / "params.yaml"


@pytest.mark.parametrize("profile", ["demo", "evidence", "full"])
def test_shipped_profile_validates_with_step_budgets(profile):
    cfg = load_config(str(PARAMS), profile, [])
    for section in ("base", "pretrain"):
        p = getattr(cfg.params, section)
        assert p.max_steps >= 1
        assert not getattr(p, "max_time_s", None), f"profiles.{profile}.{section}: a wall-clock budget"


def test_no_profile_sets_a_wall_clock_budget():
    def keys(node, path=""):
        if isinstance(node, dict):
            for k, v in node.items():
                yield f"{path}.{k}"
                yield from keys(v, f"{path}.{k}")

    profiles = yaml.safe_load(PARAMS.read_text())["profiles"]
    assert [k for k in keys(profiles) if k.endswith(".max_time_s")] == []
