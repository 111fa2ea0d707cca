"""The model behind a backend: torch (the saved dir), ONNX or int8 (an onnxruntime session behind the slice of the
torch module interface ``bertpipe.lib.training.predict.run_model`` uses), so every backend is scored by the same
code."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

from bertpipe.infra.errors import BertpipeError

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
    name = {"onnx": ONNX_FILE, "int8": INT8_FILE}.get(backend)
    if name is None:
        raise BertpipeError(f"--backend {backend}: expected torch, onnx or int8")
    path = Path(onnx_dir or model_dir) / name
    if not path.is_file():
        raise BertpipeError(f"{path}: no {backend} export (run `bertpipe export` before registering)")
    return OrtModel(path, threads, device)
