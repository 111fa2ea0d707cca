"""retrain: new domain files arrive -> version them -> re-run what they invalidate -> challenger vs champion.

1. validate each new file as prepare will read it, then copy it into ``flow.drop_dir`` (the originals are never
   touched; a bad file changes nothing) and `dvc add` it in a DVC repo; a non-empty drop dir joins the domain corpus
   for every front door (see ``bertpipe.stages.prepare.declare.with_incoming``);
2. run domain_adaptation: prepare sees new content, so everything downstream re-runs. Where pretraining starts is
   the graph's decision (``bertpipe.lib.lineage``), the same for every front door: with ``flow.retrain_from: champion``
   the vocab stage extends the champion encoder's tokenizer with the new words and pretraining continues from it;
   with ``base`` the base is adapted again;
3. register scores the new versions against the champions on the same held-out test sets and promotes or not.
   Nothing already registered is altered.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from prefect import flow

from bertpipe.doors.incoming import add_files, drop_dir
from bertpipe.graph.pipeline import load_config
from bertpipe_prefect.tasks.env import prefect_env

from .domain_adaptation import domain_adaptation
from .summary import summary


@flow(name="retrain", log_prints=True)
def retrain(params: str = "params.yaml", add: list[str] | None = None, profile: str | None = None,
            overrides: list[str] | None = None) -> dict:
    params = str(Path(params).resolve())
    overrides = list(overrides or [])
    cfg = load_config(params, profile, overrides)
    added = add_files(cfg, list(add or []))
    if added:
        from bertpipe.infra.versioning import dvc_add_if_repo

        dvc_add_if_repo(drop_dir(cfg), cfg.root, log=print)
        dvc_yaml = cfg.root / "dvc.yaml"
        if dvc_yaml.exists():
            from bertpipe.doors.dvc.dvcfile import HEADER, render

            if dvc_yaml.read_text(encoding="utf-8").startswith(HEADER):
                dvc_yaml.write_text(render(load_config(params, profile, overrides)), encoding="utf-8")
    results = domain_adaptation(params, profile, overrides)
    from bertpipe.lib.layout import base_model, read_start, start_file
    from bertpipe.lib.startrecord import describe

    # What the start stage decided in this run (it asked the registry; this door asks nothing itself).
    cfg = load_config(params, profile, overrides)
    rec = read_start(start_file(cfg))
    if rec is not None:
        print(("adapting " if rec["kind"] == "base" else "continuing pretraining from ")
              + describe(rec, rec["model"] or base_model(cfg)))
    return {"added": [str(p) for p in added], "results": results, "overrides": overrides}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--params", default="params.yaml")
    ap.add_argument("--profile", default=None)
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    ap.add_argument("--add", nargs="+", default=[])
    a = ap.parse_args(argv)
    prefect_env(load_config(a.params, a.profile, a.overrides))  # Prefect's home under paths.state, before it starts
    out = retrain(a.params, a.add, a.profile, a.overrides)
    print(summary(out["results"], load_config(a.params, a.profile, out["overrides"])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
