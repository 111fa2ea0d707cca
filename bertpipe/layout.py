"""Where things live in a project, as functions of the config alone: the base encoder and the prepared corpora.

A core helper below every stage: the graph (``bertpipe.pipeline``) and the stages that must name the base model or
a corpus (the register gate, the fair MLM comparison, the start rule) import it from here, never from the graph.
"""

from __future__ import annotations

from pathlib import Path

from bertpipe.config import Config
from bertpipe.modelinfo import refuse_remote_code


def base_is_scratch(cfg: Config) -> bool:
    return cfg.params.model.base.strip().lower() == "scratch"


def base_model(cfg: Config) -> Path | str:
    """The base encoder: the bootstrapped one, a local save_pretrained dir, or a hub id (kept as a string). One that
    needs its own code is refused here, before any stage works towards loading it."""
    if base_is_scratch(cfg):
        return cfg.work / "base" / "model"
    p = cfg.path(cfg.params.model.base)
    ref = p if p.exists() else cfg.params.model.base
    refuse_remote_code(ref, "model.base")
    return ref


def base_tokenizer(cfg: Config) -> Path | str:
    tok = cfg.params.model.tokenizer.strip()
    if not tok:
        return base_model(cfg)
    p = cfg.path(tok)
    ref = p if p.exists() else tok
    refuse_remote_code(ref, "model.tokenizer")
    return ref


def corpus_dir(cfg: Config, name: str) -> Path:
    """A prepared corpus: ``work/prepare/<name>/{train,valid,test}/part-NNNNN.parquet`` (read it with
    ``bertpipe.corpusio``)."""
    return cfg.work / "prepare" / name
