"""Per-layer training of a task model: layer-wise learning-rate decay and gradual unfreezing, by a parameter's depth
in the encoder."""

from __future__ import annotations

import re

import torch

from bertpipe.infra.device import weight_decay_groups
from bertpipe.lib.training.params import TrainParams

_LAYER = re.compile(r"\.layers?\.(\d+)\.")


def n_layers(model: torch.nn.Module) -> int:
    return int(getattr(model.config, "num_hidden_layers", 0))


def depth(name: str, layers: int) -> int:
    """-1 for embeddings, i for encoder layer i, ``layers`` for everything else (pooler, task head)."""
    m = _LAYER.search(name)
    if m:
        return int(m.group(1))
    if "embeddings" in name:
        return -1
    return layers


def trainable(name: str, layers: int, top_layers: int) -> bool:
    """Whether a parameter trains in an unfreezing phase: the head always, plus the top ``top_layers`` layers."""
    if top_layers < 0:
        return True
    d = depth(name, layers)
    return d == layers or (d >= 0 and d >= layers - top_layers)


def param_groups(model: torch.nn.Module, tp: TrainParams) -> list[dict]:
    """AdamW groups: no decay for biases and LayerNorm; lr * decay^(distance from the top) per layer."""
    layers = n_layers(model)
    head_lr = tp.head_lr or tp.lr

    def lr_of(name: str) -> float:
        d = depth(name, layers)
        return head_lr if d == layers else tp.lr * tp.layer_lr_decay ** (layers - d if d >= 0 else layers + 1)

    return weight_decay_groups(model, tp.weight_decay, lr_of)
