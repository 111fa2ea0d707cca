"""ONNX export of a saved model dir and its int8 dynamic quantization (the files ``bertpipe.lib.inference.backends``
loads, scored by the same code as torch).

Exporter: ``torch.onnx.export(..., dynamo=False)`` with ``dynamic_axes`` (the TorchScript exporter). torch 2.13's
default dynamo exporter needs onnxscript and ``torch.export`` shape specs; the TorchScript path exports the BERT
family with batch and sequence left dynamic, and its fp32 graph matches eager torch to ~1e-6 including padding.
"""

from __future__ import annotations

import warnings
from pathlib import Path

import torch

from bertpipe.lib.inference.backends import load_torch, model_kind


def output_names(kind: str) -> list[str]:
    return {"qa": ["start_logits", "end_logits"], "encoder": ["last_hidden_state"]}.get(kind, ["logits"])


class _Outputs(torch.nn.Module):
    """Plain tuple outputs with fixed names (ModelOutput dicts do not trace into stable ONNX outputs)."""

    def __init__(self, model, names):
        super().__init__()
        self.model, self.names = model, names

    def forward(self, input_ids, attention_mask, token_type_ids=None):
        kw = {"input_ids": input_ids, "attention_mask": attention_mask}
        if token_type_ids is not None:
            kw["token_type_ids"] = token_type_ids
        out = self.model(**kw)
        return tuple(out[n] for n in self.names)


def export_onnx(model_dir: Path | str, path: Path, opset: int = 17) -> dict:
    """Write ``path`` (weights inside the file); returns {kind, inputs, outputs}."""
    from transformers import AutoTokenizer

    model = load_torch(model_dir)
    kind = model_kind(model_dir)
    names = output_names(kind)
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    inputs = ["input_ids", "attention_mask"] + (["token_type_ids"] if "token_type_ids" in tok.model_input_names
                                                 else [])
    ids = torch.full((2, 8), tok.unk_token_id or 1, dtype=torch.long)
    args = tuple([ids, torch.ones_like(ids)] + ([torch.zeros_like(ids)] if len(inputs) == 3 else []))
    axes = {n: {0: "batch", 1: "sequence"} for n in inputs}
    for n in names:
        axes[n] = {0: "batch"} if kind == "classification" else {0: "batch", 1: "sequence"}
    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")  # tracer warnings about python-level shape checks in transformers
        torch.onnx.export(_Outputs(model, names), args, str(path), input_names=inputs, output_names=names,
                          dynamic_axes=axes, opset_version=opset, dynamo=False, do_constant_folding=True)
    return {"kind": kind, "inputs": inputs, "outputs": names}


def quantize_int8(src: Path, dst: Path, per_channel: bool = False) -> None:
    """Dynamic quantization: int8 weights for MatMul/Gemm, activations quantized on the fly (no calibration data)."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quantize_dynamic(str(src), str(dst), weight_type=QuantType.QInt8, per_channel=per_channel)
