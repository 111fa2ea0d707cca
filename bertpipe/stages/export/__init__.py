"""ONNX export, onnxruntime parity checks and int8 dynamic quantization of a model register will log."""
