"""ONNX export, onnxruntime parity checks, int8 dynamic quantization, and inference over torch/ONNX/int8 backends."""
