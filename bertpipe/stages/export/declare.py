"""The export stages' declaration (see ``bertpipe.core.declared``): one per model register logs."""

from __future__ import annotations

from bertpipe.core.codeid import MODEL_LIBS
from bertpipe.core.declared import Family
from bertpipe.core.stage import Stage, deferred
from bertpipe.infra.config import Config
from bertpipe.lib.labelled import reader_spec
from bertpipe.lib.layout import corpus_dir, export_out, export_targets, task_dir
from bertpipe.stages.export.params import ExportParams

VERSION = "1"


def export_stage(key: str) -> Stage:
    # Keys are "<task>", "<task>-student" or "encoder" (see bertpipe.lib.layout.export_targets).
    task = None if key == "encoder" else key.removesuffix("-student")

    def inputs(cfg: Config) -> dict:
        src = export_targets(cfg)[key][1]
        # a task model is checked on its test split, the encoder on domain texts
        return {**src, "task": task_dir(cfg, task)} if task else {**src, "corpus": corpus_dir(cfg, "domain")}

    sections = ("export", "finetune.train", f"finetune.tasks.{task}") if task else ("export",)
    return Stage(f"export/{key}", VERSION, sections, inputs, lambda c: export_out(c, key),
                 deferred("bertpipe.stages.export.stage:build", key=key, task=task), params_section="export",
                 code=("export",), libs=(*MODEL_LIBS, "numpy", "onnx", "onnxruntime"), cli=("export", "--model", key),
                 task=task, model=key,
                 spec=(lambda c: {"export": c.params.export, **reader_spec(c, task)}) if task else None)


EXPORT = Family("export", "Export models register will log to ONNX + int8, checked against torch (or --model KEY).",
                lambda c: [export_stage(k) for k in export_targets(c)], ("model",), params={"export": ExportParams})
