"""What a run wrote, held against what its stages declare (``bertpipe.core.stage``): a build writes its output, its
scratch, the keyed stores its Stage names in ``stores`` and, when it says ``registry``, the model registry; the rest
of paths.state is the runner's and the doors'.

``snapshot`` the project (and paths.state) before a run and after it; ``undeclared_writes`` places each file the run
wrote or removed, and holds a file written while a stage was building (its manifest's ``started`` and
``duration_s``) to that stage's output and stores; ``undeclared_versions`` holds each model version registered
during the run to a build of a stage that declares the registry."""

from __future__ import annotations

import fnmatch
import os
from pathlib import Path

from bertpipe.core.stage import read_manifest

# paths.state's places that are the runner's and the doors', not a stage's: the hash cache, output locks, scratch,
# open-run markers, the MLflow tracking store, Prefect's home, the flow's logs, sample downloads (`bertpipe fetch`)
RUNNER = ("hashcache.json", "locks", "scratch", "open-runs", "mlflow.db", "mlflow.db-journal", "mlflow.db-wal",
          "mlflow.db-shm", "mlflow.db.lock", "mlartifacts", "prefect", "logs", "downloads", "dvc-site-cache")
# The registry's own file beside the sqlite store (its lock); its rows live in mlflow.db with the tracking store's.
REGISTRY = (".mlflow.db.registry.lock",)
# The project's files the DVC door records after a run (dvc.lock, as `dvc commit` would, with the outputs' lines in
# .gitignore files) and DVC's own state.
DVC = ("dvc.lock", "stages/*/dvc.lock", ".gitignore", "*/.gitignore", ".dvc/*")
# Seconds around a build's span: file times come from a coarser clock than time.time().
SLACK = 0.05


def snapshot(*roots: Path) -> dict[Path, tuple[int, int]]:
    """{file: (mtime_ns, size)} of every file under ``roots`` (``.git`` aside; links not followed)."""
    out: dict[Path, tuple[int, int]] = {}
    for root in roots:
        for folder, dirs, files in os.walk(Path(root).resolve()):
            dirs[:] = [d for d in dirs if d != ".git"]
            for name in files:
                p = Path(folder) / name
                try:
                    st = p.lstat()
                except FileNotFoundError:  # removed while walking
                    continue
                out[p] = (st.st_mtime_ns, st.st_size)
    return out


def builds(cfg, stages: dict, since: float) -> list[tuple[float, float, object]]:
    """(start, end, Stage) of each build since ``since`` (from its manifest): the span it measured, up to the
    manifest's own write (the last file of a build, after the span is measured; under load seconds later)."""
    out = []
    for st in stages.values():
        m = read_manifest(st.output(cfg)) or {}
        if m.get("started", 0) >= since:
            written = (st.output(cfg) / "manifest.json").stat().st_mtime
            out.append((m["started"] - SLACK, max(m["started"] + m["duration_s"], written) + SLACK, st))
    return out


def place(p: Path, cfg, stages: dict) -> tuple[str, object]:
    """Where ``p`` lies: ("output", Stage), ("store", folder), ("registry", None), ("runner", None), ("dvc", None) or
    ("nowhere", None)."""
    for out, st in sorted(((st.output(cfg).resolve(), st) for st in stages.values()), key=lambda x: -len(x[0].parts)):
        if p.is_relative_to(out):  # the deepest output holding it
            return "output", st
    state = cfg.state.resolve()
    if p.is_relative_to(state):
        top = p.relative_to(state).parts[0]
        if top in {s for st in stages.values() for s in st.stores}:
            return "store", top
        if top in REGISTRY:
            return "registry", None
        if top in RUNNER:
            return "runner", None
    root = cfg.root.resolve()
    if p.is_relative_to(root) and any(fnmatch.fnmatch(p.relative_to(root).as_posix(), g) for g in DVC):
        return "dvc", None
    return "nowhere", None


def undeclared_writes(cfg, stages: dict, before: dict, after: dict, since: float) -> list[str]:
    """One line per file written or removed between the snapshots ``before`` and ``after`` that no declaration
    covers: outside every place, or written while stages built into a place none of them declares."""
    spans = builds(cfg, stages, since)
    found = []
    for p in sorted({p for p, v in after.items() if before.get(p) != v} | (before.keys() - after.keys())):
        kind, what = place(p, cfg, stages)
        t = after[p][0] / 1e9 if p in after else None
        building = [st for a, b, st in spans if t is not None and a <= t <= b]
        names = ", ".join(st.name for st in building)
        if kind == "nowhere":
            found.append(f"{p}: {'written' if t else 'removed'} outside every stage's output, store and the runner's "
                         f"places" + (f" (while {names} built)" if building else ""))
        elif kind == "output" and building and what not in building:
            found.append(f"{p}: in {what.name}'s output, written while {names} built")
        elif kind == "store" and building and not any(what in st.stores for st in building):
            found.append(f"{p}: in the {what!r} stores, written while {names} built, which do not declare them")
        elif kind == "registry" and t is not None and not any(st.registry for st in building):
            found.append(f"{p}: the registry's, written while {names or 'no stage'} built, not one declaring it")
    return found


def undeclared_versions(cfg, stages: dict, client, since: float) -> list[str]:
    """One line per model version registered since ``since`` outside the build of a stage declaring the registry."""
    spans = builds(cfg, stages, since)
    found = []
    for rm in client.search_registered_models():
        for v in client.search_model_versions(f"name='{rm.name}'"):
            t = v.creation_timestamp / 1000
            if t >= since and not any(a <= t <= b and st.registry for a, b, st in spans):
                found.append(f"{v.name} v{v.version}: registered while no stage declaring the registry built")
    return found
