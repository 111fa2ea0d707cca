"""The task heads: which Auto class a task type trains, a fresh head on an encoder, and the transformers pipeline task
a head is logged as."""

from __future__ import annotations

from typing import Any, Sequence

import torch

# The transformers pipeline task of a head class, by class-name suffix: the one map finetune records in metrics.json
# and register logs by (transformers 5 has no question-answering pipeline; register then logs a pyfunc).
PIPELINE_TASKS = {
    "ForSequenceClassification": "text-classification",
    "ForTokenClassification": "token-classification",
    "ForQuestionAnswering": "question-answering",
    "ForMaskedLM": "fill-mask",
}


def pipeline_task_of(class_name: str) -> str | None:
    """``BertForTokenClassification`` -> ``token-classification``; a bare encoder -> ``feature-extraction``."""
    for suffix, task in PIPELINE_TASKS.items():
        if class_name.endswith(suffix):
            return task
    return "feature-extraction" if class_name.endswith("Model") else None


def auto_class(task_type: str):
    import transformers as tf

    return {
        "classification": tf.AutoModelForSequenceClassification,
        "pair_classification": tf.AutoModelForSequenceClassification,
        "ner": tf.AutoModelForTokenClassification,
        "qa": tf.AutoModelForQuestionAnswering,
    }[task_type]


def load_model(task_type: str, encoder: Any, labels: Sequence[str]) -> torch.nn.Module:
    """A fresh head on ``encoder`` (MLM checkpoint, headless encoder or hub id); the head's new weights are expected."""
    from transformers.utils import logging as hf_logging

    kw: dict = {}
    if task_type != "qa":
        kw = {"num_labels": len(labels), "id2label": dict(enumerate(labels)),
              "label2id": {lab: i for i, lab in enumerate(labels)}}
    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # "some weights were newly initialised" is the point of finetuning
    try:
        return auto_class(task_type).from_pretrained(str(encoder), **kw)
    finally:
        hf_logging.set_verbosity(level)


def pipeline_task(task_type: str) -> str | None:
    """The transformers pipeline task of a finetuned model of this type (one map: ``PIPELINE_TASKS``)."""
    return pipeline_task_of(auto_class(task_type).__name__)
