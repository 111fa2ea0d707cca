"""The export files that travel with a registered version.

Every registered version (transformers flavor or bertpipe pyfunc) gets its export stage's files — ``model.onnx``,
``model.int8.onnx``, ``task.json``, ``checks.json``/``checks.md`` — as artifacts of the run that logged it, under
``bertpipe-export/<name>/``; the version's tag ``bertpipe.export_uri`` (``runs:/<run>/bertpipe-export/<name>``)
points at them, and its description lists the checks. ``bertpipe.lib.registered.files.local_version`` brings a version
back as a save_pretrained dir plus those files.
"""

from __future__ import annotations

import json
from pathlib import Path

from bertpipe.core.stage import read_manifest
from bertpipe.lib.registered.files import EXPORT_TAG

EXPORT_ARTIFACTS = "bertpipe-export"
FILES = ("model.onnx", "model.int8.onnx", "task.json", "checks.json", "checks.md", "selection.json")


def export_dir_for(model_dir: Path) -> Path | None:
    """The export stage output made from ``model_dir`` (``<stage>/model``): found by the finetune its selection.json
    chose or its manifest's ``model`` input, in the ``export/`` dir of the work tree that holds the model."""
    from bertpipe.lib.training.choice import read_selection

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
