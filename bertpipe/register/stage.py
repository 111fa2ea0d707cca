"""register: log each finetuned model (and the adapted encoder) with the MLflow transformers flavor, register a new
version, write its model card, and move the champion/challenger aliases."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from bertpipe.errors import BertpipeError
from bertpipe.register.artifacts import export_section
from bertpipe.register.registry import decide
from bertpipe.stage import StageContext, read_manifest, write_json

VERSION = "1"

PIPELINE_TASKS = {
    "ForSequenceClassification": "text-classification",
    "ForTokenClassification": "token-classification",
    "ForQuestionAnswering": "question-answering",
    "ForMaskedLM": "fill-mask",
}


def own_inputs(cfg) -> dict:
    return {}


def pipeline_task(model_dir: Path) -> str:
    arch = (json.loads((model_dir / "config.json").read_text()).get("architectures") or [""])[0]
    for suffix, task in PIPELINE_TASKS.items():
        if arch.endswith(suffix):
            return task
    if arch.endswith("Model"):
        return "feature-extraction"
    raise BertpipeError(f"{model_dir}/config.json: architecture {arch!r} has no pipeline task bertpipe can register")


def input_example(task: str, language: str):
    text = "本法所称的发明创造是指发明、实用新型和外观设计。" if language == "zh" else "The court shall hear the case."
    if task == "question-answering":
        q = "发明创造是指什么？" if language == "zh" else "What shall the court do?"
        return {"question": q, "context": text}
    if task == "fill-mask":
        return [text[:6] + "[MASK]" + text[7:]]
    return [text]


def primary_result(metrics: dict) -> tuple[str, float]:
    """(primary metric name, test value averaged over seeds) from a finetune stage's metrics.json."""
    name = metrics.get("primary")
    if not name:
        raise BertpipeError("finetune metrics.json: key 'primary' (the primary metric name) is missing")
    test = (metrics.get("summary") or {}).get("test") or metrics.get("test") or {}
    value = test.get(name)
    if isinstance(value, dict) and "mean" in value:
        return name, float(value["mean"])
    if isinstance(value, (int, float)):
        return name, float(value)
    raise BertpipeError(f"finetune metrics.json: summary.test.{name} (the primary metric) is missing")


def test_set_hash(ft_dir: Path) -> str:
    """Identity of the test set a model was scored on: the finetune task's input data and task params."""
    m = read_manifest(ft_dir) or {}
    inputs = {k: v.get("digest") for k, v in (m.get("inputs") or {}).items() if k != "encoder"}
    params = m.get("params") or {}
    task_params = {k: v for k, v in params.items() if k.startswith("finetune.tasks")}
    # The evaluation cap picks which test examples are scored, so it is part of the test set's identity.
    cap = (params.get("finetune.train") or {}).get("max_eval_examples")
    blob = json.dumps({"inputs": inputs, "task": task_params, "max_eval_examples": cap}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


def model_card(name: str, task: str, metric: str, value: float, lineage: dict, eval_table: str, decision: str) -> str:
    rows = "\n".join(f"| {k} | `{v}` |" for k, v in lineage.items())
    return (
        f"# {name}\n\nbertpipe {task} model. Primary test metric **{metric} = {value:.4f}**.\n\n"
        f"Decision: {decision}\n\n## Base vs adapted\n\n{eval_table or '(no evaluate report)'}\n\n"
        f"## Lineage\n\n| what | value |\n|---|---|\n{rows}\n"
    )


def _eval_table(evaluate_dir: Path, task: str | None) -> str:
    try:
        ev = json.loads((evaluate_dir / "metrics.json").read_text())
    except (OSError, ValueError):
        return ""
    tasks = ev.get("tasks", {})
    lines = ["| task | metric | base | adapted | delta |", "|---|---|---|---|---|"]
    for t, res in tasks.items():
        if task and t != task:
            continue
        for metric, base in (res.get("base") or {}).items():
            ad = (res.get("adapted") or {}).get(metric)
            if not isinstance(base, dict) or not isinstance(ad, dict):
                continue
            lines.append(f"| {t} | {metric} | {base.get('mean', float('nan')):.4f} ± {base.get('std', 0):.4f} | "
                         f"{ad.get('mean', float('nan')):.4f} ± {ad.get('std', 0):.4f} | "
                         f"{ad.get('mean', 0) - base.get('mean', 0):+.4f} |")
    return "\n".join(lines) if len(lines) > 2 else ""


def lineage(ctx: StageContext, ft_dir: Path | None) -> dict:
    from bertpipe.tracking import git_commit

    cfg = ctx.cfg
    out = {"git commit": git_commit(cfg.root) or "(not a git checkout)", "base model": cfg.params.model.base,
           "profile": cfg.params.profile or "(none)"}
    for stage in ("prepare", "base", "vocab", "pretrain", "evaluate"):
        m = read_manifest(cfg.work / stage)
        if m:
            out[f"{stage} fingerprint"] = m["fingerprint"]
    if ft_dir is not None and read_manifest(ft_dir):
        out["finetune fingerprint"] = read_manifest(ft_dir)["fingerprint"]
    sources = cfg.raw / "SOURCES.json"
    if sources.exists():
        for name, rec in json.loads(sources.read_text()).items():
            out[f"data {name}"] = rec.get("package", "")
    dvc_file = cfg.raw.with_suffix(".dvc") if cfg.raw.name else None
    if dvc_file is not None and dvc_file.exists():
        for line in dvc_file.read_text().splitlines():
            if "md5:" in line:
                out["data DVC md5"] = line.split("md5:")[1].strip()
                break
    return out


def _rescore_champion(cfg, client, name: str, thash: str) -> float | None:
    """When the champion encoder was scored on another valid split (new data arrived), score it again on this one,
    so challenger and champion are compared on the same held-out text."""
    from bertpipe.register.registry import current_champion, export_model

    champ = current_champion(client, name)
    if champ is None or (champ.tags or {}).get("bertpipe.test_hash") == thash:
        return None
    from bertpipe.evaluate.fair_mlm import encoder_gate_score

    exported = export_model(cfg, name)
    return encoder_gate_score(exported, cfg)[1] if exported is not None else None


def _log_and_register(mlflow, name: str, model_dir: Path, task: str, language: str, reqs: list[str]):
    import tempfile

    from bertpipe.register import artifacts as A

    export_dir = A.export_dir_for(model_dir)
    if task in ("question-answering", "token-classification"):
        # pyfunc: QA has no transformers 5 pipeline; NER users want entities, not the flavor's bare tag string.
        from bertpipe.register.pyfunc import log_pyfunc

        with tempfile.TemporaryDirectory() as tmp:
            files = A.task_files(model_dir, export_dir, Path(tmp) / "files")
            version = log_pyfunc(mlflow, name, model_dir, files, input_example(task, language), reqs)
    else:
        from transformers import AutoTokenizer, pipeline

        tok = AutoTokenizer.from_pretrained(str(model_dir))
        pipe = pipeline(task, model=str(model_dir), tokenizer=tok)
        info = mlflow.transformers.log_model(
            pipe, name=name, task=task, input_example=input_example(task, language),
            pip_requirements=reqs, registered_model_name=name,
        )
        version = str(info.registered_model_version)
    A.attach_export(mlflow, name, version, export_dir)
    return version


def build(ctx: StageContext) -> dict:
    from bertpipe.tracking import client as mlflow_client
    from bertpipe.tracking import experiment_id, fluent_mlflow, tracking_uri

    cfg, p = ctx.cfg, ctx.params
    uri = tracking_uri(cfg)
    client = mlflow_client(cfg)
    language = cfg.params.model.language
    evaluate_dir = Path(ctx.inputs["evaluate"])
    candidates: list[tuple[str, Path, Path | None]] = []
    for key, path in ctx.inputs.items():
        if key.startswith("finetune/"):
            candidates.append((f"{p.prefix}-{key.split('/', 1)[1]}", Path(path) / "model", Path(path)))
        elif key.startswith("distill/"):  # students: same metrics.json schema, registered as <prefix>-<task>-student
            candidates.append((f"{p.prefix}-{key.split('/', 1)[1]}-student", Path(path) / "model", Path(path)))
    if p.register_encoder:
        candidates.append((f"{p.prefix}-encoder", Path(ctx.inputs["adapted"]) / "model", None))

    # Model cards and input examples are local: never let mlflow ask the Hub about a local path.
    old_offline = os.environ.get("HF_HUB_OFFLINE")
    os.environ["HF_HUB_OFFLINE"] = "1"
    records = []
    run_id = getattr(ctx.tracker, "run_id", None)
    try:
        with fluent_mlflow(cfg) as mlflow, mlflow.start_run(
            run_id=run_id, experiment_id=None if run_id else experiment_id(cfg)
        ):
            for name, model_dir, ft_dir in candidates:
                task = pipeline_task(model_dir)
                if ft_dir is not None:
                    metric, value = primary_result(json.loads((ft_dir / "metrics.json").read_text()))
                    thash = test_set_hash(ft_dir)
                else:
                    from bertpipe.evaluate.fair_mlm import encoder_gate_score

                    metric, value = encoder_gate_score(model_dir, cfg)
                    thash = hashlib.sha256(str((read_manifest(cfg.work / "prepare") or {}).get("fingerprint"))
                                           .encode()).hexdigest()[:32]
                ctx.log(f"registering {name} ({task}) from {model_dir}")
                version = _log_and_register(mlflow, name, model_dir, task, language, p.pip_requirements)
                tags = {"bertpipe.primary_metric": metric, "bertpipe.primary_value": f"{value:.6f}",
                        "bertpipe.test_hash": thash, "bertpipe.fingerprint": ctx.fingerprint}
                for k, v in tags.items():
                    client.set_model_version_tag(name, version, k, v)
                champ_now = _rescore_champion(cfg, client, name, thash) if ft_dir is None else None
                d = decide(client, name, version, metric, value, thash, p.min_delta, champ_now)
                client.set_model_version_tag(name, version, "bertpipe.decision",
                                             ("promoted: " if d.promoted else "not promoted: ") + d.reason)
                card = model_card(name, task, metric, value, lineage(ctx, ft_dir),
                                  _eval_table(evaluate_dir, name[len(p.prefix) + 1:]), d.reason)
                card += export_section(client, name, version)
                client.update_model_version(name, version, description=card)
                aliases = client.get_model_version(name, version).aliases
                records.append({"name": name, "version": version, "task": task, "metric": metric, "value": value,
                                "promoted": d.promoted, "reason": d.reason, "aliases": sorted(aliases),
                                "champion_before": d.champion_version, "champion_value": d.champion_value})
                ctx.log(f"{name} v{version}: {'champion' if d.promoted else 'challenger'} ({d.reason})")
    finally:
        if old_offline is None:
            os.environ.pop("HF_HUB_OFFLINE", None)
        else:
            os.environ["HF_HUB_OFFLINE"] = old_offline
    write_json(ctx.out / "registry.json", {"tracking_uri": uri, "models": records})
    ctx.log_artifact(ctx.out / "registry.json")
    done = [r for r in records if r.get("registered", True)]
    ctx.counts["registered"] = len(done)
    return {"registered": len(done), "promoted": sum(r["promoted"] for r in done)}
