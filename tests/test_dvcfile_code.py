"""dvc.yaml tracks code as one params key per stage, and DVC reads the params file as JSON (quick: no dvc run).

For a checkout (the repo's own params.yaml: the bertpipe code lives in the project) the generated dvc.yaml lists
every stage's source files once, as the deps of the ``params`` stage, and no other stage lists a source file;
params_effective.json holds under ``code.<stage>`` the digest the stage's fingerprint holds, and each stage's
``params:`` names it. DVC picks a params file's loader from everything after the first dot of its name
(dvc_objects' ``fs.suffix``): the file's name must give the JSON loader, which the old name did not.
"""

from __future__ import annotations

import json

from typer.testing import CliRunner

from bertpipe.cli import app
from bertpipe.config import load_config
from bertpipe.dvcfile import CODE, EFFECTIVE, LEGACY_EFFECTIVE, dvc_stage_name, dvc_yaml, effective_params
from bertpipe.pipeline import all_stages
from tests.e2e_project import REPO, write_project


def test_code_is_one_params_key_per_stage_and_the_params_stage_lists_the_source_files_once(sample_raw):
    cfg = load_config(REPO / "params.yaml", overrides=[f"paths.raw={sample_raw}"])  # a checkout: code in the project
    stages = all_stages(cfg)
    dvc = dvc_yaml(cfg)["stages"]
    files = sorted({f for st in stages.values() for f in st.code_identity()["files"]})
    assert files and all(f.startswith("bertpipe/") for f in files)
    params_deps = dvc["params"]["deps"]
    assert params_deps[:1] == ["params.yaml"] and params_deps[-len(files):] == files
    assert len(params_deps) == len(set(params_deps))  # each source file once
    eff = effective_params(cfg)[CODE]
    assert set(eff) == {dvc_stage_name(n) for n in stages}
    for name, st in stages.items():
        entry = dvc[dvc_stage_name(name)]
        assert not [d for d in entry["deps"] if d.startswith("bertpipe/")], (name, entry["deps"])
        assert f"{CODE}.{dvc_stage_name(name)}" in entry["params"][0][EFFECTIVE], name
        assert eff[dvc_stage_name(name)] == st.code_identity()["digest"], name  # what the fingerprint holds
    # two stages of different code differ, so a code edit moves only the digests of the stages it is part of
    assert eff["vocab"] != eff["prepare"]


def test_an_installed_package_tracks_no_code(tmp_path, sample_raw):
    cfg = load_config(write_project(tmp_path, sample_raw))  # the code (this repo) is outside this project
    dvc = dvc_yaml(cfg)["stages"]
    assert dvc["params"]["deps"] == ["params.yaml"]
    assert CODE not in effective_params(cfg)
    assert not any(f"{CODE}." in k for st in dvc.values() for p in st.get("params", []) for k in p[EFFECTIVE])


def test_dvc_reads_the_params_file_with_its_json_loader():
    from dvc.utils.serialize import LOADERS, load_json
    from dvc_objects.fs.local import LocalFileSystem

    assert LOADERS[LocalFileSystem.suffix(EFFECTIVE)] is load_json
    assert LOADERS[LocalFileSystem.suffix(LEGACY_EFFECTIVE)] is not load_json  # why the file was renamed


def test_dvc_yaml_says_the_old_params_file_is_unused_and_keeps_it(tmp_path, monkeypatch, sample_raw):
    write_project(tmp_path, sample_raw)
    old = tmp_path / LEGACY_EFFECTIVE
    old.write_text("{}\n")
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(app, ["dvc-yaml", "--params", str(tmp_path / "params.yaml")])
    assert res.exit_code == 0, res.output
    assert f"`git rm {LEGACY_EFFECTIVE}`" in res.output and old.read_text() == "{}\n"
    assert json.loads((tmp_path / EFFECTIVE).read_text()) == effective_params(load_config(tmp_path / "params.yaml"))
