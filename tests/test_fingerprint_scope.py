"""A stage's fingerprint covers the code that computes its output and nothing else (bertpipe.core.codeid's rule).

Quick: a copy of the package in a temp dir is edited and the real demo graph's code digests and freshness are
recomputed against it; no stage runs. And no digest names a file that only tests or benches import (editing a test
fixture retrains nothing). A "finished" project is simulated by writing each stage's manifest with the
fingerprint `bertpipe.graph.freshness` expects, in graph order, so every stage starts fresh.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from bertpipe.core import codeid
from bertpipe.graph.freshness import plan
from bertpipe.graph.pipeline import all_stages, load_config, upstream

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
        fp = plan(cfg, stages, only=[name])[name]
        assert fp.state != "waiting", fp
        out = st.output(cfg)
        out.mkdir(parents=True, exist_ok=True)
        (out / "manifest.json").write_text(json.dumps({"fingerprint": fp.fingerprint,
                                                      "code": {"digest": st.code_identity()["digest"]}}))
    assert all(f.fresh for f in plan(cfg, stages).values())


def below(names: set[str], cfg, stages) -> set[str]:
    """``names`` and every stage that reads (transitively) from one of them."""
    found = set(names)
    for n in stages:  # graph order: an upstream is decided before its readers
        if set(upstream(n, cfg, stages)) & found:
            found.add(n)
    return found


def test_undigested_module_edits_move_no_stage_fingerprint(checkout, demo):
    cfg, stages = demo
    # the runner, tracking, config loading, the graph, the CLI, the output helpers, errors: never a stage's code
    assert {f"bertpipe/{m}.py" for m in ("core/stage", "core/outputs", "infra/orphans", "infra/errors", "infra/tracking",
                                         "infra/config", "graph/pipeline", "graph/freshness", "doors/dvc/dvcfile",
                                         "doors/cli/commands", "core/codeid", "lib/layout")} <= codeid.UNDIGESTED
    before = digests(stages)
    assert len(set(before.values())) > 3  # stages do have different code
    for rel in sorted(codeid.UNDIGESTED):
        f = checkout / rel
        assert f.is_file(), f"UNDIGESTED names {rel}, which does not exist"
        text = f.read_text()
        f.write_text(text + PROBE)
        try:
            assert digests(stages) == before, f"appending a function to {rel} changed a stage's code digest"
        finally:
            f.write_text(text)
    # The probe does move a digest when it lands in domain code (so the loop above could fail).
    f = checkout / "bertpipe/lib/corpusio.py"
    f.write_text(f.read_text() + PROBE)
    moved = {n for n, d in digests(stages).items() if d != before[n]}
    assert "vocab" in moved and "pretrain" in moved and "splits" not in moved, moved


def test_a_pretrain_training_edit_stales_base_pretrain_and_below_only(checkout, demo):
    cfg, stages = demo
    assert "base" in stages  # the demo profile bootstraps its base model
    finish(cfg, stages)
    f = checkout / "bertpipe/lib/mlm/train.py"
    f.write_text(f.read_text() + PROBE)
    _clear()
    states = plan(cfg, stages)
    stale = {n for n, s in states.items() if not s.fresh}
    assert stale == below({"base", "pretrain"}, cfg, stages), stale
    assert {"splits", "prepare"}.isdisjoint(stale)
    assert states["base"].reason == "code changed", states["base"]  # the others: "upstream ... stale"
    assert any(n.startswith("finetune/") and n.endswith("/base") for n in stale)  # below base: its finetunes


def test_a_training_library_edit_moves_the_code_of_the_stages_that_import_it(checkout, demo):
    """A module of a library below the stages (bertpipe/lib/training/, bertpipe/lib/inference/) is the code of every
    stage that imports it, and of no other: the one training loop is every training stage's, its task-model side
    finetune's and distill's, the scoring code also export's and register's, the speed measurement distill's and
    export's; the tasks stage's code holds none of them."""
    cfg, stages = demo
    assert any(n.startswith("distill/") for n in stages) and any(n.startswith("export/") for n in stages)
    before = digests(stages)
    cases = (("bertpipe/lib/training/trainloop.py", ("base", "pretrain", "finetune/", "distill/"),
              ("splits", "prepare", "vocab", "export/", "register")),
             ("bertpipe/lib/training/loop.py", ("finetune/", "distill/"), ("splits", "prepare", "export/", "register",
                                                                       "base", "pretrain")),
             ("bertpipe/lib/training/predict.py", ("finetune/", "distill/", "export/", "register"), ("splits", "prepare")),
             ("bertpipe/lib/inference/speed.py", ("distill/", "export/"), ("finetune/", "splits")))
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
    f = checkout / "bertpipe/lib/training/loop.py"
    f.write_text(f.read_text() + PROBE)
    _clear()
    stale = {n for n, s in plan(cfg, stages).items() if not s.fresh}
    assert {"splits", "prepare", "base", "vocab", "pretrain"}.isdisjoint(stale), stale
    assert any(n.startswith("finetune/") for n in stale) and any(n.startswith("distill/") for n in stale)
    assert "evaluate" in stale


def _production_files(stages) -> set[str]:
    """What the doors run, by the import graph (codeid's parser, undigested modules followed too): the CLI, the Prefect
    door (flows/, tasks/) and every stage's build, external and launcher, with what they import, transitively."""
    roots = [REPO / "bertpipe" / "doors" / "cli" / "commands.py"]
    roots += [f for door in ("flows", "tasks") for f in sorted((REPO / door).glob("*.py"))]
    for st in stages.values():
        for fn in (st.build, st.external, st.launcher):
            if fn is not None:
                module = fn.target.partition(":")[0] if hasattr(fn, "target") else fn.__module__
                roots.append(codeid._module_file(module))
    seen: set[str] = set()
    while roots:
        f = roots.pop().resolve()
        rel = f.relative_to(codeid.ORIGIN).as_posix()
        if rel in seen:
            continue
        seen.add(rel)
        for mod in codeid._parse(rel, f.read_text(encoding="utf-8"))[1]:
            parts = mod.split(".")  # importing bertpipe.a.b runs bertpipe/a/__init__.py too
            roots += [m for i in range(1, len(parts) + 1) if (m := codeid._module_file(".".join(parts[:i])))]
    return seen


def test_no_stage_digest_names_a_file_only_tests_or_benches_import(tmp_path):
    """A stage's code is its packages' modules and their imports: a test fixture kept in a stage package would be
    part of every digest of that stage, so editing it would rebuild every output, though no door ever runs it."""
    shutil.copy(REPO / "params.yaml", tmp_path / "params.yaml")
    shutil.copy(REPO / "profiles.yaml", tmp_path / "profiles.yaml")
    cfg = load_config(tmp_path / "params.yaml", overrides=["finetune.encoders=[base,adapted,tapt]"])
    stages = all_stages(cfg)
    assert {"tapt", "distill", "export", "register"} <= {st.family for st in stages.values()}
    production = _production_files(stages)
    assert "bertpipe/stages/finetune/stage.py" in production and "bertpipe/lib/training/loop.py" in production
    for name, st in stages.items():
        extra = set(st.code_identity()["files"]) - production
        assert not extra, f"{name}'s code digest names {sorted(extra)}, which no door imports"


def test_code_digests_from_many_threads_at_once_are_the_ones_computed_alone(checkout):
    """The flow computes its stages' cache keys in its worker threads at once. CPython 3.11's ``ast.parse`` is not
    safe from two threads: its AST conversion keeps one recursion depth per interpreter, and a thread switch inside
    it (a garbage collection runs Python code) ends in "SystemError: AST constructor recursion depth mismatch". A gc
    callback that yields the GIL puts that switch in every collection; every file gets a comment of its own, so each
    is parsed anew (the digest is of the syntax tree: the comments change none)."""
    import gc
    import threading
    import time
    import uuid

    for f in (checkout / "bertpipe").rglob("*.py"):
        f.write_text(f.read_text() + f"\n# {uuid.uuid4().hex}\n")
    packages = sorted(p.name for p in (checkout / "bertpipe" / "stages").iterdir() if (p / "declare.py").is_file())
    assert len(packages) >= 8, packages
    got, errors = {}, []

    def digest(pkg: str) -> None:
        try:
            got[pkg] = codeid.code_identity((pkg,), ())["digest"]
        except Exception as e:  # noqa: BLE001 - the error is the finding
            errors.append(f"{pkg}: {e!r}")

    def switch(_phase, _info) -> None:
        time.sleep(0)

    threshold = gc.get_threshold()
    gc.set_threshold(100)
    gc.callbacks.append(switch)
    try:
        threads = [threading.Thread(target=digest, args=(p,)) for p in packages]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        gc.callbacks.remove(switch)
        gc.set_threshold(*threshold)
    assert not errors, errors
    _clear()
    assert got == {p: codeid.code_identity((p,), ())["digest"] for p in packages}
