"""The student's shape and its initial weights.

Same hidden size as the teacher: the student copies the teacher's embeddings, task head and evenly spaced layers
(for half the layers, every other one, as DistilBERT does; the top layer always included, since it feeds the head).
Another hidden size: a fresh model of that config (nothing can be copied across shapes).
"""

from __future__ import annotations

import copy

import torch

from bertpipe.distill.params import DistillParams


def layer_map(teacher_layers: int, student_layers: int) -> list[int]:
    """Teacher layer index each student layer starts from (and is matched to): evenly spaced, ending at the top."""
    return [round((i + 1) * teacher_layers / student_layers) - 1 for i in range(student_layers)]


def student_config(teacher_config, dp: DistillParams):
    c = copy.deepcopy(teacher_config)
    s = dp.student
    layers = s.layers or max(1, round(teacher_config.num_hidden_layers * dp.ratio))
    c.num_hidden_layers = min(layers, teacher_config.num_hidden_layers) if not s.hidden else layers
    if s.hidden and s.hidden != teacher_config.hidden_size:
        c.hidden_size = s.hidden
        c.num_attention_heads = s.heads or max(1, s.hidden // 64)
        c.intermediate_size = s.intermediate or 4 * s.hidden
    else:
        c.num_attention_heads = s.heads or teacher_config.num_attention_heads
        c.intermediate_size = s.intermediate or teacher_config.intermediate_size
    if c.hidden_size % c.num_attention_heads:
        raise ValueError(f"distill.student: hidden {c.hidden_size} is not a multiple of heads {c.num_attention_heads}")
    return c


def _encoder_layers(model: torch.nn.Module):
    base = getattr(model, model.base_model_prefix)
    return base.encoder.layer


def make_student(teacher: torch.nn.Module, dp: DistillParams, seed: int) -> tuple[torch.nn.Module, dict]:
    """(student, how it was initialised)."""
    torch.manual_seed(seed)
    tc = teacher.config
    sc = student_config(tc, dp)
    student = type(teacher)(sc)
    same = (sc.hidden_size == tc.hidden_size and sc.num_attention_heads == tc.num_attention_heads
            and sc.intermediate_size == tc.intermediate_size and sc.num_hidden_layers <= tc.num_hidden_layers)
    info = {"layers": sc.num_hidden_layers, "hidden": sc.hidden_size, "heads": sc.num_attention_heads,
            "intermediate": sc.intermediate_size, "init": "random (shape differs from the teacher)", "layer_map": []}
    if same:
        mapping = layer_map(tc.num_hidden_layers, sc.num_hidden_layers)
        t_state = teacher.state_dict()
        s_state = student.state_dict()
        prefix = f"{teacher.base_model_prefix}.encoder.layer."
        for k in s_state:
            src = k
            if k.startswith(prefix):
                i, rest = k[len(prefix):].split(".", 1)
                src = f"{prefix}{mapping[int(i)]}.{rest}"
            if src in t_state and t_state[src].shape == s_state[k].shape:
                s_state[k] = t_state[src].clone()
        student.load_state_dict(s_state)
        info.update(init="teacher embeddings, head and layers " + ",".join(map(str, mapping)), layer_map=mapping)
    else:
        info["layer_map"] = layer_map(tc.num_hidden_layers, sc.num_hidden_layers)
    return student, info
