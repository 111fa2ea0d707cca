"""The pretrain package's declaration (see ``bertpipe.core.declared``): ``base`` (a general-domain encoder from scratch,
when model.base: scratch) and ``pretrain`` (continued MLM on the domain corpus). Both run in every rank of a
torchrun job (``bertpipe.stages.pretrain.run``)."""

from __future__ import annotations

from bertpipe.core.codeid import MODEL_LIBS
from bertpipe.core.declared import Family
from bertpipe.core.stage import Stage, deferred
from bertpipe.infra.config import Config
from bertpipe.lib.keyedstore import FOLDER as TOKEN_STORES
from bertpipe.lib.layout import base_is_scratch, base_tokenizer, corpus_dir
from bertpipe.lib.mlm.params import PretrainParams

VERSION = "2"  # 2: MLM loss normalised by the masked tokens of a whole step; max_seq_len clamped to positions


def _ranked(stage: Stage, cfg: Config, force: bool = False):
    """The launcher of base and pretrain: the same run in every rank of a torchrun job
    (bertpipe.stages.pretrain.run)."""
    from bertpipe.stages.pretrain.run import run

    return run(stage, cfg, force=force)


def base_stage() -> Stage:
    def inputs(cfg: Config) -> dict:
        return {"corpus": corpus_dir(cfg, "general"), "tokenizer": base_tokenizer(cfg)}

    # The base model and tokenizer are inputs (hashed by content); of `model:` only the language matters here, so
    # e.g. retrain's model.continue_from does not rebuild the bootstrap base.
    return Stage("base", VERSION, ("base", "model.language"), inputs, lambda c: c.work / "base",
                 deferred("bertpipe.stages.pretrain.stage:build"), params_section="base", code=("pretrain",),
                 libs=(*MODEL_LIBS, "jieba", "numpy"), launcher=_ranked, stores=(TOKEN_STORES,))


def pretrain_stage() -> Stage:
    def inputs(cfg: Config) -> dict:
        # Always the vocab stage's model: the base or the champion encoder (see bertpipe.lib.lineage), with the words
        # mined from the current corpus added.
        return {"corpus": corpus_dir(cfg, "domain"), "model": cfg.work / "vocab" / "model"}

    return Stage("pretrain", VERSION, ("pretrain", "model.language"), inputs, lambda c: c.work / "pretrain",
                 deferred("bertpipe.stages.pretrain.stage:build"), params_section="pretrain", code=("pretrain",),
                 libs=(*MODEL_LIBS, "jieba", "numpy"), launcher=_ranked, stores=(TOKEN_STORES,))


# `base` bootstraps a from-scratch general-domain model; it is a pretrain section like `pretrain`.
BASE = Family("base", "Pretrain a small general-domain base from scratch (when model.base: scratch).",
              lambda c: [base_stage()] if base_is_scratch(c) else [], params={"base": PretrainParams})
PRETRAIN = Family("pretrain", "Continued MLM pretraining on the domain corpus (torchrun-compatible).",
                  lambda c: [pretrain_stage()], params={"pretrain": PretrainParams})
