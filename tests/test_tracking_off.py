"""``tracking.uri: none`` turns tracking off: the stage commands run in a process where MLflow and Prefect cannot be
imported (a machine without them), write their outputs and manifests, and leave no MLflow store; pretraining starts
from the base (no registry to read); what needs a store says so in one error line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import yaml
from typer.testing import CliRunner

from bertpipe.doors.cli.commands import app
from tests.synthetic import FILLER, KEYS, keyword_classification, tiny_encoder, write_jsonl

REPO = Path(__file__).resolve().parents[1]

# The stage commands, in one process in which `import mlflow` and `import prefect` fail as on a machine without them
# (None in sys.modules: importlib.util.find_spec answers None too, so no library probing for them finds them).
PROBE = """
import sys
for name in ("mlflow", "prefect"):
    sys.modules[name] = None
from bertpipe.doors.cli.commands import app
for argv in sys.argv[1:]:
    code = app(argv.split(), standalone_mode=False)  # a failed command returns its exit status
    if code:
        sys.exit(code)
"""


def project(root: Path) -> Path:
    """Tiny real things: a WordPiece tokenizer over the synthetic texts' characters, a 1-layer BERT as model.base,
    a domain corpus and a keyword classification task."""
    from transformers import BertTokenizerFast

    chars = list(dict.fromkeys(FILLER + list(KEYS.values()) + list("。.,")))
    special = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tok = BertTokenizerFast(vocab={w: i for i, w in enumerate(special + chars + [f"##{c}" for c in chars])})
    tok.save_pretrained(root / "tokenizer")
    enc = tiny_encoder(root / "base", root / "tokenizer", layers=1, hidden=32, positions=64)
    write_jsonl(root / "task.jsonl", keyword_classification(80, seed=1))
    write_jsonl(root / "domain.jsonl", [{"id": r["id"], "text": r["text"] * 3 + "。"}
                                        for r in keyword_classification(60, seed=2)])
    params = {
        "paths": {"raw": "raw"},
        "model": {"base": str(enc)},
        "tracking": {"uri": "none"},
        "prepare": {"domain": {"sources": [{"path": "domain.jsonl", "format": "jsonl", "id_field": "id"}]},
                    "general": {"enabled": False}},
        "finetune": {"encoders": ["base"],
                     "train": {"epochs": 1, "batch_size": 16, "max_seq_len": 32, "seeds": [1], "compile": "off"},
                     "search": {"trials": 0},
                     "tasks": {"keyword": {"type": "classification", "format": "jsonl", "train": "task.jsonl"}}},
    }
    (root / "params.yaml").write_text(yaml.safe_dump(params, allow_unicode=True), encoding="utf-8")
    return root


def test_stage_commands_run_without_mlflow_or_prefect(tmp_path):
    root = project(tmp_path / "p")
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1",
           "MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path / 'elsewhere.db'}"}
    proc = subprocess.run([sys.executable, "-c", PROBE, "splits", "prepare", "start", "finetune"], cwd=root, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    work = root / "work"
    outs = {"splits": work / "splits", "prepare": work / "prepare", "start": work / "start",
            "finetune/keyword/base": work / "finetune" / "keyword" / "base"}
    for name, out in outs.items():
        m = json.loads((out / "manifest.json").read_text())
        assert m["stage"] == name and m["mlflow_run_id"] is None, m
        assert f"{name:40s} built" in proc.stdout, proc.stdout
    assert (outs["finetune/keyword/base"] / "model" / "config.json").is_file()  # a real model was trained and saved
    assert json.loads((work / "start" / "start.json").read_text())["kind"] == "base"  # no registry to start from
    stores = [p for p in tmp_path.rglob("*") if p.name.endswith(".db") or p.name == "mlruns"]
    assert stores == [], stores  # neither the project's store nor $MLFLOW_TRACKING_URI's was created
    assert not (root / ".bertpipe" / "open-runs").exists()  # no run was opened, so none is marked open


def test_a_command_that_needs_a_store_says_tracking_is_off(tmp_path):
    root = tmp_path / "p"
    root.mkdir()
    (root / "params.yaml").write_text("tracking:\n  uri: none\n", encoding="utf-8")
    for argv in (["models", "list"], ["run", "--until", "splits"]):  # the registry; a flow's runs
        res = CliRunner().invoke(app, [*argv, "--params", str(root / "params.yaml")])
        lines = res.output.strip().splitlines()
        assert res.exit_code == 2, (argv, res.output)
        assert lines[-1].startswith("error: tracking.uri: 'none' turns tracking off, and this needs an MLflow store"), (
            argv, res.output)
        assert "Traceback" not in res.output
    assert not (root / ".bertpipe" / "mlflow.db").exists()
