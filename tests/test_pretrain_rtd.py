"""ELECTRA's replaced-token detection (``objective: rtd``) for real: a tiny model trained for real steps whose
discriminator learns, a saved encoder that the finetune stage loads and finetunes, and exact resume after a crash."""

from __future__ import annotations

import contextlib
import json
import math
import shutil

import pytest
import torch
from transformers import AutoModel, AutoModelForMaskedLM, AutoTokenizer

from bertpipe.core.stage import fingerprint, run_stage
from bertpipe.graph.pipeline import load_config
from bertpipe.infra.errors import BertpipeError
from bertpipe.lib.mlm import data
from bertpipe.lib.mlm.masking import MaskSpec, normal_token_ids
from bertpipe.lib.mlm.train import Dist, eval_batches, state_digest, train
from bertpipe.stages.pretrain.declare import base_stage
from bertpipe.stages.pretrain.stage import objective_model
from tests.test_pretrain_support import TINY_ARCH, law_texts, write_corpus, write_params

torch.set_num_threads(1)
NO_TRACKER = {"tracker_factory": lambda *a: contextlib.nullcontext()}
RTD_BASE = {"arch": TINY_ARCH, "max_seq_len": 64, "batch_size": 16, "max_steps": 40, "lr": 3e-3, "eval_every": 20,
            "save_every": 20, "eval_examples": 64, "warmup_ratio": 0.1, "objective": "rtd", "output": "last"}


@pytest.fixture(scope="module")
def rtd_base(tmp_path_factory, sample_raw, zh_tokenizer_dir):
    root = tmp_path_factory.mktemp("rtd")
    texts = law_texts(sample_raw, 700)
    write_corpus(root / "work" / "prepare" / "general", texts[:600], texts[600:])
    params = write_params(root, {"base": "scratch", "tokenizer": str(zh_tokenizer_dir), "language": "zh"},
                          base=RTD_BASE)
    cfg = load_config(params)
    res = run_stage(base_stage(), cfg, **NO_TRACKER)
    return root, cfg, res


def test_discriminator_learns_and_encoder_is_saved_headless(rtd_base):
    root, cfg, res = rtd_base
    out = root / "work" / "base"
    metrics = json.loads((out / "metrics.json").read_text())
    evals = [h for h in metrics["history"] if "eval_disc_loss" in h]
    train_disc = [h["disc_loss"] for h in metrics["history"] if "disc_loss" in h]
    assert len(evals) == 3 and len(train_disc) == 8
    # The replaced share is ~15% at most, so "always original" scores ~0.42 nats per token; from a random head
    # (~0.69) the discriminator must get below that, i.e. learn more than the prior.
    assert evals[0]["eval_disc_loss"] > 0.6 and evals[-1]["eval_disc_loss"] < 0.42, evals
    assert train_disc[-1] < train_disc[0] - 0.2, train_disc
    assert evals[-1]["eval_disc_acc"] > 0.85
    assert evals[-1]["eval_mlm_loss"] < evals[0]["eval_mlm_loss"] - 1.0  # the generator learns too (from ~ln 21128)
    w = cfg.params.base.rtd.disc_weight
    assert math.isclose(evals[-1]["eval_loss"], evals[-1]["eval_mlm_loss"] + w * evals[-1]["eval_disc_loss"],
                        rel_tol=1e-6)
    assert res.metrics["eval_disc_acc"] == pytest.approx(evals[-1]["eval_disc_acc"])

    # model/ is the discriminator's encoder: AutoModel loads every weight; it has no MLM head to score
    enc, info = AutoModel.from_pretrained(out / "model", output_loading_info=True)
    assert not [k for k in info["missing_keys"] if not k.startswith("pooler.")], info["missing_keys"]
    assert enc.config.hidden_size == TINY_ARCH["hidden"]
    _, info = AutoModelForMaskedLM.from_pretrained(out / "model", output_loading_info=True)
    assert any(k.startswith("cls.") for k in info["missing_keys"])
    gen = AutoModelForMaskedLM.from_pretrained(out / "generator")  # the generator: an MLM a quarter as wide
    assert gen.config.hidden_size < enc.config.hidden_size and gen.config.embedding_size == TINY_ARCH["hidden"]
    assert torch.equal(gen.get_input_embeddings().weight, enc.get_input_embeddings().weight)  # shared while trained
    report = (out / "report.md").read_text()
    assert "RTD (ELECTRA)" in report and "discriminator" in report

    # the encoder comparison does not apply to it: one line saying why, not a score from a random head
    from bertpipe.lib.measures.fair_mlm import has_mlm_head, score_windows

    with pytest.raises(BertpipeError, match="no masked-LM head"):
        score_windows(out / "model", [("本法所称的发明创造", [(0, 2)])], 64)
    assert not has_mlm_head(out / "model") and has_mlm_head(out / "generator")  # register skips the encoder gate

    # objective is part of the stage's fingerprint
    mlm_cfg = load_config(root / "params.yaml", None, ["base.objective=mlm"])
    assert fingerprint(base_stage(), mlm_cfg)[0] != fingerprint(base_stage(), cfg)[0]


def test_rtd_encoder_finetunes_in_the_finetune_stage(rtd_base, tmp_path):
    from tests import synthetic as S
    from bertpipe.stages.finetune.declare import finetune_stage
    from bertpipe.stages.splits.declare import splits_stage

    root, _, _ = rtd_base
    enc = tmp_path / "enc"
    shutil.copytree(root / "work" / "base" / "model", enc)
    S.write_jsonl(tmp_path / "cls.jsonl", S.keyword_classification(400, seed=1))
    (tmp_path / "params.yaml").write_text(
        f"""
paths: {{work: work, state: state}}
model: {{base: {enc}}}
finetune:
  encoders: [base]
  train: {{lr: 1.0e-3, epochs: 8, batch_size: 16, max_seq_len: 48, seeds: [7], warmup_ratio: 0.05,
          early_stopping: {{patience: 0}}, num_threads: 1}}
  search: {{trials: 0}}
  tasks:
    cls: {{type: classification, format: jsonl, train: cls.jsonl}}
""", encoding="utf-8")
    cfg = load_config(tmp_path / "params.yaml")
    run_stage(splits_stage(cfg), cfg, tracker_factory=NO_TRACKER["tracker_factory"])
    res = run_stage(finetune_stage("cls", "base"), cfg, tracker_factory=NO_TRACKER["tracker_factory"])
    m = json.loads((res.out / "metrics.json").read_text(encoding="utf-8"))
    test_f1 = m["per_seed"]["7"]["test"]["macro_f1"]
    assert test_f1 > 0.8, m["per_seed"]  # the keyword task is learnt on top of the RTD encoder
    tok = AutoTokenizer.from_pretrained(res.out / "model")
    assert len(tok) == AutoModel.from_pretrained(res.out / "model").config.vocab_size


class _Crash(Exception):
    pass


def test_resume_after_a_crash_replays_the_same_steps(sample_raw, zh_tokenizer_dir, tmp_path):
    """A run that dies after its step-3 checkpoint, resumed, ends bit-identical to an uninterrupted run: the
    generator, its sampling stream and the discriminator head are all in the checkpoint or a function of the step."""
    from bertpipe.lib.mlm.model import from_scratch, load_tokenizer
    from bertpipe.lib.mlm.params import ArchParams, PretrainParams

    tok = load_tokenizer(zh_tokenizer_dir)
    p = PretrainParams(arch=ArchParams(**TINY_ARCH), max_seq_len=64, batch_size=8, max_steps=6, save_every=3,
                       eval_every=3, log_every=1, eval_examples=16, objective="rtd", threads=1)
    texts = law_texts(sample_raw, 200)
    train_ex = data.build_examples(texts[:160], tok, "zh", p, 64, p.seed)
    valid_ex = data.build_examples(texts[160:], tok, "zh", p, 16, p.seed + 1)
    spec, replace = MaskSpec.from_params(p), normal_token_ids(tok)
    evals = eval_batches(valid_ex, p, spec, tok.mask_token_id, replace, tok.pad_token_id)

    def fresh():
        torch.manual_seed(p.seed)
        return objective_model(from_scratch(tok, p.arch, p.max_seq_len), p)

    whole = fresh()
    train(whole, train_ex, evals, p, spec, tok, replace, tmp_path / "whole", Dist())

    def crash(metrics, step):
        if step == 4:
            raise _Crash

    with pytest.raises(_Crash):
        train(fresh(), train_ex, evals, p, spec, tok, replace, tmp_path / "killed", Dist(), on_log=crash)
    resumed = fresh()
    res = train(resumed, train_ex, evals, p, spec, tok, replace, tmp_path / "killed", Dist())
    assert res.resumed_from == 3 and res.step == 6
    assert state_digest(resumed) == state_digest(whole)  # discriminator, its head and the generator
