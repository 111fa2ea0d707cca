"""The distillation objective wrapped as a model, so the training loop (``bertpipe.lib.training.loop.train``) trains a
student unchanged: its ``forward(**batch).loss`` is

    alpha * T^2 * KL(softmax(teacher / T) || softmax(student / T)) + (1 - alpha) * hard-label loss
    + hidden_weight * MSE(student hidden states, projected; mapped teacher hidden states)

Only the student (and the hidden-state projection) are registered parameters: the optimiser, the layer-wise
learning rates and the best-state snapshot see the student alone; the teacher runs frozen, in eval mode.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch
import torch.nn.functional as F


def _logit_pairs(out) -> list[torch.Tensor]:
    if getattr(out, "start_logits", None) is not None:
        return [out.start_logits, out.end_logits]
    return [out.logits]


def soft_loss(student: torch.Tensor, teacher: torch.Tensor, temperature: float, keep: torch.Tensor | None
              ) -> torch.Tensor:
    """KL at temperature T scaled by T^2 (Hinton et al.), averaged over the rows ``keep`` selects."""
    s = student.float().reshape(-1, student.shape[-1])
    t = teacher.float().reshape(-1, teacher.shape[-1])
    if keep is not None:
        s, t = s[keep.reshape(-1)], t[keep.reshape(-1)]
    if s.shape[0] == 0:
        return student.sum() * 0.0
    kl = F.kl_div(F.log_softmax(s / temperature, -1), F.log_softmax(t / temperature, -1), log_target=True,
                  reduction="batchmean")
    return kl * temperature**2


class Distiller(torch.nn.Module):
    def __init__(self, student: torch.nn.Module, teacher: torch.nn.Module, temperature: float, alpha: float,
                 hidden_weight: float = 0.0, layer_map: list[int] | None = None):
        super().__init__()
        self.student = student
        self.config = student.config  # the loop reads num_hidden_layers for layer-wise lr
        object.__setattr__(self, "_teacher", teacher.eval())  # not a submodule: never optimised or snapshotted
        for p in teacher.parameters():
            p.requires_grad_(False)
        self.temperature, self.alpha, self.hidden_weight = temperature, alpha, hidden_weight
        self.layer_map = layer_map or []
        if hidden_weight > 0 and student.config.hidden_size != teacher.config.hidden_size:
            self.proj = torch.nn.Linear(student.config.hidden_size, teacher.config.hidden_size)
        else:
            self.proj = None

    def forward(self, **batch):
        want_hidden = self.hidden_weight > 0
        inputs = {k: v for k, v in batch.items() if k in ("input_ids", "attention_mask", "token_type_ids")}
        with torch.no_grad():
            t_out = self._teacher(**inputs, output_hidden_states=want_hidden)
        s_out = self.student(**batch, output_hidden_states=want_hidden)
        labels = batch.get("labels")
        # Token labels: only the scored pieces. QA: each row is one distribution over the window's positions.
        keep = labels != -100 if labels is not None and labels.dim() == 2 else None
        soft = sum(soft_loss(s, t, self.temperature, keep) for s, t in zip(_logit_pairs(s_out), _logit_pairs(t_out)))
        loss = self.alpha * soft
        if s_out.loss is not None and self.alpha < 1.0:
            loss = loss + (1.0 - self.alpha) * s_out.loss
        if want_hidden:
            mask = batch["attention_mask"].unsqueeze(-1).float()
            mse = 0.0
            pairs = [(0, 0)] + [(i + 1, t + 1) for i, t in enumerate(self.layer_map)]  # embeddings, then layers
            for si, ti in pairs:
                h = s_out.hidden_states[si]
                if self.proj is not None:
                    h = self.proj(h)
                mse = mse + (((h - t_out.hidden_states[ti]) ** 2) * mask).sum() / (mask.sum() * h.shape[-1])
            loss = loss + self.hidden_weight * mse / len(pairs)
        return SimpleNamespace(loss=loss, logits=getattr(s_out, "logits", None))
