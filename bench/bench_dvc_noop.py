"""A `dvc repro` with nothing to do: DVC's floor, dvc.yaml's layouts (before, after, split), libyaml or not (ratios).

Builds nothing heavy: four temp git+DVC projects whose dvc.yaml is the one `bertpipe dvc-yaml` generates for this
repo's params.yaml (the demo's 21 stages, their real deps, params sections and values, and the real source files),
each stage's command replaced by a stand-in that only creates its output paths:

- ``floor``: one stage, one dep, one out (what any DVC project pays: import, repo, lock);
- ``before``: each stage lists its own ~20 source files as deps and its resolved values as DVC params of one file,
  ``params.effective.json``;
- ``after``: the code folder once, as a dep of the ``params`` stage; each stage depends on its own
  ``params_effective/<stage>.json`` (its resolved values and code digest: bertpipe.doors.dvc.dvcfile), all in one
  dvc.yaml;
- ``split``: ``after`` with the always_changed stage (start) in its own ``stages/start/dvc.yaml`` (``wdir: ../..``),
  the layout `bertpipe dvc-yaml` writes: DVC rewrites start's ~20-line lock after running it, not the root dvc.lock.

Each is built once (`dvc repro` runs the stand-ins), then timed no-op `dvc repro` runs alternate between them, with
ruamel's libyaml parser (ruamel.yaml.clib) and without it (a shadow ``_ruamel_yaml`` module makes ruamel fall back to
pure Python). As in the real project, one stage (start, ``always_changed``) runs every time, so DVC rewrites the lock;
its stand-in is a ~30 ms Python start where `bertpipe start` takes ~0.45 s. CPU is user+sys of the `dvc repro`
process tree. Usage: ``python bench/bench_dvc_noop.py [--rounds 3] [--raw data/raw]`` (needs the sample corpora:
`bertpipe data samples`, or ``--raw`` at a copy of them).

Figures: this bench, 1 round, on the 2-core machine shared with six sessions (load 8.2-8.5, 2026-12-05 01:19 UTC:
walls inflated by the load; CPU-s of the process tree is the figure): floor 0.71 s CPU (dvc.lock 15 lines); before,
pure-Python YAML 3.48, libyaml 2.40 (3,743 lines); after, pure-Python YAML 1.35, libyaml 1.23 (687 lines); **split,
libyaml 1.11** (669 lines). CPU before/split 3.12x; split/floor 1.57x; start's own file alone 1.10x; the layout
alone 2.58x; libyaml alone (before) 1.45x. The finished demo project's figures: README.md, "DVC: metrics, plots,
experiments".
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
VALUES = "params.effective.json"  # the ``before`` layout's one file of every stage's resolved values (DVC params)
sys.path.insert(0, str(REPO))

MK = """import sys, pathlib
out = pathlib.Path(sys.argv[1]); out.mkdir(parents=True, exist_ok=True); (out / ".made").write_text("x")
for f in sys.argv[2:]:
    p = pathlib.Path(f); p.parent.mkdir(parents=True, exist_ok=True); p.mkdir() if f.endswith("/") else p.write_text(f)
"""


def split_names(raw: Path) -> list[str]:
    """The stages `bertpipe dvc-yaml` puts in a file of their own (stages/<name>/dvc.yaml)."""
    from bertpipe.doors.dvc.dvcfile import dvc_files, split_stages
    from bertpipe.graph.pipeline import load_config

    return split_stages(dvc_files(load_config(REPO / "params.yaml", overrides=[f"paths.raw={raw}"])))


def layouts(raw: Path) -> tuple[dict, dict, dict[str, str], dict[str, str]]:
    """(after dvc.yaml, before dvc.yaml, after params files, before params files), commands not replaced. The params
    files are {path relative to the project: text}, what the ``params`` stage's stand-in writes."""
    import json

    from bertpipe.doors.dvc.dvcfile import dvc_stage_name, dvc_yaml, effective_file, effective_files, render_effective
    from bertpipe.graph.pipeline import all_stages, load_config
    from bertpipe.infra.config import deep_merge

    cfg = load_config(REPO / "params.yaml", overrides=[f"paths.raw={raw}"])
    after = dvc_yaml(cfg)
    before = yaml.safe_load(yaml.safe_dump(after))
    before["stages"]["params"]["deps"] = [d for d in after["stages"]["params"]["deps"] if d != "bertpipe"]
    before["stages"]["params"]["outs"] = [{VALUES: {"cache": False}}]
    values: dict = {}
    for name, st in all_stages(cfg).items():
        entry = before["stages"][dvc_stage_name(name)]
        entry["deps"] = [d for d in entry["deps"] if d != effective_file(name)] + list(st.code_identity()["files"])
        entry["params"] = [{VALUES: list(dict.fromkeys(st.sections))}]
    for d in effective_files(cfg).values():
        values = deep_merge(values, d["params"])
    return after, before, render_effective(cfg), {VALUES: json.dumps(values, indent=1, sort_keys=True) + "\n"}


def build(root: Path, dvc: dict, params_files: dict[str, str], split: tuple[str, ...] = ()) -> int:
    """A git+DVC project at ``root`` running stand-ins, the stages named in ``split`` in a dvc.yaml of their own
    (stages/<name>/dvc.yaml, run from the project root); built once. Returns the root dvc.lock's line count."""
    stages = dvc["stages"]
    outs = [next(iter(o)) for st in stages.values() for o in st.get("outs", []) if isinstance(o, dict)]
    root.mkdir(parents=True)
    (root / ".mk.py").write_text(MK)
    for rel, text in params_files.items():  # what the params stage's stand-in copies into the project
        (root / ".params.src" / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / ".params.src" / rel).write_text(text)
    for name, st in stages.items():
        kept = []
        for dep in st.get("deps", []):
            if dep.startswith(".."):
                continue  # outside the project: not a DVC dep there either
            kept.append(dep)
            if any(dep == o or dep.startswith(o + "/") for o in outs) or (root / dep).exists():
                continue
            src = REPO / dep
            (root / dep).parent.mkdir(parents=True, exist_ok=True)
            if dep == "bertpipe":  # the code folder: DVC hashes the real source files as it would
                shutil.copytree(src, root / dep, ignore=shutil.ignore_patterns("__pycache__"))
            elif dep.startswith("bertpipe/"):
                shutil.copy(src, root / dep)
            elif src.is_dir():
                (root / dep).mkdir(parents=True, exist_ok=True)
                (root / dep / "stand-in").write_text(dep)
            else:
                (root / dep).write_text(dep)
        st["deps"] = kept
        if name == "params":
            st["cmd"] = "cp -r .params.src/. ."
            continue
        out = next(iter(st["outs"][0]))
        made = sorted({d for s in stages.values() for d in s.get("deps", []) if d.startswith(out + "/")})
        st["cmd"] = " ".join(["python", ".mk.py", out, *[m + ("/" if "." not in Path(m).name else "") for m in made]])
    from bertpipe.doors.dvc.dvcfile import SPLIT_DIR

    for name in split:  # the same stage, its paths as at the root (wdir), as bertpipe.doors.dvc.dvcfile.dvc_files writes it
        (root / SPLIT_DIR / name).mkdir(parents=True)
        own = {"stages": {name: {"wdir": "../..", **stages.pop(name)}}}
        (root / SPLIT_DIR / name / "dvc.yaml").write_text(yaml.safe_dump(own, sort_keys=False, width=120))
    dvc = {"stages": stages}  # metrics/plots name files the stand-ins do not write
    (root / "params.yaml").write_text((REPO / "params.yaml").read_text())
    if (REPO / "profiles.yaml").exists():
        (root / "profiles.yaml").write_text((REPO / "profiles.yaml").read_text())
    (root / "dvc.yaml").write_text(yaml.safe_dump(dvc, sort_keys=False, width=120))
    for cmd in (["git", "init", "-q"], ["dvc", "init", "-q"], ["dvc", "repro", "-q"]):
        subprocess.run(cmd, cwd=root, check=True, capture_output=True, env=env(root, ""))
    return len((root / "dvc.lock").read_text().splitlines())


def env(root: Path, pythonpath: str) -> dict:
    e = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    e.update({"DVC_NO_ANALYTICS": "1", "DVC_SITE_CACHE_DIR": str(root / ".dvc-site")})
    if pythonpath:
        e["PYTHONPATH"] = pythonpath
    return e


def timed(root: Path, pythonpath: str) -> tuple[float, float]:
    c0, t0 = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    p = subprocess.run(["dvc", "repro"], cwd=root, capture_output=True, text=True, env=env(root, pythonpath))
    wall, c1 = time.perf_counter() - t0, resource.getrusage(resource.RUSAGE_CHILDREN)
    if p.returncode != 0 or p.stdout.count("Running stage") > 1:
        raise SystemExit(f"error: {root.name}: not a no-op repro:\n{p.stdout[-2000:]}{p.stderr[-2000:]}")
    return wall, c1.ru_utime + c1.ru_stime - c0.ru_utime - c0.ru_stime


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--raw", type=Path, default=REPO / "data" / "raw", help="the sample corpora (bertpipe data samples)")
    a = ap.parse_args()
    if not (a.raw / "china_law").is_dir():
        raise SystemExit(f"error: --raw {a.raw}: no sample corpora there (run `bertpipe data samples`)")
    try:
        import _ruamel_yaml  # noqa: F401
        clib = True
    except ImportError:
        clib = False
    after, before, after_eff, before_eff = layouts(a.raw)
    split = tuple(split_names(a.raw))
    with tempfile.TemporaryDirectory(prefix="bench-dvc-noop-") as tmp:
        tmp = Path(tmp)
        pure = tmp / "pure"
        pure.mkdir()
        (pure / "_ruamel_yaml.py").write_text("raise ImportError('pure-Python ruamel for the comparison')\n")
        floor = {"stages": {"one": {"cmd": "python .mk.py out", "deps": ["in.txt"], "outs": ["out"]}}}
        (tmp / "floor").mkdir()
        (tmp / "floor" / "in.txt").write_text("x")
        (tmp / "floor" / ".mk.py").write_text(MK)
        (tmp / "floor" / "dvc.yaml").write_text(yaml.safe_dump(floor))
        for cmd in (["git", "init", "-q"], ["dvc", "init", "-q"], ["dvc", "repro", "-q"]):
            subprocess.run(cmd, cwd=tmp / "floor", check=True, capture_output=True, env=env(tmp, ""))
        lines = {"floor": len((tmp / "floor" / "dvc.lock").read_text().splitlines()),
                 "before": build(tmp / "before", before, before_eff),
                 "after": build(tmp / "after", yaml.safe_load(yaml.safe_dump(after)), after_eff),
                 "split": build(tmp / "split", after, after_eff, split)}
        variants = {"floor": (tmp / "floor", "")}
        for lay in ("before", "after", "split"):
            variants[f"{lay}/pure-yaml"] = (tmp / lay, str(pure))
            if clib:
                variants[f"{lay}/libyaml"] = (tmp / lay, "")
        runs: dict[str, list[tuple[float, float]]] = {k: [] for k in variants}
        loads = [os.getloadavg()[0]]
        for r in range(a.rounds):
            for k, (root, pp) in variants.items():
                runs[k].append(timed(root, pp))
            loads.append(os.getloadavg()[0])
            print(f"round {r + 1}/{a.rounds} done (load {loads[-1]:.1f})", file=sys.stderr, flush=True)
    med = {k: (statistics.median(w for w, _ in v), statistics.median(c for _, c in v)) for k, v in runs.items()}
    print(f"no-op `dvc repro`, median of {a.rounds} (load {min(loads):.1f}-{max(loads):.1f}); "
          f"ruamel.yaml.clib {'installed' if clib else 'ABSENT'}")
    for k, (w, c) in med.items():
        print(f"  {k:18s} wall {w:5.2f} s  cpu {c:5.2f} s   dvc.lock {lines[k.split('/')[0]]:5d} lines")
    lib = "libyaml" if clib else "pure-yaml"
    base, best, one = med["before/pure-yaml"][1], med[f"split/{lib}"][1], med[f"after/{lib}"]
    print(f"  CPU before/split: {base / best:.2f}x   split/floor: {best / med['floor'][1]:.2f}x")
    print(f"  start's own file alone ({lib}): CPU after/split {one[1] / best:.2f}x, wall "
          f"{one[0] / med[f'split/{lib}'][0]:.2f}x")
    print(f"  layout alone (pure YAML): {base / med['after/pure-yaml'][1]:.2f}x" + (
        f"   libyaml alone (old layout): {base / med['before/libyaml'][1]:.2f}x" if clib else ""))


if __name__ == "__main__":
    main()
