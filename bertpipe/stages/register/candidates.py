"""register's candidates: per task the model to register (the best encoder's finetune by dev score, then each
student) and the adapted encoder, each with its score, test-set identity and lineage."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from bertpipe.core.stage import StageContext, read_manifest
from bertpipe.infra.errors import BertpipeError
from bertpipe.lib.measures.fair_mlm import has_mlm_head
from bertpipe.stages.register import decision as D
from bertpipe.stages.register import gate as G


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
    encoder: str = ""  # a task model: which encoder's finetune (the best by dev score, bertpipe.lib.training.choice)
    choice: str = ""  # ... and why, in words
    degenerate: str | None = None  # why the model learned nothing (its metrics.json says so): never crowned
    score_read: bool = False  # the encoder's gate score was read from evaluate's metrics.json, not scored here



def evaluate_dir(ctx: StageContext) -> Path | None:
    return Path(ctx.inputs["evaluate"]) if ctx.inputs.get("evaluate") else None



def task_models(ctx: StageContext) -> list[tuple[str, str, Path, object]]:
    """(source kind, task, output dir, choice or None) of each task model: per task the best encoder's finetune by
    dev score (the choice export makes), then each student."""
    from bertpipe.lib.training.choice import choose

    finetunes: dict[str, dict[str, Path]] = {}
    out = []
    for key, src in ctx.sources.items():  # the stages behind the inputs (bertpipe.stages.register.declare)
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



def candidates(ctx: StageContext) -> list[Candidate]:
    cfg, p = ctx.cfg, ctx.params
    out = []
    for family, task, ft, choice in task_models(ctx):  # a student: same metrics.json schema, "<name>-student"
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



def test_set_words(c: Candidate) -> str:
    data, settings = c.identity_parts.get("data", {}), c.identity_parts.get("settings", {})
    if c.ft_dir is None:
        return f"domain corpus of prepare {str(c.identity_parts.get('prepare'))[:12]} (identity {c.identity[:12]})"
    what = (f"{data.get('examples')} examples, sha256 {data['test_sha256'][:12]}" if data.get("test_sha256")
            else "the finetune data inputs (no work/splits split)")
    keys = ", ".join(f"{k} {v}" for k, v in settings.items() if k in ("max_seq_len", "max_eval_examples",
                                                                   "truncation", "head_tokens"))
    return f"{what}; {keys} (identity {c.identity[:12]})"
