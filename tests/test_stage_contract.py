"""The stage contract: fingerprint, skip, atomic output, crash safety, concurrency, MLflow logging."""

from __future__ import annotations

import contextlib
import json
import threading
import time
from pathlib import Path

import pytest

from bertpipe.core.stage import Stage, is_fresh, read_manifest, run_stage
from bertpipe.graph.pipeline import load_config
from bertpipe.infra.errors import BertpipeError

NO_TRACKING = lambda *a: contextlib.nullcontext()  # noqa: E731


@pytest.fixture
def project(tmp_path: Path):
    (tmp_path / "in.txt").write_text("hello\n")
    (tmp_path / "params.yaml").write_text("paths: {work: w, state: s}\nmodel: {base: some/hub-id}\n")
    return tmp_path


def counting_stage(calls: list, fail: bool = False, slow: float = 0.0) -> Stage:
    def build(ctx):
        calls.append(ctx.fingerprint)
        (ctx.out / "copy.txt").write_text(Path(ctx.inputs["text"]).read_text().upper())
        time.sleep(slow)
        if fail:
            (ctx.out / "partial.bin").write_bytes(b"x" * 10)
            raise RuntimeError("boom")
        ctx.counts["chars"] = 5
        return {"chars": 5}

    return Stage(
        "toy", "1", ("model",), lambda c: {"text": c.root / "in.txt"}, lambda c: c.work / "toy", build
    )


def test_second_run_skips_and_input_change_rebuilds(project):
    cfg = load_config(project / "params.yaml")
    calls: list = []
    st = counting_stage(calls)
    r1 = run_stage(st, cfg, tracker_factory=NO_TRACKING)
    r2 = run_stage(st, cfg, tracker_factory=NO_TRACKING)
    assert not r1.skipped and r2.skipped and len(calls) == 1
    assert (r1.out / "copy.txt").read_text() == "HELLO\n"
    m = read_manifest(r1.out)
    assert m["fingerprint"] == r1.fingerprint and m["counts"] == {"chars": 5} and "torch" in m["versions"]
    (project / "in.txt").write_text("hello again\n")
    assert not is_fresh(st, cfg)[0]
    r3 = run_stage(st, cfg, tracker_factory=NO_TRACKING)
    assert not r3.skipped and r3.fingerprint != r1.fingerprint and len(calls) == 2


def test_same_size_rewrite_with_restored_mtime_rebuilds(project):
    """A rewrite of the same size whose mtime is set back (touch -r, a copy tool keeping times) changes the input:
    the hash cache must not serve the old digest."""
    import os

    cfg = load_config(project / "params.yaml")
    calls: list = []
    st = counting_stage(calls)
    f = project / "in.txt"
    old = f.stat()
    r1 = run_stage(st, cfg, tracker_factory=NO_TRACKING)
    f.write_text("jello\n")  # same size
    os.utime(f, ns=(old.st_atime_ns, old.st_mtime_ns))
    assert (f.stat().st_size, f.stat().st_mtime_ns) == (old.st_size, old.st_mtime_ns)
    assert not is_fresh(st, cfg)[0]
    r2 = run_stage(st, cfg, tracker_factory=NO_TRACKING)
    assert not r2.skipped and (r2.out / "copy.txt").read_text() == "JELLO\n" and len(calls) == 2
    assert run_stage(st, cfg, tracker_factory=NO_TRACKING).skipped


def test_params_and_version_change_the_fingerprint(project):
    cfg = load_config(project / "params.yaml")
    st = counting_stage([])
    fp = is_fresh(st, cfg)[1]
    assert is_fresh(st, cfg.with_overrides(["model.language=en"]))[1] != fp
    st.version = "2"
    assert is_fresh(st, cfg)[1] != fp
    # A section the stage does not declare does not touch its fingerprint.
    st.version = "1"
    assert is_fresh(st, cfg.with_overrides(["tracking.experiment=other"]))[1] == fp


def test_crash_leaves_no_output_and_keeps_the_previous_one(project):
    cfg = load_config(project / "params.yaml")
    good = run_stage(counting_stage([]), cfg, tracker_factory=NO_TRACKING)
    (project / "in.txt").write_text("changed\n")
    with pytest.raises(RuntimeError, match="boom"):
        run_stage(counting_stage([], fail=True), cfg, tracker_factory=NO_TRACKING)
    # The old complete output is untouched, and no temp dir is left beside it.
    assert read_manifest(good.out)["fingerprint"] == good.fingerprint
    assert not (good.out / "partial.bin").exists()
    assert [p.name for p in good.out.parent.iterdir() if ".tmp-" in p.name] == []


def test_missing_input_is_a_one_line_error(project):
    cfg = load_config(project / "params.yaml")
    (project / "in.txt").unlink()
    with pytest.raises(BertpipeError, match="in.txt does not exist"):
        run_stage(counting_stage([]), cfg, tracker_factory=NO_TRACKING)
    assert not (cfg.work / "toy").exists()


def test_concurrent_runs_build_once(project):
    cfg = load_config(project / "params.yaml")
    calls: list = []
    st = counting_stage(calls, slow=0.5)
    results = []
    threads = [threading.Thread(target=lambda: results.append(run_stage(st, cfg, tracker_factory=NO_TRACKING)))
               for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and sorted(r.skipped for r in results) == [False, True]


def test_mlflow_sqlite_store_holds_the_run(project):
    from mlflow.tracking import MlflowClient

    cfg = load_config(project / "params.yaml")
    res = run_stage(counting_stage([]), cfg)  # the default tracker: embedded sqlite under paths.state
    client = MlflowClient(tracking_uri=(uri := f"sqlite:///{cfg.state / 'mlflow.db'}"), registry_uri=uri)
    run = client.get_run(res.run_id)
    assert run.info.status == "FINISHED"
    assert run.data.metrics["chars"] == 5
    assert run.data.tags["bertpipe.fingerprint"] == res.fingerprint
    assert run.data.params["model.base"] == "some/hub-id"
    arts = [a.path for a in client.list_artifacts(res.run_id)]
    assert "manifest.json" in arts
    local = Path(client.download_artifacts(res.run_id, "manifest.json", str(project)))
    assert json.loads(local.read_text())["fingerprint"] == res.fingerprint


def test_fluent_mlflow_leaves_no_registry_behind(project, tmp_path):
    """Registering in one project must not point a later client of another project at the first one's registry:
    mlflow's set_registry_uri is a process global that a plain MlflowClient(tracking_uri=...) falls back to."""
    import os

    from mlflow.tracking import MlflowClient

    from bertpipe.infra.tracking import fluent_mlflow

    cfg = load_config(project / "params.yaml")
    with fluent_mlflow(cfg) as mlflow:
        mlflow.MlflowClient().create_registered_model("only-in-the-first-project")
    other = f"sqlite:///{tmp_path / 'other.db'}"
    names = [m.name for m in MlflowClient(tracking_uri=other).search_registered_models()]
    assert names == []
    assert "MLFLOW_TRACKING_URI" not in os.environ and "MLFLOW_REGISTRY_URI" not in os.environ


def test_a_stage_writing_outside_its_places_is_caught(project):
    """The stage contract's places (tests/stage_writes.py holds every stage of the e2e chain to them): a toy stage
    writing into a store it does not declare, into another stage's output or beside the outputs is named; writing
    its output and the store it declares is not."""
    from tests.stage_writes import snapshot, undeclared_writes

    cfg = load_config(project / "params.yaml")
    other = Stage("other", "1", ("model",), lambda c: {}, lambda c: c.work / "other", lambda ctx: None,
                  stores=("tokstore",))

    def toy(version: str, stores: tuple[str, ...], extra: str = "") -> Stage:
        def build(ctx):
            (ctx.out / "out.txt").write_text("mine")
            (ctx.cfg.state / "tokstore").mkdir(parents=True, exist_ok=True)
            (ctx.cfg.state / "tokstore" / "k.bin").write_bytes(b"derived")
            if extra:
                (ctx.cfg.root / extra).parent.mkdir(parents=True, exist_ok=True)
                (ctx.cfg.root / extra).write_text("not mine to write")

        return Stage("toy", version, ("model",), lambda c: {}, lambda c: c.work / "toy", build, stores=stores)

    for st, expected in ((toy("1", ("tokstore",)), []),
                         (toy("2", ()), ["k.bin: in the 'tokstore' stores, written while toy built"]),
                         (toy("3", ("tokstore",), "w/other/x.txt"), ["x.txt: in other's output, written while toy"]),
                         (toy("4", ("tokstore",), "stray.txt"), ["stray.txt: written outside every stage's output"])):
        since, before = time.time(), snapshot(project)
        run_stage(st, cfg, tracker_factory=NO_TRACKING)
        found = undeclared_writes(cfg, {"toy": st, "other": other}, before, snapshot(project), since)
        assert len(found) == len(expected) and all(e in f for e, f in zip(expected, found)), (st.version, found)
