"""Params of the export stage (`export:` in params.yaml)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class ExportParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    enabled: bool = True
    opset: int = Field(17, ge=13, le=23)
    quantize: bool = True  # also write model.int8.onnx (onnxruntime dynamic quantization, int8 weights)
    per_channel: bool = False
    # Parity: the largest |torch - onnxruntime| logit difference allowed for the fp32 export.
    atol: float = Field(1e-3, gt=0.0, le=10.0)
    # Examples of the task's test split scored per backend (0 = all); the encoder uses valid-split texts.
    max_examples: int = Field(0, ge=0)
    batch_size: int = Field(32, ge=1, le=4096)
