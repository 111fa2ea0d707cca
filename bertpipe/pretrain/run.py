"""Run the `base` or `pretrain` stage in every process of a torchrun job.

    torchrun --nproc_per_node=2 -m bertpipe.pretrain.run --stage pretrain [--params params.yaml] [--set k=v ...]

Rank 0 goes through ``run_stage`` as a single process would (fingerprint, output lock, MLflow run, atomic rename,
manifest). The other ranks must not: they would block on rank 0's output lock while rank 0 waits for them in the
first collective. They compute the same fingerprint, hence the same ``scratch`` dir, and call the same ``build`` with
a throwaway ``out`` and no tracker; ``build`` lets only rank 0 write. Without torchrun this is plain ``run_stage``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
from pathlib import Path

from bertpipe.errors import BertpipeError


def _rank() -> tuple[int, int]:
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


def run(stage, cfg, force: bool = False, tracker_factory=None):
    """``run_stage`` that also works in every rank of a torchrun job (returns None on ranks > 0)."""
    from bertpipe.stage import StageContext, fingerprint, read_manifest, run_stage, scratch_dir

    rank, world = _rank()
    if world == 1 or rank == 0:
        return run_stage(stage, cfg, force=force, tracker_factory=tracker_factory)
    fp, _ = fingerprint(stage, cfg)
    m = read_manifest(stage.output(cfg))
    if not force and m is not None and m.get("fingerprint") == fp:
        return None  # rank 0 skips too
    section = stage.params_section or stage.sections[0]
    with tempfile.TemporaryDirectory(prefix=f"bertpipe-{stage.name.replace('/', '_')}-rank{rank}-") as tmp:
        ctx = StageContext(stage.name, cfg, cfg.section(section), stage.inputs(cfg), Path(tmp), scratch_dir(stage, cfg, fp),
                           fp, None)
        stage.build(ctx)
    return None


def main(argv: list[str] | None = None) -> int:
    from bertpipe.config import load_config
    from bertpipe.pipeline import base_stage, pretrain_stage

    ap = argparse.ArgumentParser(prog="python -m bertpipe.pretrain.run", description=__doc__.split("\n")[0])
    ap.add_argument("--stage", choices=("base", "pretrain"), default="pretrain")
    ap.add_argument("--params", "-p", default="params.yaml")
    ap.add_argument("--profile", default=None)
    ap.add_argument("--set", "-s", dest="overrides", action="append", default=[])
    ap.add_argument("--force", action="store_true")
    ap.add_argument("--no-tracking", action="store_true", help="do not log to MLflow (quick local runs, tests)")
    args = ap.parse_args(argv)
    try:
        explicit = args.params if (args.params != "params.yaml" or Path(args.params).exists()) else None
        cfg = load_config(explicit, args.profile, args.overrides)
        stage = base_stage() if args.stage == "base" else pretrain_stage()
        quiet = (lambda *a: contextlib.nullcontext()) if args.no_tracking else None
        res = run(stage, cfg, force=args.force, tracker_factory=quiet)
    except BertpipeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if res is not None:
        print(f"{res.name}: {'up to date' if res.skipped else 'built'} -> {res.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
