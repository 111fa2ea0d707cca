"""Where domain pretraining starts: the rule the ``start`` stage applies, so every front door agrees.

`bertpipe run`, `bertpipe retrain`, the scheduled deployment and `dvc repro` all build the same graph
(``bertpipe.graph.pipeline``); its ``start`` stage asks the registry once per run (``resolve``) and writes the answer to
``work/start/start.json`` (``bertpipe.stages.start``), which the vocab stage's inputs read; pretraining continues from
the vocab stage's model. No door passes its own starting point, so none can undo another's work, and no graph walk
queries MLflow. A registry that cannot be reached is an error, never "start from the base".

The rule (``flow.retrain_from: champion``):

- an explicit ``model.continue_from`` wins;
- no champion encoder registered: start from the base;
- the champion was trained on a different corpus than the current one (new data arrived): continue from the
  champion, extending *its* tokenizer, so earlier token ids never move;
- the champion was trained on exactly the current corpus: start where the champion started. That reproduces the
  champion's own inputs, so a rerun (a scheduled one after a retrain, or the run right after the first registration)
  finds everything fresh instead of pretraining the champion again on data it has already seen.

Every adapted encoder carries its lineage in ``config.json`` (``bertpipe_lineage``: the corpus fingerprint and the
start), which survives MLflow logging and export, so the rule needs nothing but the registered model itself.
``retrain_from: base`` always adapts the base again, and so does a project with tracking off (``tracking.uri:
none``): it has no registry to hold a champion.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from bertpipe.infra.config import Config
from bertpipe.infra.errors import BertpipeError
from bertpipe.lib.startrecord import KEY


@dataclass(frozen=True)
class Start:
    kind: str  # "base", "champion" (a registered encoder version) or "path" (model.continue_from)
    model: Path | str
    tokenizer: Path | str
    name: str = ""  # registered model name, for "champion"
    version: str = ""

    def record(self) -> dict:
        rec = {"kind": self.kind}
        if self.kind == "champion":
            rec.update(name=self.name, version=self.version)
        elif self.kind == "path":
            rec["path"] = str(self.model)
        return rec

    def describe(self) -> str:
        if self.kind == "champion":
            return f"the champion encoder {self.name} v{self.version} ({self.model})"
        if self.kind == "path":
            return f"model.continue_from {self.model}"
        return f"the base encoder {self.model}"


def base_start(cfg: Config) -> Start:
    from bertpipe.lib.layout import base_model, base_tokenizer

    return Start("base", base_model(cfg), base_tokenizer(cfg))


def encoder_name(cfg: Config) -> str:
    return f"{cfg.params.register.prefix}-encoder"


def read_lineage(model_dir: Path | str) -> dict | None:
    try:
        data = json.loads((Path(model_dir) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    rec = data.get(KEY)
    return rec if isinstance(rec, dict) else None


def export_version(cfg: Config, name: str, version: str | None = None) -> tuple[str, Path] | None:
    """(version, save_pretrained dir) of ``name``'s champion (or of ``version``), exported once per version under
    paths.state/exported; None when there is no such version or the registry cannot be read."""
    from bertpipe.infra.tracking import client, tracking_uri
    from bertpipe.lib.registered.champion import CHAMPION
    from bertpipe.lib.registered.versions import export_model

    uri = tracking_uri(cfg)
    if uri.startswith("sqlite:///") and not Path(uri[len("sqlite:///"):]).exists():
        return None  # no registry yet: do not create (and migrate) an MLflow store just to find it empty
    try:
        c = client(cfg)
        mv = c.get_model_version(name, version) if version else c.get_model_version_by_alias(name, CHAMPION)
    except Exception as e:
        if getattr(e, "error_code", "") in NOT_THERE:
            return None  # no such model, alias or version: nothing to continue from
        from bertpipe.infra.tracking import display_uri

        reason = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        raise BertpipeError(
            f"tracking.uri {display_uri(uri)}: the model registry cannot be read, so where pretraining starts "
            f"cannot be decided ({reason}); start the tracking server, fix tracking.uri, or set "
            "flow.retrain_from: base") from None
    dest = export_model(cfg, name, version=str(mv.version))
    return (str(mv.version), dest) if dest is not None else None


# MLflow's answers for "no such registered model / alias / version" (a REST server passes them through).
NOT_THERE = ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE")


def _from_record(cfg: Config, rec: dict) -> Start | None:
    kind = rec.get("kind")
    if kind == "base":
        return base_start(cfg)
    if kind == "path" and rec.get("path") and Path(rec["path"]).exists():
        return Start("path", Path(rec["path"]), Path(rec["path"]))
    if kind == "champion" and rec.get("name") and rec.get("version"):
        got = export_version(cfg, rec["name"], str(rec["version"]))
        if got is not None:
            return Start("champion", got[1], got[1], rec["name"], got[0])
    return None


def resolve(cfg: Config, corpus: str | None) -> Start:
    """The encoder the vocab stage extends and pretraining continues from (see the module docstring). ``corpus``:
    the current corpus identity, the prepare stage's fingerprint (None: unknown, so never "the same corpus")."""
    explicit = cfg.params.model.continue_from.strip()
    if explicit:
        p = cfg.path(explicit)
        return Start("path", p, p)
    from bertpipe.infra.tracking import tracking_off

    if cfg.params.flow.retrain_from == "base" or not cfg.params.register.register_encoder or tracking_off(cfg):
        return base_start(cfg)
    name = encoder_name(cfg)
    champ = export_version(cfg, name)
    if champ is None:
        return base_start(cfg)
    version, model_dir = champ
    rec = read_lineage(model_dir)
    if rec and rec.get("corpus") and rec.get("corpus") == corpus:
        again = _from_record(cfg, rec.get("start") or {})
        if again is not None:
            return again
    return Start("champion", model_dir, model_dir, name, version)
