"""Inference on unlabelled input with a saved task head: the torch/ONNX/int8 backends, the predictor that turns
records into user-facing predictions, batch prediction over a file, and speed measurement. Stages and services
import it."""
