"""Class imbalance: per-class loss weights from the train split's label counts, and the model wrapper that applies
them (the wrapped model's own loss is unweighted).
"""

from __future__ import annotations

from collections import Counter
from typing import Sequence

import torch


def class_weights(train_labels: Sequence[int], n_labels: int, how: str) -> torch.Tensor | None:
    """``balanced``: n / (k * count_c), as scikit-learn's ``class_weight="balanced"``; ``sqrt``: its square root;
    ``none``: None. A class absent from train gets the largest weight of the present ones."""
    if how == "none" or not train_labels:
        return None
    counts = Counter(train_labels)
    k = len(counts)
    w = [len(train_labels) / (k * counts[c]) if counts.get(c) else 0.0 for c in range(n_labels)]
    top = max(w)
    t = torch.tensor([v if v else top for v in w], dtype=torch.float32)
    return t.sqrt() if how == "sqrt" else t


class WeightedLoss(torch.nn.Module):
    """``model`` whose loss is cross-entropy with per-class weights: what the finetuning loop reads as
    ``model(**batch).loss``. Parameter names keep their layer indices (layer-wise lr decay and unfreezing read
    them); ``inner`` is the model to save."""

    def __init__(self, model: torch.nn.Module, weight: torch.Tensor):
        super().__init__()
        self.inner = model
        self.config = model.config
        self.register_buffer("weight", weight.to(next(model.parameters()).device))

    def forward(self, labels: torch.Tensor | None = None, **batch):
        out = self.inner(**batch)
        if labels is not None:
            logits = out.logits.float()
            out.loss = torch.nn.functional.cross_entropy(logits.view(-1, logits.size(-1)), labels.view(-1),
                                                         weight=self.weight, ignore_index=-100)
        return out


def weighted(model: torch.nn.Module, task_type: str, train_labels: Sequence[int], n_labels: int, how: str
             ) -> torch.nn.Module:
    """The model to train: wrapped with class weights for classification when ``how`` asks for them."""
    if task_type not in ("classification", "pair_classification"):
        return model
    w = class_weights(train_labels, n_labels, how)
    return model if w is None else WeightedLoss(model, w)


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    return model.inner if isinstance(model, WeightedLoss) else model
