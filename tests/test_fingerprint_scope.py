"""A stage's fingerprint covers the code that computes its output and nothing else (bertpipe.codeid's rule).

Quick: a copy of the package in a temp dir is edited and the real demo graph's code digests and freshness are
recomputed against it; no stage runs. A "finished" project is simulated by writing each stage's manifest with the
fingerprint `bertpipe.freshness` expects, in graph order, so every stage starts fresh.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from bertpipe import codeid
from bertpipe.freshness import expected
from bertpipe.pipeline import all_stages, load_config, upstream

REPO = Path(__file__).resolve().parents[1]
PROBE = "\n\ndef _probe_added_by_a_test():\n    return 1\n"


def _clear() -> None:
    for f in (codeid.code_files, codeid.code_identity):  # (parses are cached by file text: edits are seen)
        f.cache_clear()


@pytest.fixture()
def checkout(tmp_path, monkeypatch):
    """A copy of bertpipe/ that codeid reads instead of the real one (the code of "another version")."""
    origin = tmp_path / "code"
    shutil.copytree(REPO / "bertpipe", origin / "bertpipe", ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(codeid, "ORIGIN", origin)
    monkeypatch.setattr(codeid, "PACKAGE", origin / "bertpipe")
    _clear()
    yield origin
    _clear()


@pytest.fixture()
def demo(tmp_path, sample_raw):
    """The demo params (repo params.yaml) in a temp project reading the real sample corpora."""
    proj = tmp_path / "proj"
    proj.mkdir()
    params = yaml.safe_load((REPO / "params.yaml").read_text(encoding="utf-8"))
    params["paths"]["raw"] = str(sample_raw)
    (proj / "params.yaml").write_text(yaml.safe_dump(params, allow_unicode=True), encoding="utf-8")
    shutil.copy(REPO / "profiles.yaml", proj / "profiles.yaml")
    cfg = load_config(proj / "params.yaml")
    return cfg, all_stages(cfg)


def digests(stages) -> dict[str, str]:
    _clear()
    return {n: st.code_identity()["digest"] for n, st in stages.items()}


def finish(cfg, stages) -> None:
    """Make every stage fresh: stub each input under a stage output, then write each output's manifest in graph
    order (what a finished run leaves, as far as freshness reads it)."""
    for name, st in stages.items():
        for p in st.inputs(cfg).values():
            if isinstance(p, str) and not Path(p).is_absolute() and not cfg.path(p).exists():
                continue  # a hub id
            p = cfg.path(p).resolve()
            if p.exists():
                continue
            if p.suffix:
                p.parent.mkdir(parents=True, exist_ok=True)
                p.write_text("stub")
            else:
                p.mkdir(parents=True)
            assert p.exists(), p
        fp = expected(cfg, stages, only=[name])[name]
        assert fp.state != "waiting", fp
        out = st.output(cfg)
        out.mkdir(parents=True, exist_ok=True)
        (out / "manifest.json").write_text(json.dumps({"fingerprint": fp.fingerprint,
                                                      "code": {"digest": st.code_identity()["digest"]}}))
    assert all(f.fresh for f in expected(cfg, stages).values())


def below(names: set[str], cfg, stages) -> set[str]:
    """``names`` and every stage that reads (transitively) from one of them."""
    found = set(names)
    for n in stages:  # graph order: an upstream is decided before its readers
        if set(upstream(n, cfg, stages)) & found:
            found.add(n)
    return found


def test_infrastructure_edits_move_no_stage_fingerprint(checkout, demo):
    cfg, stages = demo
    # the runner, tracking, config loading, the graph, the CLI, the output helpers, errors: never a stage's code
    assert {f"bertpipe/{m}.py" for m in ("stage", "outputs", "orphans", "errors", "tracking", "config", "pipeline",
                                         "freshness", "dvcfile", "cli", "codeid", "layout")} <= codeid.INFRASTRUCTURE
    before = digests(stages)
    assert len(set(before.values())) > 3  # stages do have different code
    for rel in sorted(codeid.INFRASTRUCTURE):
        f = checkout / rel
        assert f.is_file(), f"INFRASTRUCTURE names {rel}, which does not exist"
        text = f.read_text()
        f.write_text(text + PROBE)
        try:
            assert digests(stages) == before, f"appending a function to {rel} changed a stage's code digest"
        finally:
            f.write_text(text)
    # The probe does move a digest when it lands in domain code (so the loop above could fail).
    f = checkout / "bertpipe/corpusio.py"
    f.write_text(f.read_text() + PROBE)
    moved = {n for n, d in digests(stages).items() if d != before[n]}
    assert "vocab" in moved and "pretrain" in moved and "splits" not in moved, moved


def test_a_pretrain_training_edit_stales_base_pretrain_and_below_only(checkout, demo):
    cfg, stages = demo
    assert "base" in stages  # the demo profile bootstraps its base model
    finish(cfg, stages)
    f = checkout / "bertpipe/pretrain/train.py"
    f.write_text(f.read_text() + PROBE)
    _clear()
    states = expected(cfg, stages)
    stale = {n for n, s in states.items() if not s.fresh}
    assert stale == below({"base", "pretrain"}, cfg, stages), stale
    assert {"splits", "prepare"}.isdisjoint(stale)
    assert states["base"].reason == "code changed", states["base"]  # the others: "upstream ... stale"
    assert any(n.startswith("finetune/") and n.endswith("/base") for n in stale)  # below base: its finetunes


def test_a_training_library_edit_moves_the_code_of_the_stages_that_import_it(checkout, demo):
    """A module of a library below the stages (bertpipe/training/, bertpipe/inference/) is the code of every stage
    that imports it, and of no other: the one training loop is every training stage's, its task-model side finetune's
    and distill's, the scoring code also export's and register's, the speed measurement distill's and export's; the
    tasks stage's code holds none of them."""
    cfg, stages = demo
    assert any(n.startswith("distill/") for n in stages) and any(n.startswith("export/") for n in stages)
    before = digests(stages)
    cases = (("bertpipe/training/trainloop.py", ("base", "pretrain", "finetune/", "distill/"),
              ("splits", "prepare", "vocab", "export/", "register")),
             ("bertpipe/training/loop.py", ("finetune/", "distill/"), ("splits", "prepare", "export/", "register",
                                                                       "base", "pretrain")),
             ("bertpipe/training/predict.py", ("finetune/", "distill/", "export/", "register"), ("splits", "prepare")),
             ("bertpipe/inference/speed.py", ("distill/", "export/"), ("finetune/", "splits")))
    for rel, moves, stays in cases:
        f = checkout / rel
        text = f.read_text()
        f.write_text(text + PROBE)
        try:
            moved = {n for n, d in digests(stages).items() if d != before[n]}
        finally:
            f.write_text(text)
        for prefix in moves:
            assert any(n.startswith(prefix) for n in moved), (rel, prefix, moved)
        for prefix in stays:
            assert not any(n.startswith(prefix) for n in moved), (rel, prefix, moved)


def test_a_finetune_training_edit_leaves_the_data_stages_alone(checkout, demo):
    """The tasks stage materialises splits; the training loop is not part of its code."""
    cfg, stages = demo
    finish(cfg, stages)
    f = checkout / "bertpipe/training/loop.py"
    f.write_text(f.read_text() + PROBE)
    _clear()
    stale = {n for n, s in expected(cfg, stages).items() if not s.fresh}
    assert {"splits", "prepare", "base", "vocab", "pretrain"}.isdisjoint(stale), stale
    assert any(n.startswith("finetune/") for n in stale) and any(n.startswith("distill/") for n in stale)
    assert "evaluate" in stale
