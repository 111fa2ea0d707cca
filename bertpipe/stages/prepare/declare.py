"""The prepare stage's declaration (see ``bertpipe.core.declared``): the corpora, cleaned, deduplicated and split."""

from __future__ import annotations

from pathlib import Path

from pydantic import ValidationError

from bertpipe.core.declared import Family
from bertpipe.core.stage import Stage, deferred
from bertpipe.infra.config import Config, format_validation
from bertpipe.infra.errors import BertpipeError
from bertpipe.lib.layout import task_eval_files
from bertpipe.stages.prepare.params import PrepareParams, SourceParams
from bertpipe.stages.prepare.sources import own_inputs

VERSION = "2"  # 2: finetune tasks' dev/test texts are excluded


def prepare_stage() -> Stage:
    def inputs(cfg: Config) -> dict:
        return {**own_inputs(cfg), **task_eval_files(cfg)}

    return Stage("prepare", VERSION, ("prepare",), inputs, lambda c: c.work / "prepare",
                 deferred("bertpipe.stages.prepare.stage:build"), code=("prepare",),
                 libs=("datasketch", "jieba", "numpy", "pyarrow", "scipy"))


def with_incoming(params, root: Path, source: str):
    """Append the drop dir as a domain source when it holds new files (see FlowParams.drop_dir), for every front
    door alike."""
    drop = Path(params.flow.drop_dir)
    drop = drop if drop.is_absolute() else root / drop
    tmpl = dict(params.flow.incoming_source)
    if not drop.is_dir() or not any(f.is_file() and not f.name.startswith(".") for f in drop.glob(tmpl.get("glob", "*"))):
        return params
    try:
        src = SourceParams.model_validate({**tmpl, "path": str(drop)})
    except ValidationError as e:
        raise BertpipeError(format_validation(e, f"{source}: flow.incoming_source")) from None
    if any(Path(s.path) == Path(src.path) or s.path == params.flow.drop_dir for s in params.prepare.domain.sources):
        return params
    params.prepare.domain.sources.append(src)
    return params


PREPARE = Family("prepare", "Ingest, clean, deduplicate and split the raw corpora into work/prepare (the tasks' "
                 "dev/test texts excluded).", lambda c: [prepare_stage()], params={"prepare": PrepareParams},
                 on_load=with_incoming)
