"""bertpipe's pyfunc models: QA and NER (transformers 5 has no question-answering pipeline, and the MLflow
transformers flavor's token-classification output is a bare tag string), served from the saved Auto model dir.

``mlflow.pyfunc.load_model("models:/NAME@champion").predict(...)`` returns one item per input row:

- NER, input ``["国务院总理李克强在北京会见了法国总统马克龙。"]``: ``[[{"text", "label", "start", "end", "score"}, ...]]``
  — entities aggregated from word pieces, character offsets into the text (end exclusive);
- QA, input ``{"question": ..., "context": ...}`` (or a DataFrame / list of such rows):
  ``[{"answer", "score", "start", "end"}]`` with character offsets into the context;
- classification (if logged this way): ``[{"label", "score"}]``.

The model carries the bertpipe package (``code_paths``), so loading needs no bertpipe install.
"""

from __future__ import annotations

from pathlib import Path

import mlflow.pyfunc


def to_records(model_input, task_type: str) -> list[dict]:
    """Rows in any form pyfunc users pass: a DataFrame, a list of strings or dicts, one dict, one string."""
    import pandas as pd

    if isinstance(model_input, pd.DataFrame):
        if task_type == "qa":
            return [{"question": str(q), "context": str(c)}
                    for q, c in zip(model_input["question"], model_input["context"])]
        col = "text" if "text" in model_input.columns else model_input.columns[0]
        pairs = model_input["text_pair"] if "text_pair" in model_input.columns else [None] * len(model_input)
        return [{"text": str(t), "text_pair": p} for t, p in zip(model_input[col], pairs)]
    if isinstance(model_input, str):
        return [{"text": model_input}]
    if isinstance(model_input, dict):
        if all(isinstance(v, (list, tuple)) for v in model_input.values()):  # {"question": [...], "context": [...]}
            keys = list(model_input)
            return [dict(zip(keys, vals)) for vals in zip(*model_input.values())]
        return [dict(model_input)]
    return [r if isinstance(r, dict) else {"text": str(r)} for r in model_input]


class TaskModel(mlflow.pyfunc.PythonModel):
    # MLflow asks for type hints on predict (a UserWarning wherever the class is defined: logging and every load);
    # they would make it validate and coerce inputs, but the input here is free-form on purpose (strings, rows, a
    # DataFrame). This is MLflow's own switch for such models (its ChatModel sets it).
    _skip_type_hint_validation = True

    def load_context(self, context):
        from bertpipe.lib.inference.predictor import Predictor

        conf = getattr(context, "model_config", None) or {}
        # device auto: the GPU when the loading machine has one (model_config={"device": "cpu"} to force it)
        self.predictor = Predictor.from_dir(context.artifacts["model"], context.artifacts["files"],
                                            backend=conf.get("backend", "torch"), device=conf.get("device", "auto"))

    def predict(self, context, model_input, params=None):
        return self.predictor.predict(to_records(model_input, self.predictor.type))


# How each pipeline task takes "truncate": MLflow's transformers flavor passes ``model_config`` to every pyfunc predict
# (so `mlflow.pyfunc.load_model(...)` and `mlflow models serve` too); fill-mask only takes tokenizer kwargs.
_TRUNCATE = {"fill-mask": {"tokenizer_kwargs": {"truncation": True}}}


def flavor_long_text(task: str, model_dir: Path, export_dir: Path | None) -> tuple[int, dict]:
    """(tokenizer ``model_max_length``, the flavor's ``model_config``) so that a transformers-flavor version
    truncates long texts at the task's ``max_seq_len`` (task.json; else the model's position table) instead of
    raising a tensor size mismatch past it. The length lives in the saved tokenizer, so the native flavor truncates
    there too when asked the way HF pipelines are (``mlflow.transformers.load_model(uri, truncation=True)`` or
    ``pipe(texts, truncation=True)``). The flavor cannot run bertpipe's head+tail truncation or NER windows; the
    tasks that need them (NER, QA) are registered as the bertpipe pyfunc, which runs ``Predictor``."""
    import json

    from bertpipe.lib.inference.predictor import meta_from_config

    meta_file = export_dir / "task.json" if export_dir is not None else None
    meta = json.loads(meta_file.read_text(encoding="utf-8")) if meta_file is not None and meta_file.is_file() else {}
    # an export's task.json without a length (older exports): the model's own settings say it
    max_len = meta.get("max_seq_len") or meta_from_config(model_dir)["max_seq_len"]
    return int(max_len), dict(_TRUNCATE.get(task, {"truncation": True}))


def log_pyfunc(mlflow, name: str, model_dir: Path, files_dir: Path, input_example, reqs: list[str]) -> str:
    import bertpipe

    info = mlflow.pyfunc.log_model(
        name=name, python_model=TaskModel(), artifacts={"model": str(model_dir), "files": str(files_dir)},
        code_paths=[str(Path(bertpipe.__file__).parent)], input_example=input_example, pip_requirements=reqs,
        registered_model_name=name,
    )
    return str(info.registered_model_version)
