"""`compile: on | off | auto` in pretraining: a compiled run trains to the same losses as an eager one, `auto`
compiles only runs long enough to repay it, and `on` without a compiler is one error naming the key."""

from __future__ import annotations

import pytest
import torch

from bertpipe.infra import execution
from bertpipe.infra.errors import BertpipeError
from bertpipe.lib.mlm.data import build_examples
from bertpipe.lib.mlm.masking import MaskSpec, normal_token_ids
from bertpipe.lib.mlm.model import PretrainModel, from_scratch, load_tokenizer
from bertpipe.lib.mlm.params import PretrainParams
from bertpipe.lib.mlm.train import Dist, eval_batches, train
from tests.test_pretrain_support import law_texts

TINY = {"layers": 1, "hidden": 32, "heads": 2, "intermediate": 64, "max_positions": 64, "dropout": 0.0}


@pytest.fixture(scope="module")
def setup(zh_tokenizer_dir, sample_raw):
    tok = load_tokenizer(zh_tokenizer_dir)
    docs = law_texts(sample_raw, 120)
    p = PretrainParams(arch=TINY, max_seq_len=64, batch_size=8, max_steps=3, eval_every=3, save_every=3, log_every=1,
                       eval_examples=8, precision="fp32", lr=1e-3, warmup_ratio=0.0)
    # full rows only: one shape, so the compiled run compiles one training graph and one evaluation graph
    ex = [e for e in build_examples(docs, tok, "zh", p) if len(e) == p.max_seq_len]
    spec = MaskSpec.from_params(p)
    replace = normal_token_ids(tok)
    return tok, p, ex[:-8], eval_batches(ex[-8:], p, spec, tok.mask_token_id, replace, tok.pad_token_id), spec, replace


def _run(setup, tmp, compile_setting: str):
    tok, p, train_ex, eval_set, spec, replace = setup
    torch.manual_seed(0)
    pm = PretrainModel(from_scratch(tok, p.arch, p.max_seq_len), pair=False)
    return train(pm, train_ex, eval_set, p.model_copy(update={"compile": compile_setting}), spec, tok, replace, tmp,
                 Dist())


@pytest.mark.slow
def test_compiled_run_gives_the_eager_losses(setup, tmp_path):
    if execution.compiler_missing(torch.device("cpu")):
        pytest.skip("no C++ compiler for Inductor")
    eager = _run(setup, tmp_path / "eager", "off")
    compiled = _run(setup, tmp_path / "compiled", "on")
    assert not eager.compiled and compiled.compiled and compiled.compile_s is not None
    losses = [[h["loss"] for h in r.history if "loss" in h] for r in (eager, compiled)]
    assert len(losses[0]) == 3
    assert losses[1] == pytest.approx(losses[0], rel=1e-3, abs=1e-4)
    assert compiled.final_eval["eval_loss"] == pytest.approx(eager.final_eval["eval_loss"], rel=1e-3)


def test_compile_on_without_a_compiler_is_an_error_naming_the_key(setup, tmp_path, monkeypatch):
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-g++"))
    with pytest.raises(BertpipeError) as e:
        _run(setup, tmp_path / "scratch", "on")
    msg = str(e.value)
    assert msg.startswith("pretrain.compile: on, but torch.compile cannot run") and "no-such-g++" in msg
    assert "\n" not in msg
    assert not (tmp_path / "scratch").exists()  # nothing written
    # auto without a compiler runs eager, whatever the length
    assert execution.should_compile("auto", 10**6, torch.device("cpu"), "pretrain.compile")[0] is False


def test_auto_compiles_only_long_runs(monkeypatch):
    monkeypatch.delenv("CXX", raising=False)
    cpu = torch.device("cpu")
    if execution.compiler_missing(cpu):
        pytest.skip("no C++ compiler for Inductor")
    short, why = execution.should_compile("auto", 200, cpu, "pretrain.compile")
    assert not short and "200 steps" in why
    assert execution.should_compile("auto", execution.AUTO_MIN_STEPS, cpu, "pretrain.compile")[0]
    assert execution.should_compile("off", 10**6, cpu, "pretrain.compile")[0] is False


def test_compile_seconds_is_the_slow_first_steps_over_the_median():
    assert execution.compile_seconds([30.0, 1.0, 1.1, 0.9, 1.0]) == pytest.approx(29.0)
    assert execution.compile_seconds([1.0, 1.0]) is None
