"""The CLI's script-facing flags: --version, --json for stages and models list/show (a real MLflow sqlite store),
`stages --check` exiting 1 while anything is stale, and typer's shell completion."""

from __future__ import annotations

import json

from typer.testing import CliRunner

import bertpipe
from bertpipe.doors.cli.commands import app

runner = CliRunner()


def test_version():
    res = runner.invoke(app, ["--version"])
    assert res.exit_code == 0 and res.output.strip() == f"bertpipe {bertpipe.__version__}"


def test_completion_is_offered():
    res = runner.invoke(app, ["--help"])
    assert "--install-completion" in res.output and "--show-completion" in res.output


def _project(tmp_path, extra: str = "") -> str:
    (tmp_path / "corpus.txt").write_text("一段文字\n另一段文字\n", encoding="utf-8")
    (tmp_path / "train.jsonl").write_text('{"text": "好", "label": "a"}\n', encoding="utf-8")
    p = tmp_path / "params.yaml"
    p.write_text(
        "paths: {work: work, state: state}\nmodel: {base: enc}\n"
        "prepare: {domain: {sources: [{path: corpus.txt, format: txt}]}, general: {enabled: false}}\n"
        "finetune: {encoders: [base], tasks: {t: {type: classification, format: jsonl, train: train.jsonl}}}\n"
        + extra, encoding="utf-8")
    return str(p)


def test_stages_json_matches_the_table_and_check_fails_while_stale(tmp_path):
    params = _project(tmp_path)
    table = runner.invoke(app, ["stages", "--params", params])
    assert table.exit_code == 0, table.output
    res = runner.invoke(app, ["stages", "--params", params, "--json", "--check"])
    assert res.exit_code == 1, res.output  # nothing is built yet
    rows = json.loads(res.output)
    assert [r["stage"] for r in rows] == [ln.split()[0] for ln in table.output.splitlines()]
    assert rows[0] == {"stage": "splits", "state": "stale", "fingerprint": rows[0]["fingerprint"],
                       "reason": "no output"}
    assert rows[0]["fingerprint"][:12] in table.output.splitlines()[0]


def test_stages_check_passes_when_every_stage_is_fresh(tmp_path, monkeypatch):
    # Building every stage of a project takes minutes; the exit status depends only on the freshness rows.
    from bertpipe.graph import freshness

    params = _project(tmp_path)
    real = freshness.plan
    monkeypatch.setattr(freshness, "plan",
                        lambda cfg: {n: freshness.Freshness(n, "fresh", f.fingerprint) for n, f in real(cfg).items()})
    res = runner.invoke(app, ["stages", "--params", params, "--check"])
    assert res.exit_code == 0, res.output


def test_models_list_and_show_json(tmp_path):
    from mlflow.tracking import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    c = MlflowClient(tracking_uri=uri, registry_uri=uri)
    c.create_registered_model("bertpipe-t")
    for _ in range(2):
        c.create_model_version("bertpipe-t", source=str(tmp_path), tags={"bertpipe.primary_metric": "macro_f1",
                                                                         "bertpipe.primary_value": "0.5"})
    c.set_registered_model_alias("bertpipe-t", "champion", "2")
    params = _project(tmp_path, f"tracking: {{uri: '{uri}'}}\n")
    res = runner.invoke(app, ["models", "list", "--params", params, "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output) == [{"name": "bertpipe-t", "latest": 2, "aliases": {"champion": 2}}]
    res = runner.invoke(app, ["models", "show", "bertpipe-t", "--params", params, "--json"])
    rows = json.loads(res.output)
    assert [(r["version"], r["aliases"], r["value"]) for r in rows] == [("1", [], "0.5"), ("2", ["champion"], "0.5")]
