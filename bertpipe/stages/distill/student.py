"""The student's shape and its initial weights.

Same hidden size as the teacher: the student copies the teacher's embeddings, task head and evenly spaced layers
(for half the layers, every other one, as DistilBERT does; the top layer always included, since it feeds the head).
Another hidden size: a fresh model of that config (nothing can be copied across shapes).
"""

from __future__ import annotations

import copy
import re

import torch

from bertpipe.stages.distill.params import DistillParams


def layer_map(teacher_layers: int, student_layers: int) -> list[int]:
    """Teacher layer index each student layer starts from (and is matched to): evenly spaced, ending at the top."""
    return [round((i + 1) * teacher_layers / student_layers) - 1 for i in range(student_layers)]


def student_config(teacher_config, dp: DistillParams):
    c = copy.deepcopy(teacher_config)
    s = dp.student
    layers = s.layers or max(1, round(teacher_config.num_hidden_layers * dp.ratio))
    c.num_hidden_layers = min(layers, teacher_config.num_hidden_layers) if not s.hidden else layers
    inter = "intermediate_size" if hasattr(c, "intermediate_size") else "hidden_dim"  # DistilBERT: hidden_dim
    if s.hidden and s.hidden != teacher_config.hidden_size:
        c.hidden_size = s.hidden
        c.num_attention_heads = s.heads or max(1, s.hidden // 64)
        setattr(c, inter, s.intermediate or 4 * s.hidden)
    else:
        c.num_attention_heads = s.heads or teacher_config.num_attention_heads
        setattr(c, inter, s.intermediate or getattr(teacher_config, inter))
    if c.hidden_size % c.num_attention_heads:
        raise ValueError(f"distill.student: hidden {c.hidden_size} is not a multiple of heads {c.num_attention_heads}")
    return c


_LAYER_KEY = re.compile(r"^(\w+\.(?:encoder|transformer)\.layer)\.(\d+)\.(.*)$")


def make_student(teacher: torch.nn.Module, dp: DistillParams, seed: int) -> tuple[torch.nn.Module, dict]:
    """(student, how it was initialised)."""
    torch.manual_seed(seed)
    tc = teacher.config
    sc = student_config(tc, dp)
    student = type(teacher)(sc)
    inter = "intermediate_size" if hasattr(sc, "intermediate_size") else "hidden_dim"
    same = (sc.hidden_size == tc.hidden_size and sc.num_attention_heads == tc.num_attention_heads
            and getattr(sc, inter) == getattr(tc, inter) and sc.num_hidden_layers <= tc.num_hidden_layers)
    info = {"layers": sc.num_hidden_layers, "hidden": sc.hidden_size, "heads": sc.num_attention_heads,
            "intermediate": getattr(sc, inter), "init": "random (shape differs from the teacher)", "layer_map": []}
    if same:
        mapping = layer_map(tc.num_hidden_layers, sc.num_hidden_layers)
        t_state = teacher.state_dict()
        s_state = student.state_dict()
        for k in s_state:
            src = k
            # BERT-likes: <base>.encoder.layer.N., DistilBERT: distilbert.transformer.layer.N.; ALBERT shares one
            # layer group across depth (no N: copied as it is).
            m = _LAYER_KEY.match(k)
            if m:
                src = f"{m[1]}.{mapping[int(m[2])]}.{m[3]}"
            if src in t_state and t_state[src].shape == s_state[k].shape:
                s_state[k] = t_state[src].clone()
        student.load_state_dict(s_state)
        info.update(init="teacher embeddings, head and layers " + ",".join(map(str, mapping)), layer_map=mapping)
    else:
        info["layer_map"] = layer_map(tc.num_hidden_layers, sc.num_hidden_layers)
    return student, info
