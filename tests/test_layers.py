"""Layers with one direction, checked the way CI runs it: `lint-imports` with the contracts in pyproject.toml, and no
import cycle between any two modules of bertpipe/, tasks/ and flows/ (lazy imports inside functions and imports made
for type hints alone count). Quick: static analysis only, nothing is imported."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_lint_imports_keeps_every_contract():
    exe = shutil.which("lint-imports") or str(Path(sys.executable).parent / "lint-imports")
    proc = subprocess.run([exe, "--no-cache"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert "0 broken" in proc.stdout and " kept" in proc.stdout, proc.stdout


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10000))
    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycles_between_modules():
    import grimp

    from bertpipe.graph.contracts import PREFECT

    g = grimp.build_graph("bertpipe", *PREFECT, cache_dir=None, exclude_type_checking_imports=False)
    mods = set(g.modules)
    edges = {m: {d for d in g.find_modules_directly_imported_by(m) if d in mods} for m in mods}
    assert cycles(edges) == []
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == [["a", "b", "c"]]  # the check can fail


def test_committed_contracts_are_the_ones_the_folders_derive():
    """pyproject.toml's import-linter contracts are generated from bertpipe/'s folders, so a module or stage package
    added to a folder is inside them; regenerate with `python -m bertpipe.graph.contracts`."""
    from bertpipe.graph.contracts import PYPROJECT, render, stage_packages, written

    text = PYPROJECT.read_text(encoding="utf-8")
    assert written(text) == text, "import-linter contracts out of date: run `python -m bertpipe.graph.contracts`"
    assert "stage packages stand side by side" in render()
    assert {"bertpipe.stages.splits", "bertpipe.stages.finetune", "bertpipe.stages.register"} <= set(stage_packages())


def test_bertpipe_holds_its_layers_and_its_face_only(tmp_path, monkeypatch):
    """`ls bertpipe` is the layers: every folder is one of them, no module stands beside them but the package's face
    (__init__.py, __main__.py)."""
    from bertpipe.graph import contracts

    assert contracts.outside_layers() == []
    for name in (*contracts.LAYERS, "misc"):  # the check can fail: a folder or a module beside the layers
        (tmp_path / name).mkdir()
    for name in ("__init__.py", "__main__.py", "helpers.py"):
        (tmp_path / name).touch()
    monkeypatch.setattr(contracts, "PACKAGE", tmp_path)
    assert contracts.outside_layers() == ["helpers.py", "misc"]


def test_each_stage_family_is_declared_by_a_stage_package():
    """The graph's families come from the folders of bertpipe/stages/, the packages the independence contract holds."""
    from bertpipe.graph.contracts import stage_packages
    from bertpipe.graph.pipeline import FAMILIES

    assert {f.package for f in FAMILIES} == set(stage_packages())
