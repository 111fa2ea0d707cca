"""The export files that travel with a registered version, and registered versions as local files again.

Every registered version (transformers flavor or bertpipe pyfunc) gets its export stage's files — ``model.onnx``,
``model.int8.onnx``, ``task.json``, ``checks.json``/``checks.md`` — as artifacts of the run that logged it, under
``bertpipe-export/<name>/``; the version's tag ``bertpipe.export_uri`` (``runs:/<run>/bertpipe-export/<name>``)
points at them, and its description lists the checks. ``local_version`` brings a version back as a save_pretrained
dir plus those files, for `bertpipe models predict`.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

from bertpipe.errors import BertpipeError
from bertpipe.stage import read_manifest

EXPORT_ARTIFACTS = "bertpipe-export"
EXPORT_TAG = "bertpipe.export_uri"
FILES = ("model.onnx", "model.int8.onnx", "task.json", "checks.json", "checks.md", "selection.json")


def export_dir_for(model_dir: Path) -> Path | None:
    """The export stage output made from ``model_dir`` (``<stage>/model``): found by the finetune its selection.json
    chose or its manifest's ``model`` input, in the ``export/`` dir of the work tree that holds the model."""
    from bertpipe.training.choice import read_selection

    src = Path(model_dir).resolve().parent
    for anc in list(src.parents)[:4]:
        exp = anc / "export"
        if not exp.is_dir():
            continue
        for d in sorted(exp.iterdir()):
            m = read_manifest(d) or {}
            # a task's export records the finetune it chose (selection.json); a student's, the encoder's: `model`
            path = ((read_selection(d) or {}).get("source")
                    or ((m.get("inputs") or {}).get("model") or {}).get("path"))
            if path and Path(path).resolve() == src and (d / "model.onnx").is_file():
                return d
    return None


def task_files(model_dir: Path, export_dir: Path | None, dest: Path) -> Path:
    """A dir holding task.json (from the export, else derived from the model config) for a pyfunc's artifacts."""
    from bertpipe.inference.predictor import meta_from_config
    from bertpipe.stage import write_json

    dest.mkdir(parents=True, exist_ok=True)
    if export_dir is not None and (export_dir / "task.json").is_file():
        shutil.copy2(export_dir / "task.json", dest / "task.json")
    else:
        write_json(dest / "task.json", meta_from_config(model_dir))
    return dest


def attach_export(mlflow, name: str, version: str, export_dir: Path | None) -> None:
    """Log the export files as artifacts of the active run and point the version's tag at them."""
    client = mlflow.MlflowClient()
    if export_dir is None:
        client.set_model_version_tag(name, version, "bertpipe.export", "none (no export stage output for this model)")
        return
    path = f"{EXPORT_ARTIFACTS}/{name}"
    for f in FILES:
        if (export_dir / f).is_file():
            mlflow.log_artifact(str(export_dir / f), artifact_path=path)
    run_id = mlflow.active_run().info.run_id
    client.set_model_version_tag(name, version, EXPORT_TAG, f"runs:/{run_id}/{path}")
    checks = json.loads((export_dir / "checks.json").read_text(encoding="utf-8"))
    client.set_model_version_tag(name, version, "bertpipe.onnx_max_abs_diff", f"{checks['max_abs_diff']['onnx']:.3g}")


def export_section(client, name: str, version: str) -> str:
    """Markdown for the version's description: the export checks, or why there are none."""
    mv = client.get_model_version(name, version)
    uri = (mv.tags or {}).get(EXPORT_TAG)
    if not uri:
        return "\n## Export\n\nNo ONNX export travels with this version.\n"
    import tempfile

    # Through this client (this project's store), never mlflow's global tracking URI: the section is written
    # outside any fluent_mlflow() block. uri is runs:/<run_id>/<path>.
    run_id, _, path = uri.removeprefix("runs:/").partition("/")
    try:
        with tempfile.TemporaryDirectory() as tmp:
            text = Path(client.download_artifacts(run_id, f"{path}/checks.md", tmp)).read_text(encoding="utf-8")
    except Exception:  # noqa: BLE001 (the files are there; the summary is a convenience)
        text = ""
    return (f"\n## Export (ONNX + int8)\n\nFiles: `{uri}` (model.onnx, model.int8.onnx, task.json, checks.json).\n\n"
            f"{text}")


# ---------------------------------------------------------------- registered versions back as files

_REF = re.compile(r"^(?P<name>[A-Za-z0-9_.-]+)(?:@(?P<alias>[A-Za-z0-9_-]+)|/(?P<version>\d+))?$")


@dataclass
class LocalVersion:
    name: str
    version: str
    model_dir: Path
    files_dir: Path  # task.json, and the ONNX files when the version has them


def resolve(client, ref: str):
    """NAME, NAME@alias or NAME/version -> the model version (NAME alone: the champion)."""
    m = _REF.match(ref.strip())
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
    """Download a version once (cached under paths.state/exported by its identity, ``registry.version_key``: a
    deleted model's v1 is never answered for a new v1)."""
    from bertpipe.register.registry import cache_dir
    from bertpipe.tracking import client as mlflow_client
    from bertpipe.tracking import fluent_mlflow

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
