"""Hyperparameters chosen on dev, degenerate runs never scored, class weights: the finetune stage on a tiny real
encoder trained for real steps, and the rules it applies."""

from __future__ import annotations

import contextlib
import json

import pytest
import torch

from bertpipe.graph.pipeline import load_config
from tests import synthetic as S
from bertpipe.core.stage import fingerprint, run_stage
from bertpipe.lib.measures import metrics as M
from bertpipe.lib.training import degenerate as D
from bertpipe.lib.training import imbalance as I
from bertpipe.stages.finetune.declare import finetune_stage
from bertpipe.stages.register.gate import Floor, degenerate_reason, judge
from bertpipe.stages.splits.declare import splits_stage

torch.set_num_threads(1)
NO_TRACKING = lambda *a, **k: contextlib.nullcontext()  # noqa: E731

# lr 1e-2 teaches the 1-layer, 32-wide encoder the keyword task in 90 steps; 1e-6 leaves it where it started,
# predicting one class for every example.
TRAIN = "{epochs: 6, batch_size: 8, max_seq_len: 48, seeds: [1], early_stopping: {patience: 0}}"


def test_a_constant_predictor_is_degenerate_and_a_learner_is_not():
    gold = ["pos", "neg", "mid"] * 20
    labels = ["pos", "neg", "mid"]
    majority = D.majority_score("classification", ["pos"] * 5 + ["neg"] * 3, gold, labels)
    const = [{"pred": "pos"} for _ in gold]
    flat, _ = M.classification_metrics(gold, [r["pred"] for r in const], labels)
    assert flat["macro_f1"] == pytest.approx(majority)
    assert D.reason("classification", "macro_f1", flat, const, majority) == "predicts one class ('pos') for all 60 " \
                                                                            "examples"
    # two classes predicted, but no better than answering the majority class
    weak = [{"pred": "mid" if i == 0 else "pos"} for i in range(len(gold))]  # gold[0] is 'pos'
    flat, _ = M.classification_metrics(gold, [r["pred"] for r in weak], labels)
    assert flat["macro_f1"] <= majority and "does not beat the majority baseline" in D.reason(
        "classification", "macro_f1", flat, weak, majority)
    good = [{"pred": g if i % 5 else "pos"} for i, g in enumerate(gold)]
    flat, _ = M.classification_metrics(gold, [r["pred"] for r in good], labels)
    assert D.reason("classification", "macro_f1", flat, good, majority) is None
    assert D.reason("ner", "f1", {"f1": 0.0}, [{"pred": []}] * 4, 0.0) == "predicts no entity in 4 examples"
    assert D.reason("ner", "f1", {"f1": 0.4}, [{"pred": [[0, 2, "LOC", "北京"]]}], 0.0) is None


def test_a_degenerate_model_is_never_crowned_whatever_the_floor():
    assert degenerate_reason({"degenerate": False}) is None
    why = degenerate_reason({"degenerate": True, "degenerate_reason": "predicts one class ('pos') for all 300"})
    for floor in (Floor("none", None, "no floor (register.floor: none)"), Floor("majority", 0.3, "majority baseline")):
        v = judge("macro_f1", 0.9, floor, 0.0, None, None, 0.0, False, None, degenerate=why)
        assert not v.promoted and v.below_floor and v.reason.startswith("degenerate: predicts one class")
    v = judge("macro_f1", 0.9, Floor("none", None, "no floor"), 0.0, None, None, 0.0, False, None)
    assert v.promoted  # the same score from a model that learned something is crowned


def test_class_weights_follow_the_train_counts_and_reach_the_loss():
    w = I.class_weights([0, 0, 0, 1], 3, "balanced")
    assert w.tolist() == pytest.approx([4 / 6, 2.0, 2.0])  # class 2 is absent: the largest present weight
    assert I.class_weights([0, 1], 2, "none") is None
    assert I.class_weights([0, 0, 0, 1], 2, "sqrt").tolist() == pytest.approx([(4 / 6) ** 0.5, 2 ** 0.5])
    from transformers import BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    model = BertForSequenceClassification(BertConfig(vocab_size=50, hidden_size=16, num_hidden_layers=1,
                                                     num_attention_heads=2, intermediate_size=32, num_labels=2))
    batch = {"input_ids": torch.randint(5, 50, (6, 8)), "attention_mask": torch.ones(6, 8, dtype=torch.long),
             "labels": torch.tensor([0, 0, 0, 0, 1, 1])}
    model.eval()
    plain = model(**batch).loss
    same = I.WeightedLoss(model, torch.ones(2))(**batch).loss
    assert same.item() == pytest.approx(plain.item(), rel=1e-5)
    heavy = I.WeightedLoss(model, torch.tensor([1.0, 5.0]))(**batch).loss
    assert heavy.item() != pytest.approx(plain.item(), rel=1e-3)
    assert I.weighted(model, "ner", [0, 1], 2, "balanced") is model  # token tasks train unweighted


@pytest.fixture(scope="module")
def project(tmp_path_factory, zh_tokenizer_dir):
    root = tmp_path_factory.mktemp("search")
    base = S.tiny_encoder(root / "base_enc", zh_tokenizer_dir, layers=1, hidden=32, seed=0)
    S.write_jsonl(root / "cls.jsonl", S.keyword_classification(120, labels=("pos", "neg", "mid")))
    return root, base


def _params(root, base, search: str) -> object:
    (root / "params.yaml").write_text(f"""
paths: {{work: work, state: state}}
model: {{base: {base}}}
finetune:
  encoders: [base]
  train: {TRAIN}
  search: {search}
  tasks:
    cls: {{type: classification, format: jsonl, train: cls.jsonl}}
""", encoding="utf-8")
    cfg = load_config(root / "params.yaml")
    run_stage(splits_stage(cfg), cfg, tracker_factory=NO_TRACKING)
    return cfg


def test_a_search_chooses_on_dev_skips_degenerate_trials_and_never_reruns_a_stored_trial(project):
    root, base = project
    cfg = _params(root, base, "{trials: 2, space: {lr: [1.0e-6, 1.0e-2]}, prune: false, retries: 0}")
    res = run_stage(finetune_stage("cls", "base"), cfg)  # the real MLflow store under state/
    m = json.loads((res.out / "metrics.json").read_text())
    trials = {t["config"]["lr"]: t for t in m["search"]["trials"]}
    from bertpipe.infra.tracking import client

    c = client(cfg)
    children = c.search_runs([c.get_run(res.run_id).info.experiment_id],
                             f"tags.mlflow.parentRunId = '{res.run_id}'")
    assert sorted(float(r.data.params["lr"]) for r in children) == [1e-6, 1e-2]
    assert {r.data.tags["bertpipe.trial.state"] for r in children} == {"degenerate", "complete"}
    assert trials[1e-6]["state"] == "degenerate" and "one class" in trials[1e-6]["reason"]
    assert trials[1e-2]["state"] == "complete" and trials[1e-2]["dev"] > m["majority_dev"]
    assert m["search"]["chosen"] == {"lr": 1e-2} and m["hyperparameters"]["lr"] == 1e-2
    assert not m["degenerate"] and m["per_seed"]["1"]["degenerate"] is None
    assert m["per_seed"]["1"]["dev"]["macro_f1"] == pytest.approx(trials[1e-2]["dev"])  # the trial's own run
    # A bigger space: the two trials already run are read back, only the new one trains.
    cfg = _params(root, base, "{trials: 3, space: {lr: [1.0e-6, 1.0e-2, 3.0e-3]}, prune: false, retries: 0}")
    res = run_stage(finetune_stage("cls", "base"), cfg, tracker_factory=NO_TRACKING)
    m = json.loads((res.out / "metrics.json").read_text())
    cached = {t["config"]["lr"]: t["cached"] for t in m["search"]["trials"]}
    assert cached == {1e-6: True, 1e-2: True, 3e-3: False}


def test_the_search_space_is_in_the_fingerprint(project):
    root, base = project
    a = fingerprint(finetune_stage("cls", "base"), _params(root, base, "{trials: 2, space: {lr: [1.0e-3, 1.0e-2]}}"))
    b = fingerprint(finetune_stage("cls", "base"), _params(root, base, "{trials: 2, space: {lr: [1.0e-3, 3.0e-3]}}"))
    c = fingerprint(finetune_stage("cls", "base"), _params(root, base, "{trials: 2, space: {lr: [1.0e-3, 1.0e-2]}}"))
    assert a[0] != b[0] and a[0] == c[0]


def test_an_encoder_whose_every_run_is_degenerate_is_marked_so(project):
    root, base = project
    cfg = _params(root, base, "{trials: 0, retries: 1}")
    (root / "params.yaml").write_text((root / "params.yaml").read_text().replace("epochs: 6", "epochs: 6, lr: 1.0e-6"))
    cfg = load_config(root / "params.yaml")
    res = run_stage(finetune_stage("cls", "base"), cfg, tracker_factory=NO_TRACKING)
    m = json.loads((res.out / "metrics.json").read_text())
    assert m["degenerate"] and "one class" in m["degenerate_reason"]
    assert m["per_seed"]["1"]["trained_seed"] == 1001  # the retry with another seed was degenerate too


def test_a_trial_on_the_majority_plateau_ranks_below_one_that_learns():
    from bertpipe.stages.finetune.search import ranked

    plateau, learning = ranked(0.40, sound=False), ranked(0.36, sound=True)  # 0.40 at a majority score of 0.40
    assert learning > plateau and ranked(0.5, True) == 0.5


def test_finetune_compile_is_in_the_fingerprint_and_on_without_a_compiler_fails_before_training(
        project, tmp_path, monkeypatch):
    from bertpipe.infra.errors import BertpipeError

    root, base = project
    off = fingerprint(finetune_stage("cls", "base"), _params(root, base, "{trials: 0}"))
    (root / "params.yaml").write_text((root / "params.yaml").read_text().replace("epochs: 6", "epochs: 6, compile: on"))
    cfg = load_config(root / "params.yaml")
    assert fingerprint(finetune_stage("cls", "base"), cfg)[0] != off[0]
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-g++"))
    out = finetune_stage("cls", "base").output(cfg)
    before = sorted((f, f.stat().st_mtime_ns) for f in out.rglob("*")) if out.exists() else []
    with pytest.raises(BertpipeError) as e:
        run_stage(finetune_stage("cls", "base"), cfg, tracker_factory=NO_TRACKING)
    msg = str(e.value)
    assert msg.startswith("finetune.train.compile: on, but torch.compile cannot run") and "no-such-g++" in msg
    assert "\n" not in msg  # nothing written, nothing an earlier build left touched
    assert (sorted((f, f.stat().st_mtime_ns) for f in out.rglob("*")) if out.exists() else []) == before


def test_a_run_the_search_found_degenerate_is_not_trained_again(project, capfd):
    root, base = project
    # one trial, and it is the given hyperparameters: the search trains seed 1 at lr 1e-6 and finds it degenerate
    cfg = _params(root, base, "{trials: 1, space: {lr: [1.0e-6]}, prune: false, retries: 1}")
    (root / "params.yaml").write_text((root / "params.yaml").read_text().replace("epochs: 6", "epochs: 6, lr: 1.0e-6"))
    cfg = load_config(root / "params.yaml")
    res = run_stage(finetune_stage("cls", "base"), cfg, tracker_factory=NO_TRACKING, force=True)
    err = capfd.readouterr().err
    m = json.loads((res.out / "metrics.json").read_text())
    assert [t["state"] for t in m["search"]["trials"]] == ["degenerate"]
    assert "seed 1: degenerate on dev in the search" in err, err[-2000:]
    assert "seed 1: degenerate on dev (" not in err, err[-2000:]  # seed 1 at lr 1e-6 was not trained a second time
    assert m["per_seed"]["1"]["trained_seed"] == 1001


def _scripted(curves: dict[float, list[float]], ran: list[float]):
    """What a trial "trains" in the store tests: its dev score at each evaluation, by lr, reported as training
    reports it (how a trial trains is not what they are about; test_a_search_chooses_on_dev trains for real)."""
    from bertpipe.lib.training.loop import TrainResult
    from bertpipe.stages.finetune.fit import Fit

    def run(ttp, seed, on_eval, number):
        ran.append(ttp.lr)
        res = TrainResult()
        for i, value in enumerate(curves[ttp.lr]):
            on_eval(value, i, True)
            res.step, res.best["score"] = res.step + 10, max(res.best_primary, value)
        return Fit(None, res, seed)
    return run


# 0.003 ranks below 0.01 at the first evaluation: successive halving (reduction factor 2) stops it there when it
# runs second, as it does at search seed 1
CURVES = {1e-2: [0.8, 0.85, 0.9], 3e-3: [0.5, 0.7, 0.95]}


def _study(store, space: list[float], prune: bool = True):
    from bertpipe.lib.training.params import SearchParams, TrainParams
    from bertpipe.stages.finetune.search import search

    ran: list[float] = []
    sp = SearchParams(trials=len(space), space={"lr": space}, prune=prune, seed=1)
    out = search(sp, TrainParams(lr=1e-4, seeds=[1]), 1, _scripted(CURVES, ran), store, lambda m: None)
    return out, {t.config["lr"]: (t.state, t.cached) for t in out.trials}, ran


def test_a_pruned_trial_is_replayed_in_its_own_study_only(tmp_path):
    from bertpipe.stages.finetune.search import TrialStore

    store = TrialStore(tmp_path / "a", {"task": "cls"})
    _, trials, ran = _study(store, [1e-2, 3e-3])
    assert trials == {1e-2: ("complete", False), 3e-3: ("pruned", False)} and ran == [1e-2, 3e-3]
    _, trials, ran = _study(store, [1e-2, 3e-3])  # the same study again (a rerun after a kill): nothing trains
    assert trials == {1e-2: ("complete", True), 3e-3: ("pruned", True)} and ran == []
    # the space narrowed to the pruned value: alone, nothing stops it; it trains and is chosen
    out, trials, ran = _study(store, [3e-3])
    assert trials == {3e-3: ("complete", False)} and ran == [3e-3] and out.config == {"lr": 3e-3}
    # without pruning, over a store where 0.003 was pruned: it trains to the end and wins
    store = TrialStore(tmp_path / "b", {"task": "cls"})
    _study(store, [1e-2, 3e-3])
    out, trials, ran = _study(store, [1e-2, 3e-3], prune=False)
    assert trials == {1e-2: ("complete", True), 3e-3: ("complete", False)} and out.config == {"lr": 3e-3}


@pytest.mark.parametrize("line", ['{"op_code": 0, "worker_id": "w", "study_na', "null", "[]", "{}"])
def test_a_journal_optuna_cannot_read_is_moved_aside_and_its_trials_train_again(tmp_path, line, capfd):
    from bertpipe.stages.finetune.search import TrialStore

    _study(TrialStore(tmp_path, {"task": "cls"}), [1e-2, 3e-3], prune=False)
    journal = tmp_path / "journal.log"
    ops = journal.read_text().splitlines(keepends=True)
    journal.write_text("".join(ops[:2] + [line + "\n"] + ops[2:]))
    out, trials, ran = _study(TrialStore(tmp_path, {"task": "cls"}), [1e-2, 3e-3], prune=False)
    assert trials == {1e-2: ("complete", False), 3e-3: ("complete", False)} and sorted(ran) == [3e-3, 1e-2]
    assert (tmp_path / "journal.log.unreadable").read_text() == "".join(ops[:2] + [line + "\n"] + ops[2:])
    assert "not an Optuna journal" in capfd.readouterr().err
    assert _study(TrialStore(tmp_path, {"task": "cls"}), [1e-2, 3e-3], prune=False)[2] == []  # a new journal


def test_a_journal_whose_last_operation_was_cut_short_keeps_the_trials_before_it(tmp_path):
    from bertpipe.stages.finetune.search import TrialStore

    _study(TrialStore(tmp_path, {"task": "cls"}), [1e-2, 3e-3], prune=False)
    journal = tmp_path / "journal.log"
    journal.write_bytes(journal.read_bytes()[:-20])  # a full disk cut the write of the last operation
    # the last trial's finish was lost: it trains again; the journal stays readable after that search's appends
    assert _study(TrialStore(tmp_path, {"task": "cls"}), [1e-2, 3e-3], prune=False)[2] == [3e-3]
    assert _study(TrialStore(tmp_path, {"task": "cls"}), [1e-2, 3e-3], prune=False)[2] == []


@pytest.mark.parametrize("key, values", [("max_seq_len", [64, 1024]), ("max_train_examples", [10, 100]),
                                         ("precision", ["fp32", "bf16"])])
def test_a_key_applied_before_the_search_is_refused_in_the_space(tmp_path, key, values):
    """Features are cut to max_seq_len once per split, train is capped by the splits stage, dev is scored at the
    stage's precision: a trial given another value would run as every other one, and the record would say chosen."""
    from bertpipe.infra.errors import BertpipeError

    (tmp_path / "params.yaml").write_text(f"finetune: {{search: {{trials: 2, space: {{{key}: {values}}}}}}}\n")
    with pytest.raises(BertpipeError) as e:
        load_config(tmp_path / "params.yaml")
    assert f"finetune.search.space: Value error, space: '{key}' is applied before the search" in str(e.value)
    assert "\n" not in str(e.value)
