"""retrain: new domain files arrive -> version them -> re-run what they invalidate -> challenger vs champion.

1. copy the new files into ``flow.drop_dir`` (the originals are never touched) and `dvc add` it in a DVC repo;
   a non-empty drop dir joins the domain corpus for every front door (see ``bertpipe.config._with_incoming``);
2. with ``flow.retrain_from: champion``, export the champion encoder from the registry and continue pretraining
   from it (``model.continue_from``); with ``base``, adapt the base again;
3. run domain_adaptation: prepare sees new content, so everything downstream re-runs; register scores the new
   versions against the champions on the same held-out test sets and promotes or not. Nothing already registered
   is altered.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

from tasks.env import prefect_env

prefect_env()

from prefect import flow  # noqa: E402

from bertpipe.config import Config, load_config  # noqa: E402
from bertpipe.errors import BertpipeError  # noqa: E402
from bertpipe.register.registry import export_model  # noqa: E402
from flows.domain_adaptation import domain_adaptation, summary  # noqa: E402


def add_files(cfg: Config, paths: list[str]) -> list[Path]:
    drop = cfg.path(cfg.params.flow.drop_dir)
    drop.mkdir(parents=True, exist_ok=True)
    added = []
    for p in paths:
        src = Path(p)
        if not src.is_file():
            raise BertpipeError(f"--add {p}: not a file")
        dest = drop / src.name
        if dest.exists():
            if dest.read_bytes() == src.read_bytes():
                added.append(dest)
                continue
            raise BertpipeError(f"--add {p}: {dest} already exists with other content; rename the new file")
        tmp = drop / f".{src.name}.tmp"
        shutil.copyfile(src, tmp)
        os.replace(tmp, dest)
        added.append(dest)
    return added


@flow(name="retrain", log_prints=True)
def retrain(params: str = "params.yaml", add: list[str] | None = None, profile: str | None = None,
            overrides: list[str] | None = None) -> dict:
    params = str(Path(params).resolve())
    overrides = list(overrides or [])
    cfg = load_config(params, profile, overrides)
    added = add_files(cfg, list(add or []))
    if added:
        from bertpipe.versioning import dvc_add_if_repo

        dvc_add_if_repo(cfg.path(cfg.params.flow.drop_dir), cfg.root, log=print)
        dvc_yaml = cfg.root / "dvc.yaml"
        if dvc_yaml.exists():
            from bertpipe.dvcfile import HEADER, render

            if dvc_yaml.read_text(encoding="utf-8").startswith(HEADER):
                dvc_yaml.write_text(render(load_config(params, profile, overrides)), encoding="utf-8")
    if cfg.params.flow.retrain_from == "champion":
        champion = export_model(cfg, f"{cfg.params.register.prefix}-encoder")
        if champion is not None:
            print(f"continuing pretraining from the champion encoder {champion}")
            overrides.append(f"model.continue_from={champion}")
        else:
            print("no champion encoder registered yet: adapting the base")
    results = domain_adaptation(params, profile, overrides)
    return {"added": [str(p) for p in added], "results": results, "overrides": overrides}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--params", default="params.yaml")
    ap.add_argument("--profile", default=None)
    ap.add_argument("--set", dest="overrides", action="append", default=[])
    ap.add_argument("--add", nargs="+", default=[])
    a = ap.parse_args(argv)
    out = retrain(a.params, a.add, a.profile, a.overrides)
    print(summary(out["results"], load_config(a.params, a.profile, out["overrides"])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
