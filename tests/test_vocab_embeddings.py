"""New embedding rows: piece-mean init is exact, ties survive, and on the real English checkpoint piece-mean init
gives a lower held-out MLM loss than random init."""

from __future__ import annotations

import contextlib
import copy
from pathlib import Path

import pytest
import torch

from bertpipe.core.stage import run_stage
from bertpipe.graph.pipeline import load_config
from bertpipe.stages.vocab.declare import vocab_stage
from bertpipe.stages.vocab.embeddings import extend_model, load_mlm, mlm_loss, output_bias, piece_ids
from bertpipe.stages.vocab.extend import extend_tokenizer, load_tokenizer
from tests.test_vocab_helpers import decided, tiny_zh_model, write_corpus

DATA = Path(__file__).parent / "data" / "vocab"
WORDS = ["合同法", "违约金", "人民法院", "plaintiff", "subrogation"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, zh_tokenizer_dir):
    d = tiny_zh_model(zh_tokenizer_dir, tmp_path_factory.mktemp("tiny") / "model")
    base = load_tokenizer(d)
    ext = extend_tokenizer(base, WORDS, ["㸃", "##㸃"])
    return d, base, ext


@pytest.fixture
def tiny_model(tiny):
    model, head_missing = load_mlm(tiny[0], log=lambda *_: None)
    assert not head_missing
    with torch.no_grad():  # a non-zero bias so the bias init is checked for real
        output_bias(model).normal_(0, 1)
    return model


def test_mean_init_is_the_mean_of_the_pieces(tiny, tiny_model):
    _, base, ext = tiny
    model = tiny_model
    old = model.get_input_embeddings().weight.detach().clone()
    old_bias = output_bias(model).detach().clone()
    extend_model(model, base, ext, "mean")
    emb = model.get_input_embeddings().weight
    bias = output_bias(model)
    assert emb.shape[0] == len(ext)
    assert torch.equal(emb[: len(base)], old)  # old rows untouched
    new_ids = list(range(len(base), len(ext)))
    tokens = ext.convert_ids_to_tokens(new_ids)
    for i, tok in zip(new_ids, tokens):
        text = tok.removeprefix("##")
        pieces = base(text, add_special_tokens=False)["input_ids"]
        assert len(pieces) >= 1
        torch.testing.assert_close(emb[i], old[pieces].mean(0))
        torch.testing.assert_close(bias[i], old_bias[pieces].mean())
    # "㸃" is [UNK] in the base: it starts from the [UNK] row.
    i = ext.convert_tokens_to_ids("㸃")
    torch.testing.assert_close(emb[i], old[base.unk_token_id])


def test_mean_rare_bias_init_keeps_the_mean_rows_and_starts_words_below_their_rarest_piece(tiny, tiny_model):
    import math

    _, base, ext = tiny
    old = output_bias(tiny_model).detach().clone()
    mean_model = copy.deepcopy(tiny_model)
    extend_model(mean_model, base, ext, "mean")
    extend_model(tiny_model, base, ext, "mean_rare_bias")
    assert torch.equal(tiny_model.get_input_embeddings().weight, mean_model.get_input_embeddings().weight)
    bias = output_bias(tiny_model)
    for i in range(len(base), len(ext)):
        pieces = base(ext.convert_ids_to_tokens(i).removeprefix("##"), add_special_tokens=False)["input_ids"]
        torch.testing.assert_close(bias[i], old[pieces].min() - math.log(len(pieces)))
    assert piece_ids(base, ["##㸃"]) == [[base.unk_token_id]]


@pytest.mark.parametrize("method", ["mean", "mean_cov", "random"])
def test_ties_survive_and_the_model_runs(tiny, tiny_model, method, tmp_path):
    d, base, ext = tiny
    model = tiny_model
    extend_model(model, base, ext, method, seed=1)
    assert model.get_output_embeddings().weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()
    assert model.config.vocab_size == len(ext)
    new = model.get_input_embeddings().weight[len(base) :]
    assert torch.isfinite(new).all() and new.abs().sum() > 0
    enc = ext(["人民法院判决合同法违约金", "the plaintiff 㸃"], padding=True, return_tensors="pt")
    with torch.no_grad():
        logits = model(**enc).logits
    assert logits.shape[-1] == len(ext) and torch.isfinite(logits).all()
    loss = mlm_loss(model, ext, ["人民法院判决合同法违约金" * 3, "the plaintiff 㸃"], seed=0)
    assert loss == loss and loss > 0


def test_random_rows_differ_from_mean_rows(tiny):
    d, base, ext = tiny
    a, _ = load_mlm(d, log=lambda *_: None)
    b, _ = load_mlm(d, log=lambda *_: None)
    extend_model(a, base, ext, "mean")
    extend_model(b, base, ext, "random")
    ea, eb = a.get_input_embeddings().weight[len(base) :], b.get_input_embeddings().weight[len(base) :]
    assert not torch.allclose(ea, eb)
    std = b.config.initializer_range
    assert 0.5 * std < float(eb.detach().std()) < 2 * std


@pytest.mark.slow
def test_real_checkpoint_mean_init_beats_random(tmp_path, minilm_dir):
    """The real English MiniLM (no MLM head) extended with legal words: piece-mean < random on held-out text."""
    torch.set_num_threads(max(1, min(2, torch.get_num_threads())))
    train = (DATA / "legal_en.txt").read_text(encoding="utf-8").splitlines()
    held = (DATA / "legal_en_heldout.txt").read_text(encoding="utf-8").splitlines()
    write_corpus(tmp_path / "work" / "prepare" / "domain", train, held)
    params = tmp_path / "params.yaml"
    params.write_text(
        f"model: {{base: {minilm_dir}, tokenizer: '', language: en}}\n"
        "paths: {work: work, state: state}\n"
        "vocab: {top_k: 300, min_freq: 2, head_fit_steps: 80, eval_texts: 100}\n",
        encoding="utf-8",
    )
    cfg = load_config(params)
    res = run_stage(vocab_stage(), decided(cfg), tracker_factory=lambda *a: contextlib.nullcontext())
    m = res.metrics
    print(f"real checkpoint: mlm_loss mean={m['mlm_loss_mean']:.4f} random={m['mlm_loss_random']:.4f}")
    assert m["added_tokens"] >= 20
    assert m["mlm_loss_mean"] < m["mlm_loss_random"]
    report = (res.out / "report.md").read_text(encoding="utf-8")
    assert "absent from the checkpoint" in report
    # The saved extended model still has its new head and loads without bertpipe.
    from transformers import AutoModelForMaskedLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(res.out / "model")
    model = AutoModelForMaskedLM.from_pretrained(res.out / "model")
    assert tok.tokenize("the indemnitor and the tortfeasor") == ["the", "indemnitor", "and", "the", "tortfeasor"]
    assert abs(mlm_loss(model, tok, held, seed=0) - m["mlm_loss_mean"]) < 1e-3
