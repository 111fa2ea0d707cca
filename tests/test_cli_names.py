"""Names that say one thing: `bertpipe schedule` is the cron deployment, `bertpipe models serve` the HTTP server
(no top-level `serve`). Quick: typer's runner, no Prefect started."""

from __future__ import annotations

from typer.testing import CliRunner

from bertpipe.doors.cli.commands import app


def test_schedule_is_the_cron_command_and_models_serve_the_http_server():
    runner = CliRunner()
    top = runner.invoke(app, ["--help"])
    assert top.exit_code == 0 and "schedule" in top.output
    sched = runner.invoke(app, ["schedule", "--help"])
    assert sched.exit_code == 0 and "cron" in sched.output and "--until" in sched.output
    assert runner.invoke(app, ["serve", "--help"]).exit_code != 0  # one name, one meaning
    http = runner.invoke(app, ["models", "serve", "--help"])
    assert http.exit_code == 0 and "HTTP" in http.output


def test_until_is_one_rule_for_every_door(tmp_path):
    (tmp_path / "params.yaml").write_text("paths: {work: w, state: s}\nmodel: {base: some/hub-id}\n"
                                          "finetune: {tasks: {}}\n")
    res = CliRunner().invoke(app, ["schedule", "--params", str(tmp_path / "params.yaml"), "--until", "nosuch"])
    assert res.exit_code == 2 and "--until 'nosuch': not a stage of this pipeline" in res.output
    from bertpipe.graph.pipeline import until_targets

    assert until_targets(["prepare", "finetune/a/base", "finetune/a/adapted", "evaluate"], "finetune") == [
        "finetune/a/base", "finetune/a/adapted"]
