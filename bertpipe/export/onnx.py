"""ONNX export of a saved model dir, int8 dynamic quantization, and an onnxruntime session that quacks like the torch
model for ``bertpipe.finetune.heads.run_model``/``score`` — so ONNX and int8 are scored by the same code as torch.

Exporter: ``torch.onnx.export(..., dynamo=False)`` with ``dynamic_axes`` (the TorchScript exporter). torch 2.13's
default dynamo exporter needs onnxscript and ``torch.export`` shape specs; the TorchScript path exports the BERT
family with batch and sequence left dynamic, and its fp32 graph matches eager torch to ~1e-6 including padding.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

ONNX_FILE = "model.onnx"
INT8_FILE = "model.int8.onnx"


def model_kind(model_dir: Path | str) -> str:
    """classification | ner | qa | mlm | encoder, from the saved architecture."""
    arch = (json.loads((Path(model_dir) / "config.json").read_text()).get("architectures") or [""])[0]
    for suffix, kind in (("ForSequenceClassification", "classification"), ("ForTokenClassification", "ner"),
                         ("ForQuestionAnswering", "qa"), ("ForMaskedLM", "mlm")):
        if arch.endswith(suffix):
            return kind
    return "encoder"


def load_torch(model_dir: Path | str):
    import transformers as tf

    cls = {"classification": tf.AutoModelForSequenceClassification, "ner": tf.AutoModelForTokenClassification,
           "qa": tf.AutoModelForQuestionAnswering, "mlm": tf.AutoModelForMaskedLM,
           "encoder": tf.AutoModel}[model_kind(model_dir)]
    return cls.from_pretrained(str(model_dir)).eval()


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


def providers(device: str = "auto") -> list[str]:
    """onnxruntime's CUDA provider when this onnxruntime build has it (and the device is not ``cpu``), else the
    CPU's. The CPU provider stays listed after CUDA: onnxruntime places the few ops CUDA lacks there."""
    import onnxruntime as ort

    if device != "cpu" and "CUDAExecutionProvider" in ort.get_available_providers():
        return ["CUDAExecutionProvider", "CPUExecutionProvider"]
    return ["CPUExecutionProvider"]


def session(path: Path | str, threads: int = 0, device: str = "auto"):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = threads or torch.get_num_threads()
    so.inter_op_num_threads = 1
    so.log_severity_level = 3
    return ort.InferenceSession(str(path), so, providers=providers(device))


class OrtModel:
    """An onnxruntime session behind the slice of the torch module interface the scoring code uses."""

    training = False

    def __init__(self, path: Path | str, threads: int = 0, device: str = "auto"):
        self.sess = session(path, threads, device)
        self.inputs = [i.name for i in self.sess.get_inputs()]
        self.outputs = [o.name for o in self.sess.get_outputs()]
        self._device = torch.zeros(0)

    def parameters(self):
        yield self._device  # run_model reads the device from the first parameter

    def eval(self):
        return self

    def train(self, mode: bool = True):
        return self

    def __call__(self, **batch):
        feed = {k: np.asarray(v.cpu().numpy() if hasattr(v, "numpy") else v, dtype=np.int64)
                for k, v in batch.items() if k in self.inputs}
        if "token_type_ids" in self.inputs and "token_type_ids" not in feed:
            feed["token_type_ids"] = np.zeros_like(feed["input_ids"])
        res = self.sess.run(self.outputs, feed)
        return SimpleNamespace(**{n: torch.from_numpy(r) for n, r in zip(self.outputs, res)})


def backend_model(model_dir: Path | str, backend: str, onnx_dir: Path | str | None = None, threads: int = 0,
                  device: str = "cpu"):
    """The model for ``backend`` (torch | onnx | int8) on ``device``; ONNX files are looked up in ``onnx_dir``
    (default model_dir)."""
    if backend == "torch":
        return load_torch(model_dir).to(device)
    from bertpipe.errors import BertpipeError

    name = {"onnx": ONNX_FILE, "int8": INT8_FILE}.get(backend)
    if name is None:
        raise BertpipeError(f"--backend {backend}: expected torch, onnx or int8")
    path = Path(onnx_dir or model_dir) / name
    if not path.is_file():
        raise BertpipeError(f"{path}: no {backend} export (run `bertpipe export` before registering)")
    return OrtModel(path, threads, device)
