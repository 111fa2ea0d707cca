"""profiles.yaml beside params.yaml holds more `profiles:` entries (out of DVC's view: DVC reads params.yaml as its
default params file and would list every profile's keys); the same precedence holds, and DVC's `params` stage
depends on the file, so a profile edit there reruns what it changes."""

from __future__ import annotations

import pytest
import yaml

from bertpipe.graph.pipeline import load_config
from bertpipe.infra.errors import BertpipeError


def write(root, params: dict, profiles) -> None:
    (root / "params.yaml").write_text(yaml.safe_dump(params))
    (root / "profiles.yaml").write_text(profiles if isinstance(profiles, str) else yaml.safe_dump(profiles))


def test_profiles_file_applies_under_the_top_level_keys(tmp_path):
    write(tmp_path, {"profile": "p", "vocab": {"top_k": 5}},
          {"p": {"pretrain": {"max_steps": 7}, "vocab": {"top_k": 9, "min_freq": 3}}, "q": {"pretrain": {"lr": 0.5}}})
    cfg = load_config(tmp_path / "params.yaml")
    assert cfg.params.pretrain.max_steps == 7 and cfg.params.vocab.min_freq == 3
    assert cfg.params.vocab.top_k == 5  # the file's own key wins over the profile
    assert load_config(tmp_path / "params.yaml", profile="q").params.pretrain.lr == 0.5


def test_a_profile_in_params_yaml_wins_over_the_file_s(tmp_path):
    write(tmp_path, {"profile": "p", "profiles": {"p": {"pretrain": {"max_steps": 3}}}},
          {"p": {"pretrain": {"max_steps": 7}}})
    assert load_config(tmp_path / "params.yaml").params.pretrain.max_steps == 3


def test_a_bad_profiles_file_is_one_line_naming_it(tmp_path):
    write(tmp_path, {"profile": "p"}, "[1, 2]\n")
    with pytest.raises(BertpipeError, match=r"profiles\.yaml.*mapping of profile name"):
        load_config(tmp_path / "params.yaml")


def test_dvc_params_stage_depends_on_the_profiles_file(tmp_path):
    from bertpipe.doors.dvc.dvcfile import _params_stage

    write(tmp_path, {"profile": "p"}, {"p": {"pretrain": {"max_steps": 7}}})
    assert _params_stage(load_config(tmp_path / "params.yaml"))["deps"] == ["params.yaml", "profiles.yaml"]
    (tmp_path / "profiles.yaml").unlink()
    (tmp_path / "params.yaml").write_text("{}\n")
    assert _params_stage(load_config(tmp_path / "params.yaml"))["deps"] == ["params.yaml"]
