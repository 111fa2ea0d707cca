"""The training loop on a tiny real BERT: unfreezing phases, layer-wise lr decay, early stopping with restore."""

from __future__ import annotations

import pytest
import torch

from tests.synthetic import keyword_classification, tiny_encoder
from bertpipe.lib.labelled import Example
from bertpipe.lib.training import batches as B
from bertpipe.lib.training import layers
from bertpipe.lib.training import loop as TR
from bertpipe.lib.training import windows as W
from bertpipe.lib.training.features import featurize
from bertpipe.lib.training.heads import load_model
from bertpipe.lib.training.params import TaskParams, TrainParams
from bertpipe.lib.training.predict import run_model

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def encoder(tmp_path_factory, zh_tokenizer_dir):
    return tiny_encoder(tmp_path_factory.mktemp("enc"), zh_tokenizer_dir, layers=4, hidden=32)


@pytest.fixture(scope="module")
def feats(encoder):
    from collections import Counter

    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(encoder))
    exs = [Example(id=str(r["id"]), text=r["text"], label=r["label"]) for r in keyword_classification(64)]
    p = TaskParams(type="classification", format="jsonl", train="x")
    return featurize(tok, exs, p, TrainParams(max_seq_len=32), {"neg": 0, "pos": 1}, Counter(), "train").feats


def _model(encoder):
    return load_model("classification", encoder, ["neg", "pos"])


def _snapshot(model):
    return {k: v.detach().clone() for k, v in model.named_parameters()}


def test_gradual_unfreezing_changes_only_the_phase_parameters(encoder, feats):
    tp = TrainParams(lr=1e-3, epochs=3, batch_size=16, warmup_ratio=0.0, seeds=[0], precision="fp32",
                     unfreeze=[{"epochs": 1, "top_layers": 0}, {"epochs": 1, "top_layers": 2}],
                     early_stopping={"patience": 0})
    model = _model(encoder)
    before = _snapshot(model)
    changed: dict[int, set] = {}

    def on_phase_end(phase, m):
        nonlocal before
        now = _snapshot(m)
        changed[phase] = {k for k in now if not torch.equal(now[k], before[k])}
        before = now

    TR.train(model, feats, tp, lambda m: (0.0, {}), 0, seed=0, on_phase_end=on_phase_end)
    assert sorted(changed) == [0, 1, 2]
    depth = {k: layers.depth(k, 4) for k in before}
    head = {k for k, d in depth.items() if d == 4}
    top2 = {k for k, d in depth.items() if d in (2, 3)}
    assert changed[0] and changed[0] <= head  # head only
    assert changed[1] - head and changed[1] <= head | top2 and any(depth[k] == 3 for k in changed[1])
    assert any(depth[k] == -1 for k in changed[2]) and any(depth[k] == 0 for k in changed[2])  # everything
    assert all(p.requires_grad for p in model.parameters())


def test_layer_wise_lr_decay_groups(encoder):
    model = _model(encoder)
    tp = TrainParams(lr=1e-3, head_lr=5e-3, layer_lr_decay=0.5)
    lr_of = {}
    for g in layers.param_groups(model, tp):
        for p in g["params"]:
            lr_of[id(p)] = (g["lr"], g["weight_decay"])
    named = dict(model.named_parameters())
    assert lr_of[id(named["classifier.weight"])][0] == pytest.approx(5e-3)
    for i in range(4):
        assert lr_of[id(named[f"bert.encoder.layer.{i}.attention.self.query.weight"])] == pytest.approx(
            (1e-3 * 0.5 ** (4 - i), 0.01))
        assert lr_of[id(named[f"bert.encoder.layer.{i}.output.LayerNorm.weight"])][1] == 0.0
    assert lr_of[id(named["bert.embeddings.word_embeddings.weight"])][0] == pytest.approx(1e-3 * 0.5**5)


def test_early_stopping_restores_the_best_weights(encoder, feats):
    tp = TrainParams(lr=1e-3, epochs=10, batch_size=16, seeds=[0], precision="fp32", evals_per_epoch=1,
                     early_stopping={"patience": 2})
    model = _model(encoder)
    seen = []
    scores = iter([0.1, 0.5, 0.3, 0.2, 0.9, 0.9])  # best at the 2nd evaluation, then two without improvement

    def evaluate(m):
        seen.append(_snapshot(m))
        return next(scores), {}

    res = TR.train(model, feats, tp, evaluate, 0, seed=0)
    assert res.stopped_early and len(seen) == 4 and res.best_primary == 0.5 and res.best_step == 8
    final = _snapshot(model)
    assert all(torch.equal(final[k], seen[1][k]) for k in final)
    assert not all(torch.equal(final[k], seen[3][k]) for k in final)


def test_grad_accumulation_counts_optimizer_steps(encoder, feats):
    tp = TrainParams(lr=1e-3, epochs=1, batch_size=8, grad_accum=2, seeds=[0])
    res = TR.train(_model(encoder), feats, tp, lambda m: (0.0, {}), 0, seed=0)
    assert res.steps == 4  # 64 examples / (8 x 2)
    assert res.losses and all(loss > 0 for _, loss in res.losses)


def test_collate_pads_and_masks():
    batch = B.collate([{"input_ids": [1, 2, 3], "labels": [0, 1, 0]}, {"input_ids": [4], "labels": [1]}], pad_id=0)
    assert batch["input_ids"].tolist() == [[1, 2, 3], [4, 0, 0]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [1, 0, 0]]
    assert batch["labels"].tolist() == [[0, 1, 0], [1, -100, -100]]
    assert W.windows(0, 5, 2) == [(0, 0)]


def test_inference_batches_grow_short_rows_and_keep_every_row_once():
    lengths = [4] * 40 + [30] * 6
    got = B.inference_batches(list(range(len(lengths))), lengths, batch_size=4, max_tokens=64)
    assert [i for b in got for i in b] == list(range(len(lengths)))  # every row once, in the given order
    assert len(got[0]) == 16  # short rows: 16 x 4 tokens fill the budget, beyond the batch size of 4
    assert all(len(b) >= 4 for b in got[:-1])  # never fewer rows than asked, whatever the budget
    assert all(len(b) * max(lengths[i] for i in b) <= 64 or len(b) == 4 for b in got)


def test_inference_batches_on_the_cpu_stay_smaller_than_on_an_accelerator():
    lengths = [10] * 5000
    order = list(range(len(lengths)))
    cpu = B.inference_batches(order, lengths, 8, B.inference_tokens(torch.device("cpu")))
    gpu = B.inference_batches(order, lengths, 8, B.inference_tokens(torch.device("cuda")))
    assert max(len(b) for b in cpu) * 10 <= 8192 and len(cpu[0]) == 819  # the CPU's budget, filled
    assert len(gpu[0]) == 3276 and len(gpu) < len(cpu)
    assert B.inference_batches(order, lengths, 1000, 64)[0] == order[:1000]  # never fewer rows than asked


def test_large_inference_batches_give_the_small_batches_outputs(encoder, feats):
    model = _model(encoder)
    small = run_model(model, feats, 0, batch_size=2, bf16=False)
    large = run_model(model, feats, 0, batch_size=64, bf16=False)
    for a, b in zip(small, large):
        assert torch.allclose(torch.as_tensor(a), torch.as_tensor(b), atol=1e-5)


def test_backward_step_returns_each_micro_batch_loss(encoder, feats):
    model = _model(encoder)
    group = [B.collate(feats[i : i + 8], 0) for i in (0, 8)]
    losses = TR.backward_step(model, group, torch.device("cpu"))
    assert losses.shape == (2,) and not losses.requires_grad  # stays on the device: the loop copies it when it logs
    losses = losses.tolist()
    with torch.no_grad():
        assert losses[1] == pytest.approx(float(model(**group[1]).loss), rel=1e-5)


def _losses(encoder, feats, compile_setting: str):
    tp = TrainParams(lr=1e-3, epochs=1, batch_size=8, seeds=[0], precision="fp32", warmup_ratio=0.0,
                     compile=compile_setting)
    torch.manual_seed(0)  # the same fresh head
    model = _model(encoder)
    for m in model.modules():  # compiled dropout draws other random numbers than eager dropout
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
    return TR.train(model, feats, tp, lambda m: (0.0, {}), 0, seed=0), model


@pytest.mark.slow
def test_compiled_finetune_gives_the_eager_losses(tmp_path, zh_tokenizer_dir, feats):
    from bertpipe.infra import execution

    if execution.compiler_missing(torch.device("cpu")):
        pytest.skip("no C++ compiler for Inductor")
    enc = tiny_encoder(tmp_path / "enc1", zh_tokenizer_dir, layers=1, hidden=32)
    (eager, m_eager), (comp, m_comp) = (_losses(enc, feats, s) for s in ("off", "on"))
    assert not eager.compiled and comp.compiled and comp.compile_why == "compile: on"
    assert len({len(f["input_ids"]) for f in feats}) > 2  # length buckets: several shapes went through the graph
    assert eager.steps == comp.steps == 8 and len(comp.losses) == 8
    assert [x for _, x in comp.losses] == pytest.approx([x for _, x in eager.losses], rel=1e-3, abs=1e-4)
    # the model handed back is the eager module (its forward is not compiled), with the same weights
    assert type(m_comp).__name__ == type(m_eager).__name__ and m_comp._compiled_call_impl is None
    for (k, a), b in zip(m_eager.state_dict().items(), m_comp.state_dict().values()):
        assert torch.allclose(a, b, rtol=1e-3, atol=1e-5), k


def test_finetune_compile_on_without_a_compiler_is_one_error_and_auto_stays_eager(encoder, feats, tmp_path, monkeypatch):
    from bertpipe.infra import execution
    from bertpipe.infra.errors import BertpipeError

    monkeypatch.setenv("CXX", str(tmp_path / "no-such-g++"))
    with pytest.raises(BertpipeError) as e:
        _losses(encoder, feats, "on")
    msg = str(e.value)
    assert msg.startswith("finetune.train.compile: on, but torch.compile cannot run") and "no-such-g++" in msg
    assert "\n" not in msg
    res, _ = _losses(encoder, feats[:16], "auto")  # auto without a compiler trains eager
    assert not res.compiled and "no-such-g++" in res.compile_why
    assert execution.should_compile("auto", execution.AUTO_MIN_STEPS, torch.device("cpu"), "k")[0] is False
    monkeypatch.delenv("CXX")
    if not execution.compiler_missing(torch.device("cpu")):  # with a compiler, auto leaves a short finetune eager
        res, _ = _losses(encoder, feats[:16], "auto")
        assert not res.compiled and f"2 steps < {execution.FINETUNE_AUTO_MIN_STEPS}" in res.compile_why


def test_adamw_is_fused_on_the_cpu_and_steps_like_the_per_parameter_loop(encoder, feats):
    from bertpipe.infra.device import adamw

    tp = TrainParams(lr=1e-3, layer_lr_decay=0.5)
    models = [_model(encoder) for _ in range(2)]
    models[1].load_state_dict(models[0].state_dict())
    start = models[0].classifier.weight.detach().clone()
    fused = adamw(layers.param_groups(models[0], tp), lr=tp.lr)
    loop = torch.optim.AdamW(layers.param_groups(models[1], tp), lr=tp.lr)
    assert fused.defaults["fused"] and not loop.defaults["fused"]
    for m in models:
        m.eval()  # no dropout: both models see the same forward
    for i in range(3):
        batch = B.collate(feats[8 * i : 8 * i + 8], 0)
        for m, opt in zip(models, (fused, loop)):
            m(**batch).loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
    a, b = (dict(m.named_parameters()) for m in models)
    assert not torch.allclose(a["classifier.weight"], start)  # the steps moved it
    for k in a:
        assert torch.allclose(a[k], b[k], rtol=1e-4, atol=1e-6), k


def test_fit_takes_the_best_evaluations_dev_scoring_without_scoring_dev_again(encoder, monkeypatch):
    from collections import Counter

    from transformers import AutoTokenizer

    from bertpipe.lib.training.predict import score
    from bertpipe.stages.finetune import fit as FIT

    tok = AutoTokenizer.from_pretrained(str(encoder))
    rows = keyword_classification(48)
    exs = [Example(id=str(r["id"]), text=r["text"], label=r["label"]) for r in rows]
    p = TaskParams(type="classification", format="jsonl", train="x")
    tp = TrainParams(lr=1e-3, epochs=2, batch_size=8, evals_per_epoch=2, seeds=[0], precision="fp32",
                     early_stopping={"patience": 0})
    split = {name: featurize(tok, part, p, tp, {"neg": 0, "pos": 1}, Counter(), name)
             for name, part in (("train", exs[:32]), ("dev", exs[32:]), ("test", []))}
    task = FIT.Task(p, encoder, ["neg", "pos"], split, "macro_f1", 0, torch.device("cpu"), False, 0.5, "t")
    calls = []
    monkeypatch.setattr(FIT, "score", lambda *a, **k: calls.append(1) or score(*a, **k))
    f = FIT.fit(task, tp, seed=0)
    assert len(f.result.evals) == 4 and len(calls) == 4  # one dev pass per evaluation, none after training
    best = next(e for e in f.result.evals if e["step"] == f.result.best_step)
    assert f.dev["macro_f1"] == best["primary"]
    again, _, _ = score(f.model, split["dev"], p, ["neg", "pos"], 0, tp.eval_batch_size, False)
    assert again == f.dev  # the restored weights score what their evaluation scored
