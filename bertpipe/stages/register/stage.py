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
from pathlib import Path

from bertpipe.core.outputs import atomic_file
from bertpipe.core.stage import StageContext, write_json
from bertpipe.lib.measures import bootstrap as B
from bertpipe.lib.registered.champion import (CHALLENGER, current_champion, registry_lock, set_champion_locked,
                                              was_champion)
from bertpipe.lib.registered.versions import export_model
from bertpipe.stages.register import card as C
from bertpipe.stages.register import decision as D
from bertpipe.stages.register import gate as G
from bertpipe.stages.register import scoring as S
from bertpipe.stages.register.artifacts import export_section
from bertpipe.stages.register.candidates import Candidate, candidates, evaluate_dir, test_set_words
from bertpipe.stages.register.record import register_version, training_run


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
            from bertpipe.lib.measures.encoder_gate import encoder_gate_score

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
           "test_set": test_set_words(c), "score_source": source, "champion_before": None, "champion_value": None,
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
    floor = (G.encoder_floor(ctx.cfg, p.floor, evaluate_dir(ctx)) if c.ft_dir is None
             else G.task_floor(Path(ctx.inputs["evaluate"]), c.task, p.floor, c.metric))
    rec.update(floor=floor.describe(c.metric, p.floor_margin), floor_value=floor.value)
    champ_value, note, preds = None, "", None
    if champ is not None:
        rec["champion_before"] = str(champ.version)
        rec["upstream_changes"] = D.upstream_changes(c.lineage, champ.tags or {})
        champ_value, rescored, note, preds = _champion_score(ctx, client, c, champ)
        rec.update(champion_value=champ_value, champion_rescored=rescored)
        if preds is not None and (c.ft_dir / B.PREDICTIONS).is_file():
            tp, _ = G.task_settings(ctx.cfg, c.ft_dir, c.task)
            rec["ci95"], rec["ci_note"] = S.paired_interval(
                tp.type, preds, B.read_predictions(c.ft_dir / B.PREDICTIONS), p.ci_samples, p.ci_seed)
        elif champ_value is not None:
            rec["ci_note"] = ("the encoder gate score is one number" if c.ft_dir is None
                              else "no per-example predictions for both models")
    v = G.judge(c.metric, c.value, floor, p.floor_margin, rec["champion_before"], champ_value, p.min_delta,
                p.require_ci, rec["ci95"], note if note != "re-scored" else "re-scored on this test set",
                degenerate=c.degenerate)
    rec.update(promoted=v.promoted, below_floor=v.below_floor, reason=v.reason,
               decision=("promoted: " if v.promoted else "not promoted: ") + v.reason)
    return rec


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
    from bertpipe.infra.tracking import unreachable_line

    if unreachable_line(e) is not None:
        from bertpipe.infra.tracking_http import given_up

        given_up()
    try:
        mlflow.end_run(status)
    except Exception:  # noqa: BLE001 (best effort: the open-run marker stays; bertpipe.infra.orphans closes it later)
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
    from bertpipe.infra.tracking import client as mlflow_client
    from bertpipe.infra.tracking import display_uri, experiment_id, fluent_mlflow, tracking_uri

    cfg = ctx.cfg
    client = mlflow_client(cfg)
    records, todo = [], []
    run_id = getattr(ctx.tracker, "run_id", None)
    with _hub_offline():
        found = candidates(ctx)
        with fluent_mlflow(cfg) as mlflow:
            for c in found:
                c.pipeline_task = C.pipeline_task(c.model_dir)
                # logged from the training run when there is one (the version's source run), else this stage's run
                train_run = training_run(client, c)
                owner = train_run or run_id
                mlflow.start_run(run_id=owner, experiment_id=None if owner else experiment_id(cfg))
                try:
                    register_version(ctx, mlflow, client, c)
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
