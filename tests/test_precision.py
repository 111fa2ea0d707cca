"""The precision policy (bertpipe/infra/device.py) as a table, capabilities -> choice, and the fp16 + GradScaler step on
the CPU (torch allows CPU fp16 autocast and a CPU GradScaler)."""

from __future__ import annotations

import pytest
import torch

from bertpipe.infra.device import Caps, Precision, choose_precision, cpu_bf16_flags, grad_scaler

A100 = Caps("cuda", (8, 0), name="A100")
H100 = Caps("cuda", (9, 0), name="H100")
T4 = Caps("cuda", (7, 5), name="T4")
V100 = Caps("cuda", (7, 0), name="V100")
P100 = Caps("cuda", (6, 0), name="P100")
SAPPHIRE = Caps("cpu", cpu_bf16=True, name="Xeon 8480")  # AMX
EPYC = Caps("cpu", cpu_bf16=False, name="EPYC")
MPS = Caps("mps")

TABLE = [
    # (request, caps, dtype, tf32, scaled)
    ("auto", A100, "bf16", True, False),
    ("auto", H100, "bf16", True, False),
    ("auto", T4, "fp16", False, True),  # is_bf16_supported() says True on a T4 (emulation): not asked
    ("auto", V100, "fp16", False, True),
    ("auto", P100, "fp16", False, True),
    ("auto", SAPPHIRE, "bf16", False, False),
    ("auto", EPYC, "fp32", False, False),
    ("auto", MPS, "fp32", False, False),
    ("fp32", A100, "fp32", True, False),  # TF32 matmuls still on Ampere
    ("fp32", T4, "fp32", False, False),
    ("fp16", A100, "fp16", True, True),
    ("bf16", T4, "bf16", False, False),  # honoured, reason says emulated
    ("bf16", EPYC, "bf16", False, False),
    ("fp16", EPYC, "fp16", False, True),
    ("fp32", SAPPHIRE, "fp32", False, False),
]


@pytest.mark.parametrize("request_, caps, dtype, tf32, scaled", TABLE)
def test_policy_table(request_, caps, dtype, tf32, scaled):
    p = choose_precision(request_, caps)
    assert (p.dtype, p.tf32, p.scaled) == (dtype, tf32, scaled)
    assert p.record()["precision_reason"] == p.reason and p.reason


def test_reasons_say_why():
    assert "7.5" in choose_precision("auto", T4).reason and "GradScaler" in choose_precision("auto", T4).reason
    assert "emulated" in choose_precision("bf16", T4).reason
    assert "emulated" in choose_precision("bf16", EPYC).reason
    assert "emulated" not in choose_precision("bf16", A100).reason
    assert choose_precision("auto", A100).record() == {"precision": "bf16+tf32",
                                                       "precision_reason": choose_precision("auto", A100).reason}


def test_unknown_request_refused():
    with pytest.raises(ValueError, match="auto, bf16, fp16, fp32"):
        choose_precision("int8", A100)


@pytest.mark.parametrize("flags, has", [
    ({"avx2", "avx512f", "avx512bw"}, False),  # AVX512 without BF16: emulation through fp32
    ({"avx512f", "avx512_bf16"}, True),  # Cooper Lake, Zen 4
    ({"avx512f", "amx_bf16", "amx_tile"}, True),  # Sapphire Rapids
    ({"avx2", "fma"}, False),
])
def test_cpu_bf16_from_cpuinfo_flags(flags, has):
    assert cpu_bf16_flags(flags) is has


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 3))


def test_fp16_gradscaler_step_on_cpu():
    """One fp16 autocast + GradScaler step: the loss is scaled (gradients before unscale are scale x the fp32 ones,
    up to fp16 rounding), unscale_ restores them, and the step moves the weights as the fp32 step does."""
    x, y = torch.randn(32, 8, generator=torch.Generator().manual_seed(1)), torch.arange(32) % 3
    ref = _model()
    opt_ref = torch.optim.SGD(ref.parameters(), lr=0.1)
    torch.nn.functional.cross_entropy(ref(x), y).backward()
    g_ref = ref[0].weight.grad.clone()
    opt_ref.step()

    m = _model()
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    prec = Precision("fp16", "test")
    scaler = grad_scaler(torch.device("cpu"), prec)
    assert scaler.is_enabled()
    with torch.autocast("cpu", dtype=prec.autocast):
        out = m(x)
    assert out.dtype == torch.float16
    scaler.scale(torch.nn.functional.cross_entropy(out.float(), y)).backward()
    scale = scaler.get_scale()
    assert scale > 1
    assert torch.allclose(m[0].weight.grad / scale, g_ref, atol=2e-3)
    scaler.unscale_(opt)
    assert torch.allclose(m[0].weight.grad, g_ref, atol=2e-3)
    scaler.step(opt)
    scaler.update()
    assert torch.allclose(m[0].weight, ref[0].weight, atol=1e-3)


def test_fp16_overflow_skips_the_step():
    m = _model()
    before = [p.detach().clone() for p in m.parameters()]
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    scaler = grad_scaler(torch.device("cpu"), Precision("fp16", "test"))
    with torch.autocast("cpu", dtype=torch.float16):
        out = m(torch.randn(4, 8))
    (scaler.scale(out.float().sum()) * float("inf")).backward()
    start = scaler.get_scale()
    scaler.step(opt)
    scaler.update()
    assert all(torch.equal(a, b) for a, b in zip(before, m.parameters()))
    assert scaler.get_scale() < start


def test_disabled_scaler_passes_fp32_through():
    s = grad_scaler(torch.device("cpu"), Precision("fp32", "test"))
    loss = torch.tensor(2.0)
    assert not s.is_enabled() and s.scale(loss) is loss


def _tiny_finetune(precision: str):
    import itertools

    from transformers import BertConfig, BertForSequenceClassification

    from bertpipe.lib.training.loop import train
    from bertpipe.lib.training.params import TrainParams

    torch.manual_seed(0)
    cfg = BertConfig(vocab_size=40, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                     max_position_embeddings=32, num_labels=2)
    model = BertForSequenceClassification(cfg)
    g = torch.Generator().manual_seed(0)
    feats = []
    for i in range(64):  # label 0 draws tokens 5..19, label 1 tokens 20..34
        label = i % 2
        ids = [2] + torch.randint(5 + 15 * label, 20 + 15 * label, (8,), generator=g).tolist() + [3]
        feats.append({"input_ids": ids, "labels": label})
    tp = TrainParams(lr=3e-3, epochs=8, batch_size=16, precision=precision, warmup_ratio=0.0)
    better = itertools.count()  # every evaluation "improves": no early stop
    return train(model, feats, tp, lambda m: (next(better), {}), pad_id=0, seed=0)


def test_finetune_loop_trains_in_fp16_on_cpu():
    """The finetune loop end to end in fp16 (autocast + GradScaler) on a tiny classifier: it learns as the fp32 run
    does (same data, seed, schedule), and the result says fp16."""
    fp16, fp32 = _tiny_finetune("fp16"), _tiny_finetune("fp32")
    assert fp16.precision.dtype == "fp16" and fp16.precision.scaled and not fp16.bf16
    assert fp32.precision.dtype == "fp32"
    assert fp32.losses[-1][1] < 0.8 * fp32.losses[0][1]
    assert abs(fp16.losses[-1][1] - fp32.losses[-1][1]) < 0.01
