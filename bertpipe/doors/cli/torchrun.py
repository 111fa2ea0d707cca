"""Run the `base` or `pretrain` stage in one process of a torchrun job: the command torchrun starts in every rank.

    torchrun --nproc_per_node=2 -m bertpipe.doors.cli.torchrun --stage pretrain [--params params.yaml] [--set k=v ...]

A door like the CLI: it loads params.yaml with the graph's params model, looks the stage up in the graph and hands
it to ``bertpipe.stages.pretrain.run.run`` (what each rank does: see that module).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from bertpipe.core.stage import NO_TRACKING
from bertpipe.graph.pipeline import family_stages, load_config
from bertpipe.infra.errors import BertpipeError
from bertpipe.stages.pretrain.run import run


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bertpipe.doors.cli.torchrun", description=__doc__.split("\n")[0])
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
        stage = family_stages(cfg, args.stage).get(args.stage)
        if stage is None:
            raise BertpipeError(f"--stage {args.stage}: not a stage of this pipeline (base needs model.base: scratch)")
        quiet = NO_TRACKING if args.no_tracking else None
        res = run(stage, cfg, force=args.force, tracker_factory=quiet)
    except BertpipeError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if res is not None:
        print(f"{res.name}: {'up to date' if res.skipped else 'built'} -> {res.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
