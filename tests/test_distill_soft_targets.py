"""Distillation uses the teacher's soft targets for every task type: through the finetune loop's
backward step, the student's gradients differ between alpha 0 (hard labels only) and alpha 1 (teacher only), and at
alpha 1 they are the gradients of the temperature-scaled KL to the teacher on the scored positions (a loop that
backpropagated its own hard-label loss, e.g. for NER, would give identical gradients at alpha 0 and 1)."""

from __future__ import annotations

import pytest
import torch

from bertpipe.lib.training.loop import backward_step
from bertpipe.stages.distill.loss import Distiller, soft_loss

torch.set_num_threads(1)
T = 2.0


def _config(num_labels: int):
    from transformers import BertConfig

    return BertConfig(vocab_size=60, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                      intermediate_size=64, max_position_embeddings=32, hidden_dropout_prob=0.0,
                      attention_probs_dropout_prob=0.0, num_labels=num_labels)


def _models(task: str):
    import transformers as tf

    cls = {"classification": tf.BertForSequenceClassification, "ner": tf.BertForTokenClassification,
           "qa": tf.BertForQuestionAnswering}[task]
    n = 2 if task == "qa" else 3  # QA: start and end logits
    torch.manual_seed(1)
    teacher = cls(_config(n))
    torch.manual_seed(2)
    student = cls(_config(n))
    return student, teacher


def _batches(task: str) -> list[dict]:
    """Two micro-batches (an optimizer step with accumulation) with unequal numbers of scored tokens."""
    g = torch.Generator().manual_seed(0)
    out = []
    for rows, scored in ((2, 2), (3, 5)):
        b = {"input_ids": torch.randint(5, 60, (rows, 10), generator=g),
             "attention_mask": torch.ones(rows, 10, dtype=torch.long)}
        if task == "classification":
            b["labels"] = torch.randint(0, 3, (rows,), generator=g)
        elif task == "ner":
            lab = torch.full((rows, 10), -100, dtype=torch.long)
            lab[:, 1 : 1 + scored] = torch.randint(0, 3, (rows, scored), generator=g)
            b["labels"] = lab
        else:
            b["start_positions"] = torch.randint(0, 10, (rows,), generator=g)
            b["end_positions"] = torch.randint(0, 10, (rows,), generator=g)
        out.append(b)
    return out


def _student_grads(task: str, alpha: float) -> torch.Tensor:
    student, teacher = _models(task)
    backward_step(Distiller(student, teacher, T, alpha), _batches(task), torch.device("cpu"))
    return torch.cat([p.grad.flatten() for p in student.parameters() if p.grad is not None])


def _logits(out) -> list[torch.Tensor]:
    return [out.start_logits, out.end_logits] if hasattr(out, "start_logits") else [out.logits]


def _soft_reference(task: str) -> torch.Tensor:
    """The alpha-1 gradient by hand: KL(teacher_T || student_T) * T^2, NER over the step's scored tokens (each
    token weighs the same across micro-batches), classification/QA a mean per micro-batch averaged over the step."""
    student, teacher = _models(task)
    group = _batches(task)
    n_step = sum(int((b["labels"] != -100).sum()) for b in group) if task == "ner" else 0
    inputs = ("input_ids", "attention_mask")
    for b in group:
        s_out = student(**{k: b[k] for k in inputs})
        with torch.no_grad():
            t_out = teacher(**{k: b[k] for k in inputs})
        keep = b["labels"] != -100 if task == "ner" else None
        loss = sum(soft_loss(s, t, T, keep) for s, t in zip(_logits(s_out), _logits(t_out)))
        scale = int(keep.sum()) / n_step if task == "ner" else 1 / len(group)
        (loss * scale).backward()
    return torch.cat([p.grad.flatten() for p in student.parameters() if p.grad is not None])


@pytest.mark.parametrize("task", ["classification", "ner", "qa"])
def test_student_gradients_depend_on_the_teacher(task):
    hard, soft = _student_grads(task, 0.0), _student_grads(task, 1.0)
    assert not torch.allclose(hard, soft, atol=1e-4), f"{task}: alpha 1 trains on the hard labels only"
    assert torch.allclose(soft, _soft_reference(task), atol=1e-5)
