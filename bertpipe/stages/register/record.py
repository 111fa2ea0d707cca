"""register's first phase, per candidate: the registry version holding its content, or the model logged with the
MLflow transformers flavor (a pyfunc for NER and QA) and registered with its tags, data inputs and predictions."""

from __future__ import annotations

from pathlib import Path

from bertpipe.core.stage import StageContext, read_manifest
from bertpipe.lib.measures import bootstrap as B
from bertpipe.lib.registered.champion import DEGENERATE_TAG, FINGERPRINT_TAG, find_by_fingerprint
from bertpipe.stages.register import card as C
from bertpipe.stages.register import decision as D
from bertpipe.stages.register import scoring as S
from bertpipe.stages.register.candidates import Candidate, evaluate_dir


def log_and_register(mlflow, name: str, model_dir: Path, task: str, language: str, reqs: list[str]) -> str:
    """Log ``model_dir`` on the active run and register it as a new version of ``name``; the version number."""
    import tempfile

    from bertpipe.stages.register import artifacts as A

    export_dir = A.export_dir_for(model_dir)
    if task in ("question-answering", "token-classification"):
        # pyfunc: QA has no transformers 5 pipeline; NER users want entities, not the flavor's bare tag string.
        from bertpipe.lib.registered.files import task_files
        from bertpipe.stages.register.pyfunc import log_pyfunc

        with tempfile.TemporaryDirectory() as tmp:
            files = task_files(model_dir, export_dir, Path(tmp) / "files")
            version = log_pyfunc(mlflow, name, model_dir, files, C.input_example(task, language), reqs)
    else:
        from mlflow.models import infer_signature
        from transformers import AutoTokenizer, pipeline

        from bertpipe.stages.register.pyfunc import flavor_long_text

        max_len, long_text = flavor_long_text(task, model_dir, export_dir)  # long texts truncate, not crash
        tok = AutoTokenizer.from_pretrained(str(model_dir), model_max_length=max_len)
        pipe = pipeline(task, model=str(model_dir), tokenizer=tok)
        example = C.input_example(task, language, tok.mask_token or "[MASK]")
        # The signature from the pipeline's output on the example, inferred here: MLflow's own inference runs under
        # a SIGALRM timeout, which works only in the main thread (the flow registers in a worker thread). Should
        # the pipeline fail on the example, MLflow's own fallback (the task's default signature) applies.
        try:
            signature = infer_signature(example, mlflow.transformers.generate_signature_output(pipe, example))
        except Exception:  # noqa: BLE001 (any pipeline error: the signature is documentation, not a gate)
            signature = None
        info = mlflow.transformers.log_model(
            pipe, name=name, task=task, input_example=example, signature=signature,
            pip_requirements=reqs, registered_model_name=name, model_config=long_text, model_card=_card(model_dir),
        )
        version = str(info.registered_model_version)
    A.attach_export(mlflow, name, version, export_dir)
    return version



def _card(model_dir: Path):
    """The model directory's own card (bertpipe.lib.modelcard), for the flavor to store with the version: without one
    MLflow looks the local path up on the Hub as a repo id and warns that no card could be retrieved."""
    from huggingface_hub import ModelCard

    readme = Path(model_dir) / "README.md"
    return ModelCard.load(readme) if readme.is_file() else None


def register_version(ctx: StageContext, mlflow, client, c: Candidate) -> None:
    """Phase 1 for one model: find the version holding this content, or log and register it with its tags."""
    existing = find_by_fingerprint(client, c.name, c.fingerprint)
    if c.ft_dir is None:  # the encoder's score: recorded with its version when the test set is the same
        tags = existing.tags if existing is not None else {}
        if tags.get("bertpipe.test_hash") == c.identity and "bertpipe.primary_value" in tags:
            c.metric, c.value = tags["bertpipe.primary_metric"], float(tags["bertpipe.primary_value"])
        else:  # evaluate's score of this very model on the same windows, else scored here
            from bertpipe.lib.measures.encoder_gate import gate_score

            c.metric, c.value, c.score_read = gate_score(c.model_dir, ctx.cfg, evaluate_dir(ctx))
            ctx.log(f"{c.name}: gate score {c.value:.4f} "
                    f"{'read from evaluate' if c.score_read else 'scored (evaluate has no score of this model)'}")
    if existing is not None:
        c.version, c.reused = str(existing.version), True
        ctx.log(f"{c.name}: v{c.version} already holds this content (fingerprint {c.fingerprint[:12]}); reused")
        return
    from bertpipe.lib.registered.champion import claim, find_unfinished

    unfinished = find_unfinished(client, c.name, c.fingerprint)
    if unfinished is not None:  # created by a register run killed before it tagged it: finish it, not a second one
        c.version = str(unfinished.version)
        ctx.log(f"{c.name}: v{c.version} was created by an interrupted run with this content; finishing it")
        from bertpipe.stages.register import artifacts as A

        A.attach_export(mlflow, c.name, c.version, A.export_dir_for(c.model_dir))
    else:
        ctx.log(f"registering {c.name} ({c.pipeline_task}) from {c.model_dir}")
        claim(client, mlflow.active_run().info.run_id, c.name, c.fingerprint)  # ties the version-to-be to c
        c.version = log_and_register(mlflow, c.name, c.model_dir, c.pipeline_task, ctx.cfg.params.model.language,
                                      ctx.params.pip_requirements)
    # The fingerprint tag makes later runs reuse this version; until it is set, the run's claim identifies it.
    client.set_model_version_tag(c.name, c.version, FINGERPRINT_TAG, c.fingerprint)
    tags = {"bertpipe.primary_metric": c.metric, "bertpipe.primary_value": f"{c.value:.6f}",
            "bertpipe.test_hash": c.identity,
            **{D.LINEAGE_PREFIX + k: v for k, v in c.lineage.items()}}
    if c.encoder:  # which encoder's finetune this task model is (the best by dev score)
        tags.update({"bertpipe.encoder": c.encoder, DEGENERATE_TAG: str(bool(c.degenerate)).lower()})
    log_inputs(ctx, mlflow, c)
    preds = c.ft_dir / B.PREDICTIONS if c.ft_dir is not None else None
    if preds is not None and preds.is_file():
        artifact_dir = f"predictions/{c.name}/v{c.version}"
        mlflow.log_artifact(str(preds), artifact_path=artifact_dir)
        tags[S.PREDICTIONS_TAG] = f"{mlflow.active_run().info.run_id}:{artifact_dir}/{B.PREDICTIONS}"
    for k, v in tags.items():
        client.set_model_version_tag(c.name, c.version, k, v)



def training_run(client, c: Candidate) -> str | None:
    """The MLflow run of the stage that trained ``c`` (its output's manifest), if it is in this store: the version
    is logged from it, so the registry leads to the training params, curves and data."""
    run_id = (read_manifest(c.ft_dir if c.ft_dir is not None else c.model_dir.parent) or {}).get("mlflow_run_id")
    if not run_id:
        return None
    try:
        client.get_run(run_id)
    except Exception:  # noqa: BLE001 (another store, or a deleted run: the register run holds the model)
        return None
    return run_id



def log_inputs(ctx: StageContext, mlflow, c: Candidate) -> None:
    """The data behind the model, as MLflow datasets with their digests (the task splits' sha256; for the encoder,
    the prepared corpus's fingerprint), on the run the version is logged from."""
    from bertpipe.infra.tracking import dataset_inputs
    from bertpipe.lib.labelled import split_datasets
    from bertpipe.lib.layout import task_dir

    if c.ft_dir is not None:
        data = split_datasets(task_dir(ctx.cfg, c.task), c.task)
    else:
        prep = ctx.cfg.work / "prepare"
        fp = (read_manifest(prep) or {}).get("fingerprint")
        data = [(prep / "domain", "domain corpus", fp[:36], "training")] if fp else []
    if data:
        mlflow.MlflowClient().log_inputs(mlflow.active_run().info.run_id, datasets=dataset_inputs(data))
