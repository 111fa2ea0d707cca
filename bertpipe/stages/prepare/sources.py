"""The raw sources prepare reads, as the params name them: each enabled corpus, and every file, directory or glob
match its sources resolve to (the stage's inputs, listed before anything is read)."""

from __future__ import annotations

from pathlib import Path

from bertpipe.infra.errors import BertpipeError
from bertpipe.stages.prepare.files import regular_file
from bertpipe.stages.prepare.ingest import is_glob, source_files
from bertpipe.stages.prepare.params import PrepareParams

CORPORA = ("domain", "general")


def corpora(p: PrepareParams):
    """(name, params) of each corpus prepare builds; the domain corpus is required."""
    for name in CORPORA:
        cp = getattr(p, name)
        if name == "domain" and (not cp.enabled or not cp.sources):
            raise BertpipeError("prepare.domain.sources: the domain corpus needs at least one source")
        if cp.enabled and cp.sources:
            yield name, cp


def resolver(cfg):
    """Source paths may start with ``{raw}`` (``paths.raw``); relative paths resolve against the params file."""
    raw = cfg.params.paths.raw

    def resolve(p: str) -> Path:
        return cfg.path(p.replace("{raw}", raw))

    return resolve


def own_inputs(cfg) -> dict[str, Path]:
    """Every raw file, directory or glob match the params name, keyed ``<corpus>:<source index>[:<match>]``."""
    p: PrepareParams = cfg.params.prepare
    resolve = resolver(cfg)
    out: dict[str, Path] = {}
    for name, cp in corpora(p):
        for i, src in enumerate(cp.sources):
            key = f"prepare.{name}.sources[{i}]"
            if is_glob(src.path):
                for k, f in enumerate(source_files(src, resolve, key)):
                    out[f"{name}:{i}:{k}"] = f
                continue
            path = resolve(src.path)
            if not path.exists():
                raise BertpipeError(f"{key}.path ({name}:{i}): {path} does not exist")
            # Before the fingerprint and the MLflow run: reading a FIFO (named, or in a directory) would hang.
            if path.is_dir():
                source_files(src, resolve, key)
            else:
                regular_file(path, f"{key}.path")
            out[f"{name}:{i}"] = path
    return out
