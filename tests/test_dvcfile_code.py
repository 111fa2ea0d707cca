"""dvc.yaml tracks each stage's resolved params and code digest as one file it depends on (quick: no dvc run).

Each stage's DVC entry depends on ``params_effective/<stage>.json`` (its params sections, resolved, and the digest its
fingerprint holds) and names no DVC params, so `dvc exp show` shows params.yaml's keys and a column per dep, not
every resolved value. For a checkout (the bertpipe code lives in the project) the ``params`` stage, which writes those
files, depends on the code's folder; for an installed package on params.yaml alone. dvc.yaml is a function of the
config and the project's files: what work/ holds changes nothing. The external stages (start) have a dvc.yaml of
their own, stages/<name>/dvc.yaml, which --check compares too, with params_effective/.
"""

from __future__ import annotations

import json

import yaml

from typer.testing import CliRunner

from bertpipe.doors.cli.commands import app
from bertpipe.doors.dvc.dvcfile import (CODE, EFFECTIVE, HEADER, dvc_files, dvc_stage_name, dvc_yaml, effective_file,
                              effective_files, render_effective, render_files)
from bertpipe.graph.pipeline import all_stages, load_config
from tests.e2e_project import REPO, write_project


def test_each_stage_depends_on_its_own_effective_file_and_the_params_stage_on_the_code_folder(sample_raw):
    cfg = load_config(REPO / "params.yaml", overrides=[f"paths.raw={sample_raw}"])  # a checkout: code in the project
    stages = all_stages(cfg)
    dvc = dvc_yaml(cfg)["stages"]
    assert dvc["params"]["deps"] == ["params.yaml", "profiles.yaml", "bertpipe"]
    assert dvc["params"]["outs"] == [{EFFECTIVE: {"cache": False}}]
    eff = effective_files(cfg)
    assert set(eff) == {effective_file(n) for n in stages}
    for name, st in stages.items():
        entry = dvc[dvc_stage_name(name)]
        assert "params" not in entry and entry["deps"][-1] == effective_file(name), (name, entry)
        assert not [d for d in entry["deps"] if d.startswith("bertpipe")], (name, entry["deps"])
        assert eff[effective_file(name)][CODE] == st.code_identity()["digest"], name  # what the fingerprint holds
        assert set(eff[effective_file(name)]["params"]) == {s.split(".")[0] for s in st.sections}, name
    # two stages of different code differ, so a code edit moves only the files of the stages it is part of
    assert eff[effective_file("vocab")][CODE] != eff[effective_file("prepare")][CODE]
    assert eff[effective_file("prepare")]["params"]["prepare"] == cfg.section_shown("prepare")


def test_an_installed_package_tracks_no_code_folder_and_dvc_yaml_ignores_work(tmp_path, sample_raw):
    cfg = load_config(write_project(tmp_path, sample_raw))  # the code (this repo) is outside this project
    dvc = dvc_yaml(cfg)["stages"]
    assert dvc["params"]["deps"] == ["params.yaml"]
    assert all(CODE in d for d in effective_files(cfg).values())  # the digest of the code that runs, wherever
    before = render_files(cfg)
    for t in cfg.params.finetune.tasks:  # outputs appearing under work/ (a run) change nothing in dvc.yaml
        (cfg.work / "splits" / t).mkdir(parents=True)
    (cfg.work / "vocab").mkdir(parents=True)
    assert render_files(cfg) == before
    register = dvc["register"]["deps"]
    assert {f"work/splits/{t}" for t in cfg.params.finetune.tasks} <= set(register), register


def test_the_effective_files_are_written_and_those_of_stages_the_graph_lost_go(tmp_path, monkeypatch, sample_raw):
    write_project(tmp_path, sample_raw)
    monkeypatch.chdir(tmp_path)
    res = CliRunner().invoke(app, ["dvc-yaml", "--params", str(tmp_path / "params.yaml")])
    assert res.exit_code == 0, res.output
    cfg = load_config(tmp_path / "params.yaml")
    for rel, data in effective_files(cfg).items():
        assert json.loads((tmp_path / rel).read_text()) == data
    # a stage the graph no longer has: its file is out of date for --check and goes on the next write
    (tmp_path / EFFECTIVE / "gone.json").write_text("{}\n")
    stale = CliRunner().invoke(app, ["dvc-yaml", "--params", str(tmp_path / "params.yaml"), "--check"])
    assert stale.exit_code == 1 and f"{EFFECTIVE}/gone.json" in stale.output, stale.output
    res = CliRunner().invoke(app, ["dvc-yaml", "--params", str(tmp_path / "params.yaml"), "--effective"])
    assert res.exit_code == 0 and not (tmp_path / EFFECTIVE / "gone.json").exists(), res.output


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
    assert res.exit_code == 0 and "`git add stages/ params_effective/`" in res.output, res.output
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


def test_the_committed_generated_files_are_what_this_install_generates(tmp_path, sample_raw):
    """The repo's dvc.yaml, stages/*/dvc.yaml and params_effective/ (whose code digests include the libraries'
    versions) equal what this install generates: scripts/setup.sh installs requirements.lock, so a fresh install
    of the same commit rebuilds nothing. A project laid out as the repo (its params, its code, the sample data as
    data/raw), generated and compared file by file."""
    for name in ("params.yaml", "profiles.yaml"):
        (tmp_path / name).write_bytes((REPO / name).read_bytes())
    (tmp_path / "bertpipe").symlink_to(REPO / "bertpipe")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "raw").symlink_to(sample_raw)
    cfg = load_config(tmp_path / "params.yaml")
    generated = {**render_files(cfg), **render_effective(cfg)}
    committed = {p.relative_to(REPO).as_posix() for p in (REPO / EFFECTIVE).glob("*.json")}
    assert committed == {p for p in generated if p.startswith(f"{EFFECTIVE}/")}
    stale = [p for p, text in generated.items() if (REPO / p).read_text(encoding="utf-8") != text]
    assert not stale, f"{stale}: run `bertpipe dvc-yaml` (with the sample data in data/raw) and commit them"


def test_a_run_records_dvc_lock_only_with_the_settings_dvc_yaml_describes(tmp_path, monkeypatch, sample_raw):
    """What a run does with dvc.lock (bertpipe.doors.dvc.dvclock; the run that records it: test_pipeline_e2e): nothing
    outside a DVC repo; in one, a run whose --set moves a stage's resolved params leaves dvc.lock alone and says how to
    record it, since dvc.yaml and params_effective/ describe the params file, not that run. An input outside the project
    given as an absolute path stays absolute in dvc.yaml, so a moved project's dvc.yaml is current as it stands."""
    import subprocess

    from bertpipe.doors.dvc import dvclock

    cfg = load_config(write_project(tmp_path, sample_raw))
    monkeypatch.chdir(tmp_path)
    assert CliRunner().invoke(app, ["dvc-yaml"]).exit_code == 0
    assert dvclock.record(cfg, ["splits"]) is None  # no .dvc: not a DVC repo
    subprocess.run(["dvc", "init", "-q", "--no-scm"], cwd=tmp_path, check=True, capture_output=True)
    assert dvclock.out_of_date(cfg) == [] and dvclock.targets(cfg, ["splits", "start"]) == [
        "params", "splits", "stages/start/dvc.yaml:start"]
    line = dvclock.record(cfg.with_overrides(["prepare.dedup.threshold=0.8"]), ["splits", "prepare"])
    assert line.startswith("dvc.lock: left as it is: ") and "params_effective/prepare.json" in line, line
    assert not (tmp_path / "dvc.lock").exists()
    laws = str(sample_raw / "china_law" / "laws.db")  # params.yaml gives it absolute, outside the project
    assert laws in yaml.safe_load((tmp_path / "dvc.yaml").read_text())["stages"]["splits"]["deps"]


def test_dvc_yaml_says_which_stage_added_by_hand_it_drops(tmp_path, sample_raw):
    """dvc.yaml is generated whole: a stage the user added to it is gone after `bertpipe dvc-yaml`, and the command
    says which, and where such a stage belongs. A stage bertpipe itself wrote earlier is not the user's."""
    from tests.e2e_project import invoke

    write_project(tmp_path, sample_raw)
    assert invoke(["dvc-yaml"], tmp_path).returncode == 0
    d = yaml.safe_load((tmp_path / "dvc.yaml").read_text())
    d["stages"]["mine"] = {"cmd": "python report.py", "deps": ["work/evaluate"]}
    d["stages"]["tasks"] = {"cmd": "bertpipe tasks"}  # a stage an older bertpipe generated
    (tmp_path / "dvc.yaml").write_text(yaml.safe_dump(d, sort_keys=False))
    out = invoke(["dvc-yaml"], tmp_path)
    assert out.returncode == 0, out.stderr
    notes = [ln for ln in out.stdout.splitlines() if "dropped" in ln]
    assert len(notes) == 1 and notes[0].startswith("note: dropped the stage(s) mine that "), out.stdout
    assert {"mine", "tasks"}.isdisjoint(yaml.safe_load((tmp_path / "dvc.yaml").read_text())["stages"])
