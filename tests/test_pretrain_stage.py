"""The base/pretrain stage through the real stage contract: a small run whose held-out loss falls, a head-less
checkpoint, and bad input that fails in one line with no output."""

from __future__ import annotations

import contextlib
import json

import pytest
import torch
from transformers import AutoModelForMaskedLM, AutoTokenizer, BertConfig, BertForMaskedLM, GPT2Config, GPT2LMHeadModel

from bertpipe.core.stage import run_stage
from bertpipe.graph.pipeline import load_config
from bertpipe.infra.errors import BertpipeError
from bertpipe.stages.pretrain.declare import base_stage, pretrain_stage
from tests.test_pretrain_support import TINY_ARCH, english_texts, law_texts, write_corpus, write_params

torch.set_num_threads(1)
NO_TRACKER = {"tracker_factory": lambda *a: contextlib.nullcontext()}


def test_base_from_scratch_loss_falls(tmp_path, sample_raw, zh_tokenizer_dir):
    texts = law_texts(sample_raw, 700)
    write_corpus(tmp_path / "work" / "prepare" / "general", texts[:600], texts[600:])
    params = write_params(
        tmp_path,
        {"base": "scratch", "tokenizer": str(zh_tokenizer_dir), "language": "zh"},
        base={"arch": TINY_ARCH, "max_seq_len": 64, "batch_size": 16, "max_steps": 40, "lr": 3e-3,
              "eval_every": 20, "save_every": 20, "eval_examples": 64, "warmup_ratio": 0.1},
    )
    cfg = load_config(params)
    res = run_stage(base_stage(), cfg, **NO_TRACKER)
    out = tmp_path / "work" / "base"
    metrics = json.loads((out / "metrics.json").read_text())
    evals = [h["eval_loss"] for h in metrics["history"] if "eval_loss" in h]
    assert len(evals) == 3 and evals[-1] < evals[0] - 1.0, evals  # falls visibly from ln(21128) ~ 9.96
    assert res.metrics["steps"] == 40 and res.metrics["fresh_head"] == 1
    model = AutoModelForMaskedLM.from_pretrained(out / "model")
    tok = AutoTokenizer.from_pretrained(out / "model")
    assert model.config.num_hidden_layers == 1 and len(tok) == model.config.vocab_size
    report = (out / "report.md").read_text()
    assert "Fill-mask sanity sample" in report and report.count("[MASK]") >= 2
    assert (out / "loss.png").stat().st_size > 5000
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["counts"]["train_segments"] > 16 and manifest["metrics"]["eval_loss"] == res.metrics["eval_loss"]
    assert not (tmp_path / "state" / "scratch").exists() or not any((tmp_path / "state" / "scratch").iterdir())
    # same params, same inputs: the stage is fresh and skipped
    assert run_stage(base_stage(), cfg, **NO_TRACKER).skipped


def test_weights_follow_the_stage_not_the_doors_thread_count(tmp_path, sample_raw, zh_tokenizer_dir):
    """The CLI (torch's default: every core) and the flow (a child process with its share, or its own process with
    every core) give a stage different ambient thread counts; CPU reductions split by thread count, so the weights
    differed under one fingerprint. The stage sets its own count (bertpipe.infra.cores.training_threads)."""
    from safetensors.torch import load_file

    from bertpipe.infra.cores import training_threads

    texts = law_texts(sample_raw, 300)
    weights, fps = [], set()
    for ambient in (2, 1):
        root = tmp_path / f"ambient{ambient}"
        write_corpus(root / "work" / "prepare" / "general", texts[:240], texts[240:])
        params = write_params(root, {"base": "scratch", "tokenizer": str(zh_tokenizer_dir), "language": "zh"},
                              base={"arch": TINY_ARCH, "max_seq_len": 64, "batch_size": 8, "max_steps": 6,
                                    "eval_every": 6, "save_every": 6, "eval_examples": 16, "threads": 0})
        torch.set_num_threads(ambient)
        try:
            res = run_stage(base_stage(), load_config(params), **NO_TRACKER)
        finally:
            torch.set_num_threads(1)
        fps.add(res.fingerprint)
        manifest = json.loads((root / "work" / "base" / "manifest.json").read_text())
        assert manifest["counts"]["torch_threads"] == training_threads(0, alone=True)  # base: every core
        weights.append(load_file(root / "work" / "base" / "model" / "model.safetensors"))
    assert len(fps) == 1 and weights[0].keys() == weights[1].keys()
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])


def _pretrain_setup(tmp_path, model_dir, corpus_train, corpus_valid, language="zh", **pretrain):
    write_corpus(tmp_path / "work" / "prepare" / "domain", corpus_train, corpus_valid)
    (tmp_path / "work" / "vocab").mkdir(parents=True, exist_ok=True)
    if model_dir is not None:
        (tmp_path / "work" / "vocab" / "model").symlink_to(model_dir)
    settings = {"max_seq_len": 64, "batch_size": 8, "max_steps": 4, "eval_every": 4, "save_every": 4,
                "eval_examples": 16, **pretrain}
    return load_config(write_params(tmp_path, {"base": "unused", "language": language}, pretrain=settings))


def test_headless_checkpoint_gets_fresh_head(tmp_path, minilm_dir):
    texts = english_texts()
    cfg = _pretrain_setup(tmp_path, minilm_dir, texts[:120], texts[120:160], language="en", lr=1e-3,
                          pair_objective="nsp")
    res = run_stage(pretrain_stage(), cfg, **NO_TRACKER)
    assert res.metrics["fresh_head"] == 1 and res.metrics["steps"] == 4
    assert 0.0 <= res.metrics["eval_pair_acc"] <= 1.0
    out = tmp_path / "work" / "pretrain"
    assert "fresh MLM head" in (out / "report.md").read_text()
    model, info = AutoModelForMaskedLM.from_pretrained(out / "model", output_loading_info=True)
    assert not [k for k in info["missing_keys"] if "decoder.weight" not in k]  # the head is saved
    encoder = AutoModelForMaskedLM.from_pretrained(minilm_dir)  # the body was trained, not replaced
    a = model.bert.encoder.layer[0].attention.self.query.weight
    b = encoder.bert.encoder.layer[0].attention.self.query.weight
    assert torch.allclose(a, b, atol=0.05) and not torch.equal(a, b)


def _tiny_bert(path, tokenizer_dir, vocab_size=None, positions=128):
    tok = AutoTokenizer.from_pretrained(tokenizer_dir)
    cfg = BertConfig(vocab_size=vocab_size or len(tok), hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                     intermediate_size=64, max_position_embeddings=positions)
    BertForMaskedLM(cfg).save_pretrained(path)
    tok.save_pretrained(path)
    return path


def _gpt2(path, tokenizer_dir):
    GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=300)).save_pretrained(path)
    AutoTokenizer.from_pretrained(tokenizer_dir).save_pretrained(path)
    return path


@pytest.mark.parametrize(
    "case,expect",
    [
        ("missing", "does not exist"),
        ("not_a_model", "not a model checkpoint"),
        ("gpt2", "not a BERT-family"),
        ("vocab_mismatch", "vocab mismatch"),
        ("tiny_corpus", "fewer than one batch"),
        ("no_valid_text", "valid.parquet"),
    ],
)
def test_bad_input_is_one_line_and_leaves_no_output(tmp_path, sample_raw, zh_tokenizer_dir, case, expect):
    texts = law_texts(sample_raw, 120)
    model_dir = {
        "missing": None,
        "not_a_model": tmp_path / "empty",
        "gpt2": None,
        "vocab_mismatch": None,
    }.get(case, "ok")
    if case == "not_a_model":
        model_dir.mkdir()
        (model_dir / "readme.txt").write_text("nothing here")
    elif case == "gpt2":
        model_dir = _gpt2(tmp_path / "gpt2", zh_tokenizer_dir)
    elif case == "vocab_mismatch":
        model_dir = _tiny_bert(tmp_path / "small", zh_tokenizer_dir, vocab_size=1000)
    elif model_dir == "ok":
        model_dir = _tiny_bert(tmp_path / "ok", zh_tokenizer_dir)
    train, valid = texts[:100], texts[100:]
    if case == "tiny_corpus":
        train = texts[:3]
    if case == "no_valid_text":
        valid = ["", "   "]
    cfg = _pretrain_setup(tmp_path, model_dir, train, valid, batch_size=32)
    with pytest.raises(BertpipeError) as e:
        run_stage(pretrain_stage(), cfg, **NO_TRACKER)
    msg = str(e.value)
    assert expect in msg and "\n" not in msg, msg
    assert not (tmp_path / "work" / "pretrain").exists()
    assert not list((tmp_path / "work").glob(".pretrain.tmp-*"))


def test_checkpoint_with_fewer_positions_than_max_seq_len_is_clamped(tmp_path, sample_raw, zh_tokenizer_dir, capfd):
    texts = law_texts(sample_raw, 120)
    model_dir = _tiny_bert(tmp_path / "short", zh_tokenizer_dir, positions=64)
    cfg = _pretrain_setup(tmp_path, model_dir, texts[:100], texts[100:], max_seq_len=128, max_steps=2,
                          eval_every=2, save_every=2)
    res = run_stage(pretrain_stage(), cfg, **NO_TRACKER)
    assert res.metrics["max_seq_len"] == 64 and res.metrics["steps"] == 2
    assert "pretrain.max_seq_len=128 exceeds the model's 64 positions; using 64" in capfd.readouterr().err


def test_from_scratch_positions_shorter_than_segments(tmp_path, sample_raw, zh_tokenizer_dir):
    texts = law_texts(sample_raw, 60)
    write_corpus(tmp_path / "work" / "prepare" / "general", texts[:50], texts[50:])
    params = write_params(tmp_path, {"base": "scratch", "tokenizer": str(zh_tokenizer_dir)},
                          base={"arch": {**TINY_ARCH, "max_positions": 64}, "max_seq_len": 128})
    with pytest.raises(BertpipeError, match=r"base.*max_seq_len \(128\) exceeds arch.max_positions \(64\)"):
        run_stage(base_stage(), load_config(params), **NO_TRACKER)  # rejected when the params load
    assert not (tmp_path / "work" / "base").exists()
