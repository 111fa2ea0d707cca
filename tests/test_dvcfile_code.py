"""dvc.yaml tracks code as one params key per stage, and DVC reads the params file as JSON (quick: no dvc run).

For a checkout (the repo's own params.yaml: the bertpipe code lives in the project) the generated dvc.yaml lists
every stage's source files once, as the deps of the ``params`` stage, and no other stage lists a source file;
params_effective.json holds under ``code.<stage>`` the digest the stage's fingerprint holds, and each stage's
``params:`` names it. DVC picks a params file's loader from everything after the first dot of its name
(dvc_objects' ``fs.suffix``): the file's name must give the JSON loader, which the old name did not.
The external stages (start) have a dvc.yaml of their own, stages/<name>/dvc.yaml, which --check compares too.
"""

from __future__ import annotations

import json

from typer.testing import CliRunner

from bertpipe.cli import app
from bertpipe.config import load_config
from bertpipe.dvcfile import (CODE, EFFECTIVE, HEADER, LEGACY_EFFECTIVE, dvc_files, dvc_stage_name, dvc_yaml,
                              effective_params)
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


def test_the_external_stages_have_files_of_their_own_and_check_compares_every_file(tmp_path, monkeypatch, sample_raw):
    params = write_project(tmp_path, sample_raw)
    cfg = load_config(params)
    external = {dvc_stage_name(n) for n, st in all_stages(cfg).items() if st.external is not None}
    assert external == {"start"}  # the registry's stage: always_changed
    full, files = dvc_yaml(cfg), dvc_files(cfg)
    assert set(files) == {"dvc.yaml"} | {f"stages/{n}/dvc.yaml" for n in external}
    root = files["dvc.yaml"]
    assert set(root["stages"]) == set(full["stages"]) - external and root["metrics"] == full["metrics"]
    assert not any(st.get("always_changed") for st in root["stages"].values())
    for name in external:
        (entry,) = files[f"stages/{name}/dvc.yaml"]["stages"].items()
        # the same stage, run from the project root (its deps, outs and params file are the root file's paths)
        assert entry[0] == name and entry[1] == {"wdir": "../..", **full["stages"][name]}, entry

    monkeypatch.chdir(tmp_path)
    gen = ["dvc-yaml", "--params", str(params)]
    res = CliRunner().invoke(app, gen)
    assert res.exit_code == 0 and "`git add stages/`" in res.output, res.output
    sub = tmp_path / "stages" / "start" / "dvc.yaml"
    assert "dvc repro stages/start/dvc.yaml:start" in sub.read_text()  # the header says why, and how to run it
    assert CliRunner().invoke(app, [*gen, "--check"]).exit_code == 0
    sub.write_text(sub.read_text().replace("always_changed: true", "always_changed: false"))
    stale = CliRunner().invoke(app, [*gen, "--check"])
    assert stale.exit_code == 1 and "stages/start/dvc.yaml" in stale.output, stale.output
    sub.unlink()
    assert CliRunner().invoke(app, [*gen, "--check"]).exit_code == 1  # a missing sub-file is out of date too
    assert CliRunner().invoke(app, gen).exit_code == 0 and CliRunner().invoke(app, [*gen, "--check"]).exit_code == 0

    # a sub-file an earlier layout generated (its header) is out of date and goes; a user's own file stays
    (tmp_path / "stages" / "gone").mkdir()
    (tmp_path / "stages" / "gone" / "dvc.yaml").write_text(HEADER + "stages: {}\n")
    (tmp_path / "stages" / "mine").mkdir()
    (tmp_path / "stages" / "mine" / "dvc.yaml").write_text("stages: {}\n")
    stale = CliRunner().invoke(app, [*gen, "--check"])
    assert stale.exit_code == 1 and "stages/gone/dvc.yaml" in stale.output and "mine" not in stale.output
    res = CliRunner().invoke(app, gen)
    assert res.exit_code == 0 and not (tmp_path / "stages" / "gone" / "dvc.yaml").exists(), res.output
    assert (tmp_path / "stages" / "mine" / "dvc.yaml").read_text() == "stages: {}\n"


def test_a_start_entry_left_in_the_root_lock_is_said_and_kept(tmp_path, monkeypatch, sample_raw):
    params = write_project(tmp_path, sample_raw)
    lock = "schema: '2.0'\nstages:\n  params:\n    cmd: x\n  start:\n    cmd: bertpipe start\n"
    (tmp_path / "dvc.lock").write_text(lock)  # as the one-file layout left it
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(app, ["dvc-yaml", "--params", str(params)])
    assert res.exit_code == 0 and "dvc.lock still holds start" in res.output, res.output
    assert (tmp_path / "dvc.lock").read_text() == lock
    (tmp_path / "dvc.lock").write_text(lock.replace("  start:\n    cmd: bertpipe start\n", ""))
    res = CliRunner().invoke(app, ["dvc-yaml", "--params", str(params)])
    assert res.exit_code == 0 and "dvc.lock" not in res.output, res.output


def test_a_file_of_the_users_where_a_sub_file_goes_is_refused_and_kept(tmp_path, monkeypatch, sample_raw):
    params = write_project(tmp_path, sample_raw)
    mine = tmp_path / "stages" / "start" / "dvc.yaml"
    mine.parent.mkdir(parents=True)
    mine.write_text("stages: {}\n")
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(app, ["dvc-yaml", "--params", str(params)])
    assert res.exit_code == 2 and res.output.startswith("error: ") and str(mine) in res.output, res.output
    assert len(res.output.strip().splitlines()) == 1 and "Traceback" not in res.output
    assert mine.read_text() == "stages: {}\n" and not (tmp_path / "dvc.yaml").exists()  # nothing written
