"""register: log each finetuned model (and the adapted encoder) with the MLflow transformers flavor, then decide.

Two phases, so a failure halfway leaves nothing half-decided and a rerun completes:
1. register every model of the run, or reuse the version that already holds the same content (its upstream
   fingerprint tag): nothing is registered twice;
2. under the registry lock, gate each one (floor, then the champion on the same test set, re-scoring the champion
   when the test set changed), journal the verdicts in scratch, and only then move aliases and write the decision
   report: a rerun after a kill mid-way applies the verdicts the killed attempt made, not ones its half-moved
   aliases would suggest.
"""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from bertpipe.errors import BertpipeError
from bertpipe.outputs import atomic_file
from bertpipe.register import card as C
from bertpipe.register import decision as D
from bertpipe.register import gate as G
from bertpipe.register import scoring as S
from bertpipe.register.artifacts import export_section
from bertpipe.registry.champion import (CHALLENGER, FINGERPRINT_TAG, current_champion, find_by_fingerprint,
                                        registry_lock, set_champion_locked, was_champion)
from bertpipe.registry.versions import export_model
from bertpipe.scoring.fair_mlm import has_mlm_head
from bertpipe.stage import StageContext, read_manifest, write_json

VERSION = "2"
# the model card's pipeline task and input example, for the registered model
pipeline_task, input_example = C.pipeline_task, C.input_example


def own_inputs(cfg) -> dict:
    return {}


@dataclass
class Candidate:
    name: str
    model_dir: Path
    ft_dir: Path | None  # None: the encoder
    task: str | None
    fingerprint: str = ""
    metric: str = ""
    value: float = float("nan")
    identity: str = ""
    identity_parts: dict = field(default_factory=dict)
    lineage: dict = field(default_factory=dict)
    version: str = ""
    reused: bool = False
    pipeline_task: str = ""
    encoder: str = ""  # a task model: which encoder's finetune (the best by dev score, bertpipe.training.choice)
    choice: str = ""  # ... and why, in words
    degenerate: str | None = None  # why the model learned nothing (its metrics.json says so): never crowned
    score_read: bool = False  # the encoder's gate score was read from evaluate's metrics.json, not scored here


def _evaluate_dir(ctx: StageContext) -> Path | None:
    return Path(ctx.inputs["evaluate"]) if ctx.inputs.get("evaluate") else None


def _log_and_register(mlflow, name: str, model_dir: Path, task: str, language: str, reqs: list[str]):
    import tempfile

    from bertpipe.register import artifacts as A

    export_dir = A.export_dir_for(model_dir)
    if task in ("question-answering", "token-classification"):
        # pyfunc: QA has no transformers 5 pipeline; NER users want entities, not the flavor's bare tag string.
        from bertpipe.register.pyfunc import log_pyfunc
        from bertpipe.registry.files import task_files

        with tempfile.TemporaryDirectory() as tmp:
            files = task_files(model_dir, export_dir, Path(tmp) / "files")
            version = log_pyfunc(mlflow, name, model_dir, files, input_example(task, language), reqs)
    else:
        from transformers import AutoTokenizer, pipeline

        from bertpipe.register.pyfunc import flavor_long_text

        max_len, long_text = flavor_long_text(task, model_dir, export_dir)  # long texts truncate, not crash
        tok = AutoTokenizer.from_pretrained(str(model_dir), model_max_length=max_len)
        pipe = pipeline(task, model=str(model_dir), tokenizer=tok)
        info = mlflow.transformers.log_model(
            pipe, name=name, task=task, input_example=input_example(task, language),
            pip_requirements=reqs, registered_model_name=name, model_config=long_text,
        )
        version = str(info.registered_model_version)
    A.attach_export(mlflow, name, version, export_dir)
    return version


def _task_models(ctx: StageContext) -> list[tuple[str, str, Path, object]]:
    """(source kind, task, output dir, choice or None) of each task model: per task the best encoder's finetune by
    dev score (the choice export makes), then each student."""
    from bertpipe.training.choice import choose

    finetunes: dict[str, dict[str, Path]] = {}
    out = []
    for key, src in ctx.sources.items():  # the stages behind the inputs (bertpipe.register.declare)
        if src.family == "finetune":
            finetunes.setdefault(src.task, {})[src.encoder] = Path(ctx.inputs[key])
        elif src.family == "distill":
            out.append(("distill", src.task, Path(ctx.inputs[key]), None))
    chosen = []
    for task, dirs in finetunes.items():
        c = choose(dirs)
        ctx.log(f"{task}: registering the {c.words()}")
        chosen.append(("finetune", task, Path(c.source), c))
    return chosen + out


def _candidates(ctx: StageContext) -> list[Candidate]:
    cfg, p = ctx.cfg, ctx.params
    out = []
    for family, task, ft, choice in _task_models(ctx):  # a student: same metrics.json schema, "<name>-student"
        suffix = "-student" if family == "distill" else ""
        fp = (read_manifest(ft) or {}).get("fingerprint")
        if not fp:
            raise BertpipeError(f"{ft}/manifest.json: missing (run {family}/{task} first)")
        metrics = json.loads((ft / "metrics.json").read_text())
        metric, value, _ = G.saved_seed_score(metrics, f"{ft}/metrics.json")
        identity, parts = G.test_identity(cfg, ft, task)
        task_data = (parts["data"].get("test_sha256") or identity)
        out.append(Candidate(f"{p.prefix}-{task}{suffix}", ft / "model", ft, task, fp, metric, value, identity, parts,
                             D.lineage(cfg, ft, task_data), encoder=choice.encoder if choice else "",
                             choice=choice.words() if choice else "",
                             degenerate=G.degenerate_reason(metrics)))
    if p.register_encoder and not has_mlm_head(Path(ctx.inputs["adapted"]) / "model"):
        # an RTD-trained discriminator (pretrain.objective: rtd): the encoder gate scores masked-LM NLL against the
        # base and has nothing to score here; the finetuned task models carry the gate (docs/objectives.md)
        ctx.log("encoder not registered: the adapted encoder has no masked-LM head (pretrain.objective: rtd), so "
                "the encoder gate does not apply; its finetuned task models are registered")
    elif p.register_encoder:
        pre = Path(ctx.inputs["adapted"])
        fp = (read_manifest(pre) or {}).get("fingerprint")
        if not fp:
            raise BertpipeError(f"{pre}/manifest.json: missing (run pretrain first)")
        identity, parts = G.encoder_identity(cfg)
        out.append(Candidate(f"{p.prefix}-encoder", pre / "model", None, None, fp, identity=identity,
                             identity_parts=parts, lineage=D.lineage(cfg, None, None)))
    return out


def _register(ctx: StageContext, mlflow, client, c: Candidate) -> None:
    """Phase 1 for one model: find the version holding this content, or log and register it with its tags."""
    existing = find_by_fingerprint(client, c.name, c.fingerprint)
    if c.ft_dir is None:  # the encoder's score: recorded with its version when the test set is the same
        tags = existing.tags if existing is not None else {}
        if tags.get("bertpipe.test_hash") == c.identity and "bertpipe.primary_value" in tags:
            c.metric, c.value = tags["bertpipe.primary_metric"], float(tags["bertpipe.primary_value"])
        else:  # evaluate's score of this very model on the same windows, else scored here
            from bertpipe.scoring.encoder_gate import gate_score

            c.metric, c.value, c.score_read = gate_score(c.model_dir, ctx.cfg, _evaluate_dir(ctx))
            ctx.log(f"{c.name}: gate score {c.value:.4f} "
                    f"{'read from evaluate' if c.score_read else 'scored (evaluate has no score of this model)'}")
    if existing is not None:
        c.version, c.reused = str(existing.version), True
        ctx.log(f"{c.name}: v{c.version} already holds this content (fingerprint {c.fingerprint[:12]}); reused")
        return
    from bertpipe.registry.champion import claim, find_unfinished

    unfinished = find_unfinished(client, c.name, c.fingerprint)
    if unfinished is not None:  # created by a register run killed before it tagged it: finish it, not a second one
        c.version = str(unfinished.version)
        ctx.log(f"{c.name}: v{c.version} was created by an interrupted run with this content; finishing it")
        from bertpipe.register import artifacts as A

        A.attach_export(mlflow, c.name, c.version, A.export_dir_for(c.model_dir))
    else:
        ctx.log(f"registering {c.name} ({c.pipeline_task}) from {c.model_dir}")
        claim(client, mlflow.active_run().info.run_id, c.name, c.fingerprint)  # ties the version-to-be to c
        c.version = _log_and_register(mlflow, c.name, c.model_dir, c.pipeline_task, ctx.cfg.params.model.language,
                                      ctx.params.pip_requirements)
    # The fingerprint tag makes later runs reuse this version; until it is set, the run's claim identifies it.
    client.set_model_version_tag(c.name, c.version, FINGERPRINT_TAG, c.fingerprint)
    tags = {"bertpipe.primary_metric": c.metric, "bertpipe.primary_value": f"{c.value:.6f}",
            "bertpipe.test_hash": c.identity,
            **{D.LINEAGE_PREFIX + k: v for k, v in c.lineage.items()}}
    if c.encoder:  # which encoder's finetune this task model is (the best by dev score)
        tags.update({"bertpipe.encoder": c.encoder, "bertpipe.degenerate": str(bool(c.degenerate)).lower()})
    _log_inputs(ctx, mlflow, c)
    preds = c.ft_dir / S.PREDICTIONS if c.ft_dir is not None else None
    if preds is not None and preds.is_file():
        artifact_dir = f"predictions/{c.name}/v{c.version}"
        mlflow.log_artifact(str(preds), artifact_path=artifact_dir)
        tags[S.PREDICTIONS_TAG] = f"{mlflow.active_run().info.run_id}:{artifact_dir}/{S.PREDICTIONS}"
    for k, v in tags.items():
        client.set_model_version_tag(c.name, c.version, k, v)


def _training_run(client, c: Candidate) -> str | None:
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


def _log_inputs(ctx: StageContext, mlflow, c: Candidate) -> None:
    """The data behind the model, as MLflow datasets with their digests (the task splits' sha256; for the encoder,
    the prepared corpus's fingerprint), on the run the version is logged from."""
    import warnings

    from mlflow.data.dataset_source_registry import resolve_dataset_source
    from mlflow.data.meta_dataset import MetaDataset

    from bertpipe.layout import task_dir
    from bertpipe.tasklib import split_info

    def local_source(path: str):  # MLflow's "local" source (registered twice: silence its which-one warning)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            return resolve_dataset_source(path)

    if c.ft_dir is not None:
        tdir = task_dir(ctx.cfg, c.task)
        for split, info in ((split_info(tdir) if tdir.is_dir() else {}).get("splits") or {}).items():
            if info.get("sha256"):
                ds = MetaDataset(local_source(str(tdir / f"{split}.jsonl")), name=f"{c.task}/{split}",
                                 digest=info["sha256"][:36])
                mlflow.log_input(ds, context="training" if split == "train" else split)
    else:
        prep = ctx.cfg.work / "prepare"
        fp = (read_manifest(prep) or {}).get("fingerprint")
        if fp:
            mlflow.log_input(MetaDataset(local_source(str(prep / "domain")), name="domain corpus",
                                         digest=fp[:36]), context="training")


def _champion_score(ctx: StageContext, client, c: Candidate, champ):
    """(champion value on this test set, re-scored?, note, champion predictions or None)."""
    tags = champ.tags or {}
    if (tags.get("bertpipe.test_hash") == c.identity and tags.get("bertpipe.primary_metric") == c.metric
            and "bertpipe.primary_value" in tags):
        preds = S.stored_predictions(client, champ, ctx.scratch / "champion") if c.ft_dir is not None else None
        if preds is None and c.ft_dir is not None and ctx.params.require_ci:
            with contextlib.suppress(Exception):  # predictions only feed the interval; the value is recorded
                preds = S.score_model_dir(ctx.cfg, export_model(ctx.cfg, c.name, version=champ.version),
                                          c.ft_dir, c.task)[1]
        return float(tags["bertpipe.primary_value"]), False, "", preds
    ctx.log(f"{c.name}: champion v{champ.version} was scored on another test set; re-scoring it on this one")
    try:
        exported = export_model(ctx.cfg, c.name, version=champ.version)
        if exported is None:
            return None, True, "its version no longer exists", None
        if c.ft_dir is None:
            from bertpipe.scoring.encoder_gate import encoder_gate_score

            return float(encoder_gate_score(exported, ctx.cfg)[1]), True, "re-scored", None
        value, preds = S.score_model_dir(ctx.cfg, exported, c.ft_dir, c.task)
        return value, True, "re-scored", preds
    except Exception as e:  # noqa: BLE001 (a champion that cannot be loaded blocks promotion, with the reason)
        return None, True, f"re-scoring failed: {type(e).__name__}: {e}", None


def _decide(ctx: StageContext, client, c: Candidate) -> dict:
    """Phase 2 for one model (caller holds the registry lock): the gate's numbers and verdict, as a record."""
    p = ctx.params
    source = ("the registered seed's own test score" if c.ft_dir is not None
              else "the encoder gate score on the domain held-out text"
              + (" (evaluate's, for the same model and windows)" if c.score_read else ""))
    rec = {"name": c.name, "version": c.version, "task": c.pipeline_task, "registered": True, "reused": c.reused,
           "fingerprint": c.fingerprint, "metric": c.metric, "value": c.value, "test_identity": c.identity,
           "test_set": _test_set_words(c), "score_source": source, "champion_before": None, "champion_value": None,
           "champion_rescored": False, "ci95": None, "ci_note": "", "upstream_changes": [],
           "promoted": False, "stays_champion": False, "below_floor": False, "degenerate": c.degenerate}
    champ = current_champion(client, c.name)
    rec.update(floor="not needed for this decision", floor_value=None)
    if champ is not None and str(champ.version) == c.version:
        rec.update(champion_before=c.version, stays_champion=True,
                   reason=f"v{c.version} is the champion already (same content); nothing moved")
        rec["decision"] = "stays champion: " + rec["reason"]
        return rec
    if c.reused and was_champion(client, c.name, c.version):
        # It was champion once and lost the alias (a rollback, or a later champion): a rerun must not undo that.
        rec.update(champion_before=str(champ.version) if champ is not None else None,
                   reason=f"v{c.version} held champion before and was replaced; promote it explicitly if wanted")
        rec["decision"] = "not promoted: " + rec["reason"]
        return rec
    floor = (G.encoder_floor(ctx.cfg, p.floor, _evaluate_dir(ctx)) if c.ft_dir is None
             else G.task_floor(Path(ctx.inputs["evaluate"]), c.task, p.floor, c.metric))
    rec.update(floor=floor.describe(c.metric, p.floor_margin), floor_value=floor.value)
    champ_value, note, preds = None, "", None
    if champ is not None:
        rec["champion_before"] = str(champ.version)
        rec["upstream_changes"] = D.upstream_changes(c.lineage, champ.tags or {})
        champ_value, rescored, note, preds = _champion_score(ctx, client, c, champ)
        rec.update(champion_value=champ_value, champion_rescored=rescored)
        if preds is not None and (c.ft_dir / S.PREDICTIONS).is_file():
            tp, _ = G.task_settings(ctx.cfg, c.ft_dir, c.task)
            rec["ci95"], rec["ci_note"] = S.paired_interval(
                tp.type, c.metric, preds, S.read_predictions(c.ft_dir / S.PREDICTIONS), p.ci_samples, p.ci_seed)
        elif champ_value is not None:
            rec["ci_note"] = ("the encoder gate score is one number" if c.ft_dir is None
                              else "no per-example predictions for both models")
    v = G.judge(c.metric, c.value, floor, p.floor_margin, rec["champion_before"], champ_value, p.min_delta,
                p.require_ci, rec["ci95"], note if note != "re-scored" else "re-scored on this test set",
                degenerate=c.degenerate)
    rec.update(promoted=v.promoted, below_floor=v.below_floor, reason=v.reason,
               decision=("promoted: " if v.promoted else "not promoted: ") + v.reason)
    return rec


def _test_set_words(c: Candidate) -> str:
    data, settings = c.identity_parts.get("data", {}), c.identity_parts.get("settings", {})
    if c.ft_dir is None:
        return f"domain corpus of prepare {str(c.identity_parts.get('prepare'))[:12]} (identity {c.identity[:12]})"
    what = (f"{data.get('examples')} examples, sha256 {data['test_sha256'][:12]}" if data.get("test_sha256")
            else "the finetune data inputs (no work/splits split)")
    keys = ", ".join(f"{k} {v}" for k, v in settings.items() if k in ("max_seq_len", "max_eval_examples",
                                                                   "truncation", "head_tokens"))
    return f"{what}; {keys} (identity {c.identity[:12]})"


def _decisions(ctx: StageContext, client, todo: list[Candidate]) -> list[tuple[Candidate, dict]]:
    """Phase 2's verdicts (caller holds the registry lock), journaled in scratch before any alias moves. A rerun of
    an attempt killed while applying them takes the journaled verdict where it still describes the registry: deciding
    again would see its own half-moved aliases ("v2 is the champion already") and record a different decision."""
    journal = ctx.scratch / "decisions.json"
    before = json.loads(journal.read_text(encoding="utf-8")) if journal.is_file() else {}
    decided = []
    for c in todo:
        rec = before.get(f"{c.name}@{c.version}")
        if rec is None or not _still_applies(client, c, rec):
            rec = _decide(ctx, client, c)
        decided.append((c, rec))
    with atomic_file(journal) as tmp:  # whole or absent: a kill mid-write leaves no torn journal
        write_json(tmp, {f"{c.name}@{c.version}": rec for c, rec in decided})
    return decided


def _still_applies(client, c: Candidate, rec: dict) -> bool:
    """Whether the champion is where the journaled verdict left it, moved or not yet: nobody (a rollback, a promote,
    another run) moved it since."""
    champ = current_champion(client, c.name)
    now = str(champ.version) if champ is not None else None
    if rec["promoted"] and now == c.version:
        return True
    return now == rec["champion_before"] and not (rec["promoted"] and was_champion(client, c.name, c.version))


def _apply(ctx: StageContext, client, c: Candidate, rec: dict) -> None:
    """Move aliases as decided, then record the decision on the version (tag + description). The champion itself
    keeps the record of the decision that crowned it."""
    if rec["stays_champion"]:
        rec["aliases"] = sorted(client.get_model_version(c.name, c.version).aliases)
        ctx.log(f"{c.name} v{c.version}: {rec['decision']}")
        return
    client.set_registered_model_alias(c.name, CHALLENGER, c.version)
    if rec["promoted"]:
        set_champion_locked(client, c.name, c.version)
    # The score and test set the decision used (a reused encoder may have been re-scored on new held-out text).
    for key, value in {"bertpipe.decision": rec["decision"], "bertpipe.floor": rec["floor"],
                       "bertpipe.below_floor": str(rec["below_floor"]).lower(),
                       "bertpipe.primary_value": f"{c.value:.6f}", "bertpipe.test_hash": c.identity}.items():
        client.set_model_version_tag(c.name, c.version, key, value)
    table = C.eval_table(Path(ctx.inputs["evaluate"]), c.task)
    card = C.model_card(c.name, c.pipeline_task, c.metric, c.value, C.card_lineage(ctx.cfg, c.ft_dir), table,
                        D.model_section(rec))
    if c.choice:
        card += f"\n\n**Encoder**: {c.choice}.\n"
    client.update_model_version(c.name, c.version, description=card + export_section(client, c.name, c.version))
    client.update_registered_model(c.name, description=C.registered_description(c.name, c.pipeline_task, c.task))
    rec["aliases"] = sorted(client.get_model_version(c.name, c.version).aliases)
    ctx.log(f"{c.name} v{c.version}: {rec['decision']}")


def _end_after_error(mlflow, status: str, e: BaseException) -> None:
    """End the active run after ``e``; when ``e`` is a tracking server that stopped answering, each further call
    tries once (the stage's run is closed the same way), so the error line comes after one wait, not several."""
    from bertpipe.tracking import unreachable_line

    if unreachable_line(e) is not None:
        from bertpipe.tracking_http import given_up

        given_up()
    try:
        mlflow.end_run(status)
    except Exception:  # noqa: BLE001 (best effort: the open-run marker stays; bertpipe.orphans closes it later)
        pass


@contextlib.contextmanager
def _hub_offline():
    # Model cards and input examples are local: never let mlflow ask the Hub about a local path.
    old = os.environ.get("HF_HUB_OFFLINE")
    os.environ["HF_HUB_OFFLINE"] = "1"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("HF_HUB_OFFLINE", None)
        else:
            os.environ["HF_HUB_OFFLINE"] = old


def build(ctx: StageContext) -> dict:
    from bertpipe.tracking import client as mlflow_client
    from bertpipe.tracking import display_uri, experiment_id, fluent_mlflow, tracking_uri

    cfg = ctx.cfg
    client = mlflow_client(cfg)
    records, todo = [], []
    run_id = getattr(ctx.tracker, "run_id", None)
    with _hub_offline():
        candidates = _candidates(ctx)
        with fluent_mlflow(cfg) as mlflow:
            for c in candidates:
                c.pipeline_task = C.pipeline_task(c.model_dir)
                # logged from the training run when there is one (the version's source run), else this stage's run
                train_run = _training_run(client, c)
                owner = train_run or run_id
                mlflow.start_run(run_id=owner, experiment_id=None if owner else experiment_id(cfg))
                try:
                    _register(ctx, mlflow, client, c)
                except BaseException as e:
                    _end_after_error(mlflow, "FINISHED" if train_run else "FAILED", e)
                    raise
                mlflow.end_run("FINISHED")  # the training run finished training whatever happens here
                todo.append(c)
        with registry_lock(client):
            for c, rec in _decisions(ctx, client, todo):
                _apply(ctx, client, c, rec)
                records.append(rec)
    write_json(ctx.out / "registry.json", {"tracking_uri": display_uri(tracking_uri(cfg)), "models": records})
    (ctx.out / "decision.md").write_text(D.report(records), encoding="utf-8")
    for name in ("registry.json", "decision.md"):
        ctx.log_artifact(ctx.out / name)
    done = [r for r in records if r.get("registered", True)]
    ctx.counts.update(registered=sum(not r["reused"] for r in done), reused=sum(r["reused"] for r in done),
                      below_floor=sum(r["below_floor"] for r in done))
    return {"registered": len(done), "promoted": sum(r["promoted"] for r in done)}
