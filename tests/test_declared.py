"""A stage is its package: a leaf stage added as one package (with its declare.py) and one entry in the graph's
list is in the graph, the CLI's commands, the params model and the import-linter contracts. Quick: no training."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from bertpipe.graph.pipeline import all_stages, load_config

REPO = Path(__file__).resolve().parents[1]

LEAF = {
    "__init__.py": '"""A toy leaf stage: counts the tasks the splits stage wrote."""\n',
    "params.py": (
        "from pydantic import BaseModel, ConfigDict\n\n\n"
        "class LeafParams(BaseModel):\n"
        "    model_config = ConfigDict(extra=\"forbid\")\n"
        "    greeting: str = \"hi\"\n"
    ),
    "stage.py": (
        "def build(ctx):\n"
        "    n = sum(1 for p in ctx.inputs[\"splits\"].iterdir() if p.is_dir())\n"
        "    (ctx.out / \"leaf.txt\").write_text(f\"{ctx.params.greeting} {n}\\n\")\n"
        "    return {\"tasks\": n}\n"
    ),
    "declare.py": (
        "from bertpipe.core.declared import Family\n"
        "from bertpipe.lib.layout import splits_dir\n"
        "from bertpipe.stages.leaf.params import LeafParams\n"
        "from bertpipe.core.stage import Stage, deferred\n\n"
        "VERSION = \"1\"\n\n\n"
        "def leaf_stage():\n"
        "    return Stage(\"leaf\", VERSION, (\"leaf\",), lambda c: {\"splits\": splits_dir(c)},\n"
        "                 lambda c: c.work / \"leaf\", deferred(\"bertpipe.stages.leaf.stage:build\"),\n"
        "                 code=(\"leaf\",))\n\n\n"
        "LEAF = Family(\"leaf\", \"Count the tasks (a toy leaf).\", lambda c: [leaf_stage()], params={\"leaf\": LeafParams})\n"
    ),
}

CHECK = r"""
import contextlib, sys
from pathlib import Path
from typer.testing import CliRunner
from bertpipe.core.stage import run_stage
from bertpipe.doors.cli.commands import app
from bertpipe.graph.contracts import render
from bertpipe.graph.pipeline import COMMANDS, all_stages, load_config, upstream
from bertpipe.graph.pipeline import all_stages, load_config
from bertpipe.infra.errors import BertpipeError

root = Path(sys.argv[1])
cfg = load_config(root / "params.yaml")
assert cfg.params.leaf.greeting == "hello", cfg.params.leaf
stages = all_stages(cfg)
assert list(stages)[-1] == "leaf" and upstream("leaf", cfg) == ["splits"], list(stages)
assert "leaf" in COMMANDS
assert "Count the tasks" in CliRunner().invoke(app, ["--help"]).output
independence = render().split('type = "independence"')[1].split("[[")[0]
assert '"bertpipe.stages.leaf",' in independence, independence
try:
    load_config(root / "params.yaml", overrides=["leaf.bogus=1"])
    raise SystemExit("an unknown key in the leaf's section was accepted")
except BertpipeError as e:
    assert "leaf.bogus: unknown key" in str(e), e
quiet = lambda *a: contextlib.nullcontext()
run_stage(stages["splits"], cfg, tracker_factory=quiet)
res = run_stage(stages["leaf"], cfg, tracker_factory=quiet)
print((res.out / "leaf.txt").read_text().strip())
"""


def test_a_leaf_stage_is_one_package_and_one_line_in_the_list(tmp_path):
    src = tmp_path / "src"
    shutil.copytree(REPO / "bertpipe", src / "bertpipe", ignore=shutil.ignore_patterns("__pycache__"))
    pkg = src / "bertpipe" / "stages" / "leaf"
    pkg.mkdir()
    for name, text in LEAF.items():
        (pkg / name).write_text(text, encoding="utf-8")
    graph = src / "bertpipe" / "graph" / "pipeline.py"
    text = graph.read_text(encoding="utf-8")
    # the one entry in the list (with the import that names it)
    text = text.replace("from bertpipe.stages.finetune.declare import FINETUNE\n",
                        "from bertpipe.stages.finetune.declare import FINETUNE\nfrom bertpipe.stages.leaf.declare import LEAF\n")
    text = text.replace("EVALUATE, REGISTER)", "EVALUATE, REGISTER, LEAF)")
    graph.write_text(text, encoding="utf-8")
    project = tmp_path / "project"
    project.mkdir()
    (project / "t.jsonl").write_text("".join(json.dumps({"id": str(i), "text": f"第{i}条评论，写得很好。" * 2,
                                                          "label": "ab"[i % 2]}) + "\n" for i in range(40)),
                                     encoding="utf-8")
    (project / "params.yaml").write_text(
        "paths: {work: work, state: state}\nleaf: {greeting: hello}\n"
        "finetune: {tasks: {t: {type: classification, format: jsonl, train: t.jsonl}}}\n", encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(src)}
    proc = subprocess.run([sys.executable, "-c", CHECK, str(project)], cwd=project, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    assert proc.stdout.strip().splitlines()[-1] == "hello 1", proc.stdout


def test_the_composed_params_travel_to_another_process(tmp_path):
    """A loaded config's params pickle (a Dask worker or child process receives them) as the graph's model."""
    import pickle

    from bertpipe.graph.pipeline import Params

    params = tmp_path / "params.yaml"
    params.write_text("paths: {work: w}\nfinetune: {tasks: {}}\nevaluate: {split: dev}\n", encoding="utf-8")
    back = pickle.loads(pickle.dumps(load_config(params).params))
    assert type(back) is Params and back.evaluate.split == "dev" and back.paths.work == "w"


HEAVY = ("torch", "transformers", "mlflow")

LIGHT_GRAPH = r"""
import json, sys
from pathlib import Path
from bertpipe.doors.dvc.dvcfile import effective_files
from bertpipe.graph.pipeline import all_stages, load_config

cfg = load_config(Path(sys.argv[1]) / "params.yaml")
assert "finetune/t/base" in all_stages(cfg) and effective_files(cfg)
print(json.dumps(sorted(m for m in sys.argv[2:] if m in sys.modules)))
"""

FRESH_RUN = r"""
import json, sys
from pathlib import Path
from bertpipe.core.stage import run_stage
from bertpipe.graph.pipeline import all_stages, load_config

cfg = load_config(Path(sys.argv[1]) / "params.yaml")
assert run_stage(all_stages(cfg)["finetune/t/base"], cfg).skipped
print(json.dumps(sorted(m for m in sys.argv[2:] if m in sys.modules)))
"""


def _imported(script: str, project: Path, *modules: str) -> list[str]:
    """Which of ``modules`` a fresh process running ``script`` in ``project`` has imported."""
    proc = subprocess.run([sys.executable, "-c", script, str(project), *modules], cwd=project, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_the_graph_and_a_fresh_stage_import_no_model_or_tracking_library(tmp_path):
    """Declaring the graph (`bertpipe stages`, dvc.yaml's params stage) and a stage command that finds its output
    fresh import none of torch, transformers, MLflow: those load only when a stage builds."""
    (tmp_path / "t.jsonl").write_text("".join(json.dumps({"id": str(i), "text": f"第{i}条评论，写得很好。" * 2,
                                                          "label": "ab"[i % 2]}) + "\n" for i in range(40)),
                                      encoding="utf-8")
    (tmp_path / "params.yaml").write_text(
        "paths: {work: work, state: state}\nmodel: {base: some/hub-id}\n"
        "finetune: {encoders: [base], tasks: {t: {type: classification, format: jsonl, train: t.jsonl}}}\n",
        encoding="utf-8")
    assert _imported(LIGHT_GRAPH, tmp_path, *HEAVY) == []

    from bertpipe.core.stage import NO_TRACKING, fingerprint, run_stage, write_json

    cfg = load_config(tmp_path / "params.yaml")
    stages = all_stages(cfg)
    run_stage(stages["splits"], cfg, tracker_factory=NO_TRACKING)
    # a finetune output whose manifest holds its current fingerprint (written, not trained: freshness is what counts)
    ft = stages["finetune/t/base"]
    out = ft.output(cfg)
    out.mkdir(parents=True)
    write_json(out / "manifest.json", {"stage": ft.name, "fingerprint": fingerprint(ft, cfg)[0]})
    assert _imported(FRESH_RUN, tmp_path, *HEAVY, "bertpipe.stages.finetune.stage") == []
