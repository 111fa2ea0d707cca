"""Registered versions as local files: the save_pretrained dir plus the export stage's files that travel with a
version (``model.onnx``, ``model.int8.onnx``, ``task.json``, the checks: artifacts under the run that logged it, which
the version's tag ``bertpipe.export_uri`` points at), for `bertpipe models predict` and the service."""

from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from bertpipe.infra.errors import BertpipeError
from bertpipe.lib.registered.versions import cache_dir

EXPORT_TAG = "bertpipe.export_uri"


def task_files(model_dir: Path, export_dir: Path | None, dest: Path) -> Path:
    """A dir holding task.json (from the export, else derived from the model config) for a pyfunc's artifacts."""
    from bertpipe.core.stage import write_json
    from bertpipe.lib.inference.predictor import meta_from_config

    dest.mkdir(parents=True, exist_ok=True)
    if export_dir is not None and (export_dir / "task.json").is_file():
        shutil.copy2(export_dir / "task.json", dest / "task.json")
    else:
        write_json(dest / "task.json", meta_from_config(model_dir))
    return dest


REF = re.compile(r"^(?P<name>[A-Za-z0-9_.-]+)(?:@(?P<alias>[A-Za-z0-9_-]+)|/(?P<version>\d+))?$")


@dataclass
class LocalVersion:
    name: str
    version: str
    model_dir: Path
    files_dir: Path  # task.json, and the ONNX files when the version has them


def resolve(client, ref: str):
    """NAME, NAME@alias or NAME/version -> the model version (NAME alone: the champion)."""
    m = REF.match(ref.strip())
    if not m:
        raise BertpipeError(f"model {ref!r}: expected NAME, NAME@alias or NAME/version")
    name = m["name"]
    try:
        if m["version"]:
            return client.get_model_version(name, m["version"])
        return client.get_model_version_by_alias(name, m["alias"] or "champion")
    except Exception:
        what = f"version {m['version']}" if m["version"] else f"alias {m['alias'] or 'champion'}"
        raise BertpipeError(f"model {ref!r}: no registered model {name!r} with {what}") from None


def local_version(cfg, ref: str) -> LocalVersion:
    """Download a version once (cached under paths.state/exported by its identity, ``version_key``: a
    deleted model's v1 is never answered for a new v1)."""
    from bertpipe.infra.tracking import client as mlflow_client
    from bertpipe.infra.tracking import fluent_mlflow

    mv = resolve(mlflow_client(cfg, create=False), ref)
    dest = cache_dir(cfg, mv, "-files")
    if (dest / "model" / "config.json").is_file() and (dest / "files" / "task.json").is_file():
        return LocalVersion(mv.name, str(mv.version), dest / "model", dest / "files")
    tmp = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    with fluent_mlflow(cfg) as mlflow:
        got = Path(mlflow.artifacts.download_artifacts(f"models:/{mv.name}/{mv.version}", dst_path=str(tmp / "dl")))
        if (got / "artifacts" / "model" / "config.json").is_file():  # a bertpipe pyfunc
            shutil.move(str(got / "artifacts" / "model"), tmp / "model")
        else:  # transformers flavor: the pipeline's model and tokenizer as a save_pretrained dir
            pipe = mlflow.transformers.load_model(f"models:/{mv.name}/{mv.version}")
            pipe.model.save_pretrained(str(tmp / "model"))
            pipe.tokenizer.save_pretrained(str(tmp / "model"))
        (tmp / "files").mkdir()
        uri = (mv.tags or {}).get(EXPORT_TAG)
        if uri:
            mlflow.artifacts.download_artifacts(uri, dst_path=str(tmp / "files"))
            nested = tmp / "files" / Path(uri).name
            if nested.is_dir():
                for f in nested.iterdir():
                    shutil.move(str(f), tmp / "files" / f.name)
                nested.rmdir()
    if not (tmp / "files" / "task.json").is_file():
        task_files(tmp / "model", None, tmp / "files")
    shutil.rmtree(tmp / "dl", ignore_errors=True)
    if dest.exists():
        shutil.rmtree(dest)
    os.replace(tmp, dest)
    return LocalVersion(mv.name, str(mv.version), dest / "model", dest / "files")
