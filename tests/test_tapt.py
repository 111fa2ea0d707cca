"""Task-adaptive pretraining and the choice of encoder: a real tiny tapt/<task> stage (continued MLM on the task's
train texts, none of its dev/test texts), real tiny finetunes of three encoders, and the export (and register, in a
real MLflow sqlite store) that take the best by dev score and pass over a collapsed one."""

from __future__ import annotations

import contextlib
import json
import random
from pathlib import Path

import pytest
import torch

from tests import synthetic as S
from bertpipe.core.stage import run_stage
from bertpipe.graph.pipeline import all_stages, load_config
from bertpipe.lib.labelled import Example, read_split, write_split
from bertpipe.stages.export.declare import export_stage
from bertpipe.stages.tapt.corpus import tapt_corpus
from bertpipe.stages.tapt.declare import tapt_stage

torch.set_num_threads(1)
NO_TRACKING = {"tracker_factory": lambda *a: contextlib.nullcontext()}
LEAK = "这是一条测试集里的句子，不能出现在任务自适应预训练语料中。"  # a test text (>= contain_min_chars)

PARAMS = """
paths: {work: work, state: state}
model: {base: enc_base}
prepare: {domain: {sources: [{path: corpus.txt, format: txt}]}, general: {enabled: false}}
tapt: {max_steps: 20, epochs: 50, batch_size: 8, lr: 2.0e-3, max_seq_len: 32, eval_every: 10, save_every: 10,
       eval_examples: 32, warmup_ratio: 0.1, holdout: 0.1, fill_mask_samples: 1}
finetune:
  encoders: [base, adapted, tapt]
  train: {lr: 1.0e-3, epochs: 4, batch_size: 16, max_seq_len: 32, seeds: [7], warmup_ratio: 0.05,
          early_stopping: {patience: 0}}
  search: {trials: 0}
  tasks:
    cls: {type: classification, format: jsonl, train: cls.jsonl}
distill: {enabled: false}
register: {register_encoder: false}
"""


@pytest.fixture(scope="module")
def project(tmp_path_factory, zh_tokenizer_dir):
    """tasks, a leak planted in the task's train split (a copy of a test text, and the test text inside a longer
    one), then tapt/cls from a tiny 'adapted' encoder."""
    root = tmp_path_factory.mktemp("tapt")
    S.tiny_encoder(root / "enc_base", zh_tokenizer_dir, layers=2, hidden=64, seed=1)
    S.tiny_encoder(root / "work" / "pretrain" / "model", zh_tokenizer_dir, layers=2, hidden=64, seed=2)
    rows = S.keyword_classification(400, seed=1)
    rng = random.Random(3)
    for r in rows[::3]:  # no keyword in a third of the texts: encoders guess them differently, so dev scores differ
        r["text"] = "".join(rng.choice(S.FILLER) for _ in range(rng.randint(8, 20)))
    S.write_jsonl(root / "cls.jsonl", rows)
    (root / "corpus.txt").write_text("一段领域文本。\n", encoding="utf-8")  # `bertpipe stages` walks the whole graph
    (root / "params.yaml").write_text(PARAMS, encoding="utf-8")
    cfg = load_config(root / "params.yaml")
    stages = all_stages(cfg)
    run_stage(stages["splits"], cfg, **NO_TRACKING)
    tdir = root / "work" / "splits" / "cls"
    test = read_split(tdir / "test.jsonl")
    test.append(Example(id="leak-test", text=LEAK, label="pos"))
    write_split(tdir / "test.jsonl", test)
    train = read_split(tdir / "train.jsonl")
    train += [Example(id="leak-copy", text=LEAK, label="pos"),
              Example(id="leak-inside", text="前言部分。" + LEAK + "后面还有别的内容。", label="pos"),
              Example(id="leak-dev", text=read_split(tdir / "dev.jsonl")[0].text, label="neg")]
    write_split(tdir / "train.jsonl", train)
    res = run_stage(tapt_stage("cls"), cfg, **NO_TRACKING)
    return root, cfg, res


def test_tapt_corpus_holds_no_dev_or_test_text(project):
    root, cfg, _ = project
    tdir = root / "work" / "splits" / "cls"
    corpus = tapt_corpus("cls", tdir, cfg.params.prepare, holdout=0.1, seed=0)
    texts = corpus.train + corpus.held_out
    kept_out = {e.text for s in ("dev", "test") for e in read_split(tdir / f"{s}.jsonl")}
    assert not [t for t in texts if t in kept_out or LEAK in t]
    assert corpus.counts["leak_dropped"] == 3
    assert corpus.counts["leak_dropped_by_reason"] == {"exact": 2, "contains": 1, "near": 0}
    assert {e["id"] for e in corpus.counts["leak_examples"]} == {"leak-copy", "leak-inside", "leak-dev"}
    assert len(texts) == corpus.counts["train_texts"] - 3 and corpus.held_out and corpus.train
    assert not set(corpus.train) & set(corpus.held_out)


def test_tapt_stage_trains_and_saves_a_masked_lm(project):
    from transformers import AutoModelForMaskedLM, AutoTokenizer

    root, cfg, res = project
    out = root / "work" / "tapt" / "cls"
    model = AutoModelForMaskedLM.from_pretrained(out / "model")
    tok = AutoTokenizer.from_pretrained(out / "model")
    assert len(tok) == model.config.vocab_size
    start = AutoModelForMaskedLM.from_pretrained(root / "work" / "pretrain" / "model")
    a, b = model.bert.embeddings.word_embeddings.weight, start.bert.embeddings.word_embeddings.weight
    assert not torch.equal(a, b)  # continued from the adapted encoder, and trained
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["steps"] == 20 and metrics["fresh_head"] == 0  # 50 epochs capped by max_steps
    assert metrics["eval_loss"] < metrics["initial_eval_loss"] - 0.5, metrics
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["counts"]["leak_dropped"] == 3 and manifest["params"]["tapt"]["max_steps"] == 20
    assert "3 of" in (out / "report.md").read_text()
    assert run_stage(tapt_stage("cls"), cfg, **NO_TRACKING).skipped
    # a tapt param is in the fingerprint
    cfg2 = cfg.with_overrides(["tapt.mask_prob=0.2"])
    from bertpipe.core.stage import is_fresh

    assert is_fresh(tapt_stage("cls"), cfg)[0] and not is_fresh(tapt_stage("cls"), cfg2)[0]


@pytest.mark.slow  # three finetunes and three exports
def test_export_takes_the_best_dev_score_and_skips_a_degenerate_finetune(project):
    root, cfg, _ = project
    stages = all_stages(cfg)
    assert stages["finetune/cls/tapt"].inputs(cfg)["encoder"] == root / "work" / "tapt" / "cls" / "model"
    dev, dead = {}, set()
    for enc in ("base", "adapted", "tapt"):
        run_stage(stages[f"finetune/cls/{enc}"], cfg, **NO_TRACKING)
        m = json.loads((root / "work" / "finetune" / "cls" / enc / "metrics.json").read_text())
        dev[enc] = m["summary"]["dev"]["macro_f1"]["mean"]
        if m["degenerate"]:  # a tiny encoder's finetune that learned nothing: the choice passes over it too
            dead.add(enc)
    assert len(dead) < 2, dev  # at least two finetunes learned something
    order = ("tapt", "adapted", "base")  # ties go to the more adapted encoder

    def best(encs):
        return max(encs, key=lambda e: (dev[e], -order.index(e)))

    def export():
        run_stage(export_stage("cls"), cfg, force=True, **NO_TRACKING)
        sel = json.loads((root / "work" / "export" / "cls" / "selection.json").read_text())
        checks = json.loads((root / "work" / "export" / "cls" / "checks.json").read_text())
        assert checks["encoder"] == sel["encoder"] and checks["degenerate"] == sel["degenerate"]
        return sel

    sel = export()
    assert len(set(dev.values())) == 3, dev  # distinct scores: the choice is the score's, not a tie-break's
    first = best([e for e in dev if e not in dead])
    assert sel["encoder"] == first and not sel["degenerate"] and sel["dev"] == dev
    assert Path(sel["source"]) == root / "work" / "finetune" / "cls" / first
    # register registers the same finetune and names its encoder
    from bertpipe.infra.tracking import client

    (root / "work" / "evaluate").mkdir(exist_ok=True)
    run_stage(stages["register"], cfg)
    [v] = client(cfg).search_model_versions("name='bertpipe-cls'")
    assert v.tags["bertpipe.encoder"] == first and v.tags["bertpipe.degenerate"] == "false"
    assert f"`{first}` encoder, the best by dev macro_f1" in v.description
    # the finetune's collapse flag: the winner marked degenerate is passed over for the next best
    metrics_of = {e: root / "work" / "finetune" / "cls" / e / "metrics.json" for e in dev}

    def mark(enc):
        m = json.loads(metrics_of[enc].read_text())
        metrics_of[enc].write_text(json.dumps({**m, "degenerate": True}))

    mark(first)
    sel = export()
    assert sel["encoder"] == best([e for e in dev if e != first and e not in dead])
    assert set(sel["degenerate_encoders"]) == {first, *dead}
    # every one degenerate: the best by dev is still exported, marked degenerate for register to refuse
    for e in dev:
        if e != first:
            mark(e)
    sel = export()
    assert sel["encoder"] == first and sel["degenerate"] is True


def test_stages_lists_tapt_and_its_command_runs_it(project):
    from typer.testing import CliRunner

    from bertpipe.doors.cli.commands import app

    root, _, _ = project
    params = str(root / "params.yaml")
    res = CliRunner().invoke(app, ["stages", "--params", params, "--json"])
    rows = {r["stage"]: r for r in json.loads(res.output)}
    names = list(rows)
    assert rows["tapt/cls"]["fingerprint"]  # (stale: its upstream pretrain stage is a stand-in, never built)
    assert names.index("tapt/cls") < names.index("finetune/cls/tapt")
    res = CliRunner().invoke(app, ["tapt", "--task", "cls", "--params", params])
    assert res.exit_code == 0 and "cached" in res.output, res.output
    res = CliRunner().invoke(app, ["tapt", "--task", "nope", "--params", params])
    assert res.exit_code == 2 and "no tapt stage matches --task nope" in res.output, res.output


def test_encoders_accept_tapt_and_name_the_known_ones(tmp_path):
    from bertpipe.infra.errors import BertpipeError

    p = tmp_path / "params.yaml"
    p.write_text("finetune: {encoders: [base, adapted, tapt]}\ntapt: {epochs: 3, mask_prob: 0.2}\n", encoding="utf-8")
    cfg = load_config(p)
    assert cfg.params.finetune.encoders == ["base", "adapted", "tapt"] and cfg.params.tapt.epochs == 3
    for bad, where in (("finetune.encoders=[base, dapt]", "finetune.encoders"), ("tapt.objective=rtd", "tapt.objective"),
                       ("tapt.holdout=0", "tapt.holdout"), ("tapt.steps=3", "tapt.steps: unknown key")):
        with pytest.raises(BertpipeError) as e:
            load_config(p, overrides=[bad])
        assert where in str(e.value) and "\n" not in str(e.value), str(e.value)
