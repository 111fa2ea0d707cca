"""A code change makes exactly the stage it belongs to, and what depends on it, stale — for every front door.

A temp project holds a copy of the code (bertpipe/, tasks/, flows/: a "checkout"), and everything runs with that copy
on PYTHONPATH. `dvc repro` builds tasks, prepare, vocab, pretrain and a base-encoder finetune for real (tiny). Then
a code line is appended to the copy's bertpipe/vocab/extend.py, which only the vocab stage imports, and:

- `bertpipe stages`: vocab and the built stages below it turn stale; the other built stages stay fresh;
- the Prefect cache keys (the expected fingerprints) change for vocab and every stage below it in the graph, built
  or not, and for no other stage;
- `dvc status` (real DVC; the generated dvc.yaml lists the source files once, as deps of the `params` stage, which
  writes each stage's code digest into params_effective.json) reports `params` changed and no other stage; after
  `dvc repro params` it reports vocab and no other stage (DVC reruns what is below at `dvc repro` time, once vocab's
  output changes). A comment edit (the digest is of the syntax tree) leaves every stage but `params` unchanged.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.e2e_project import REPO, env_for, write_project

PROBE = "bertpipe/vocab/extend.py"
KEYS = """
import json
from bertpipe.config import load_config
from bertpipe.freshness import expected
from bertpipe.pipeline import all_stages
from bertpipe_prefect.tasks.stages import cache_key
cfg = load_config("params.yaml")
stages = all_stages(cfg)
print(json.dumps({n: cache_key(stages[n], f.fingerprint) for n, f in expected(cfg, stages).items()}))
"""


def clone_code(root: Path) -> None:
    for d in ("bertpipe", "tasks", "flows"):
        shutil.copytree(REPO / d, root / d, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    shutil.copytree(REPO / "bertpipe_prefect", root / "bertpipe_prefect", symlinks=True)  # -> the copy's flows/, tasks/


def sh(cmd: list[str], root: Path, timeout: int = 600) -> str:
    env = env_for(root)
    env["PYTHONPATH"] = str(root)  # the copy's code, not the repo's
    proc = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{cmd} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    return proc.stdout


def look(root: Path) -> tuple[dict, dict, set]:
    """(`bertpipe stages` states, Prefect cache keys, stages `dvc status` reports)."""
    states = {ln.split()[0]: ln.split()[1] for ln in sh(["bertpipe", "stages"], root).splitlines() if ln.strip()}
    keys = json.loads(sh(["python", "-c", KEYS], root).strip().splitlines()[-1])
    return states, keys, dvc_status(root)


def dvc_status(root: Path) -> set:
    return set(json.loads(sh(["dvc", "status", "--json"], root) or "{}"))


@pytest.mark.slow
def test_a_code_change_stales_its_stage_and_dependants_only(tmp_path, sample_raw, zh_tokenizer_dir):
    from bertpipe.config import load_config
    from bertpipe.finetune.synthetic import tiny_encoder
    from bertpipe.pipeline import all_stages, upstream

    root = tmp_path / "proj"
    root.mkdir()
    clone_code(root)
    tiny_encoder(root / "enc", zh_tokenizer_dir, layers=1, hidden=32)
    write_project(root, sample_raw, {
        "model": {"base": "enc", "tokenizer": ""},
        "vocab": {"top_k": 50, "min_freq": 5, "head_fit_steps": 0, "eval_texts": 8},
        "pretrain": {"max_seq_len": 32, "max_steps": 2, "batch_size": 4, "eval_every": 2, "save_every": 2,
                     "eval_examples": 8, "log_every": 1, "fill_mask_samples": 1, "threads": 1},
        "finetune": {"encoders": ["base", "adapted"],
                     "train": {"epochs": 1, "seeds": [1], "max_seq_len": 32, "batch_size": 4},
                     "tasks": {"sentiment": {"type": "classification", "format": "jsonl",
                                             "train": "sentiment.jsonl"}}},
    })
    (root / "sentiment.jsonl").write_text("".join(
        json.dumps({"text": t, "label": lab}, ensure_ascii=False) + "\n"
        for t, lab in [("很好", "pos"), ("太差", "neg"), ("不错", "pos"), ("糟糕", "neg")] * 3), encoding="utf-8")
    sh(["python", "-c", "import bertpipe, sys; assert bertpipe.__file__.startswith(sys.argv[1]), bertpipe.__file__",
        str(root)], root)
    sh(["git", "init", "-q"], root)
    sh(["dvc", "init", "-q"], root)
    sh(["bertpipe", "dvc-yaml"], root)
    dvc_yaml = yaml.safe_load((root / "dvc.yaml").read_text())["stages"]
    assert PROBE in dvc_yaml["params"]["deps"] and PROBE not in dvc_yaml["vocab"]["deps"], dvc_yaml
    assert "code.vocab" in dvc_yaml["vocab"]["params"][0]["params_effective.json"], dvc_yaml["vocab"]
    sh(["dvc", "repro", "pretrain", "finetune_sentiment_base"], root, timeout=900)
    built = {"tasks", "prepare", "start", "vocab", "pretrain", "finetune/sentiment/base"}

    states0, keys0, dvc0 = look(root)
    assert {n for n, s in states0.items() if s == "fresh"} == built, states0
    # (start is always_changed: DVC reports it changed every time, as it asks the registry every repro)
    assert not dvc0 & {n.replace("/", "_") for n in built - {"start"}}, dvc0
    manifest = json.loads((root / "work" / "vocab" / "manifest.json").read_text())
    assert PROBE in manifest["code"]["files"] and "torch" in manifest["code"]["libs"]

    with open(root / PROBE, "a", encoding="utf-8") as f:
        f.write("\n# a comment moves no code digest\n")
    assert dvc_status(root) - dvc0 == {"params"}
    sh(["dvc", "repro", "params"], root)
    assert dvc_status(root) - dvc0 == set()

    with open(root / PROBE, "a", encoding="utf-8") as f:
        f.write("\nCODE_STALENESS_PROBE = 1\n")
    states1, keys1, dvc1 = look(root)

    cfg = load_config(root / "params.yaml")
    stages = all_stages(cfg)
    below = {"vocab"}
    for name in stages:  # graph order: a stage is below vocab when one of its upstream stages is
        if set(upstream(name, cfg, stages)) & below:
            below.add(name)
    assert {"pretrain", "finetune/sentiment/adapted", "evaluate", "register"} <= below
    assert "finetune/sentiment/base" not in below and "prepare" not in below

    turned_stale = {n for n in built if states1[n] == "stale"}
    assert turned_stale == built & below == {"vocab", "pretrain"}, states1
    assert {n for n in built if states1[n] == "fresh"} == built - below
    assert set(keys0) == set(keys1) == set(stages)
    assert {n for n in stages if keys0[n] != keys1[n]} == below, (keys0, keys1)
    # DVC learns which stages the edit touches when the params stage reruns (it writes the code digests)
    assert dvc1 - dvc0 == {"params"}, (dvc0, dvc1)
    sh(["dvc", "repro", "params"], root)
    assert dvc_status(root) - dvc0 == {"vocab"}
