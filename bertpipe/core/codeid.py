"""The code identity of a stage: which source files compute its output, their digest, and the library versions.

The rule (one, so it can be explained and checked): a stage's code is every module of its package(s) (e.g.
``bertpipe/stages/vocab/*.py``) plus every ``bertpipe`` module those import, transitively — static ``import`` statements
anywhere in a file, lazy ones inside functions included — except the modules in ``UNDIGESTED`` (and every stage
package's ``declare.py``), which are neither counted nor followed. They decide where, when and how a stage runs and
what is recorded about it (the graph, the runner and its locks/atomic renames, tracking, config loading, the CLI,
the doors, error types); they never decide what an output holds, and what they contribute to a stage (input paths,
params values) is already in the fingerprint. Counting them would make a one-line change to ``tracking.py``
re-pretrain every model. Which layer folder a module stands in does not decide it: most of ``infra/`` is
undigested, yet ``infra/device.py`` (precision rules) is counted, and ``lib/layout.py`` (paths) is not.
Everything else under ``bertpipe/`` is domain logic (data, training, metrics, model facts) and counts for the
stages that import it; nothing else needs listing by hand, so a new helper a stage starts to import is covered the
moment it is imported. ``docs/architecture.md`` lists which modules count for which stage.

Each file is hashed as its syntax tree (``ast.dump``), not its bytes: editing a comment or re-wrapping a line does
not retrain a model, while any change to what the code does (a docstring included) does. The libraries are each
stage's explicit ``libs`` (torch, transformers, ... as fit the stage), by installed version.

Files are parsed one at a time (``_PARSING``), each text once: the flow computes its stages' cache keys in its worker
threads at once, and CPython 3.11's ``ast.parse`` is not thread-safe (two interleaved parses raise "AST constructor
recursion depth mismatch").

Paths are relative to the directory holding the ``bertpipe`` package, so a clone, a copy or an installed package
with the same code has the same identity.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import threading
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1]  # .../bertpipe
ORIGIN = PACKAGE.parent  # code paths are relative to this
# Never part of a stage's code digest (see the module docstring). tasks/ and flows/ (the Prefect door) are outside
# the package and never followed either.
UNDIGESTED = frozenset(f"bertpipe/{m}.py" for m in (
    "__init__",  # the package version: recorded in each manifest's "versions", not a computation
    "core/__init__", "infra/__init__", "lib/__init__", "stages/__init__",  # the layers' faces: a docstring each
    "core/codeid", "core/declared", "core/outputs", "core/stage",
    "doors/cli/commands", "doors/incoming", "doors/dvc/dvcfile", "graph/freshness", "graph/pipeline",
    "infra/config", "infra/errors", "infra/orphans", "infra/tracking", "infra/versioning", "lib/samples",
    "lib/layout",  # where the base model, corpora and stage outputs live: paths, which are fingerprinted as inputs
    "stages/pretrain/run",  # the torchrun launcher: which rank calls run_stage; lib/mlm/train.py does the training
))
# A stage package's declaration (its inputs, output, params sections: all in the fingerprint) is graph wiring too.
DECLARATION = "declare.py"
MODEL_LIBS = ("torch", "transformers", "tokenizers")


def undigested(rel: str) -> bool:
    """Whether the file (relative to ORIGIN) stays out of every code digest, and its imports unfollowed."""
    return rel in UNDIGESTED or rel.rpartition("/")[2] == DECLARATION


def _rel(p: Path) -> str:
    return p.resolve().relative_to(ORIGIN).as_posix()


def _module_file(module: str) -> Path | None:
    base = ORIGIN.joinpath(*module.split("."))
    for cand in (base.with_suffix(".py"), base / "__init__.py"):
        if cand.is_file():
            return cand
    return None


_PARSING = threading.Lock()


def _parsed(rel: str) -> tuple[str, tuple[str, ...]]:
    """(digest of the syntax tree, the bertpipe modules the file imports)."""
    text = (ORIGIN / rel).read_text(encoding="utf-8")
    with _PARSING:  # one parse at a time; a thread that waited finds the text parsed
        return _parse(rel, text)


@functools.lru_cache(maxsize=None)
def _parse(rel: str, text: str) -> tuple[str, tuple[str, ...]]:
    # keyed by the text: parsing is the cost, and an edited file is parsed again. Call only holding _PARSING.
    tree = ast.parse(text, filename=rel)
    pkg = rel[:-3].split("/")[:-1] if not rel.endswith("__init__.py") else rel.split("/")[:-1]
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: resolved against this file's package
                parent = pkg[: len(pkg) - node.level + 1]
                base = ".".join(parent + ([node.module] if node.module else []))
            names.append(base)
            names += [f"{base}.{a.name}" for a in node.names]  # `from bertpipe.x import module`
    mods = tuple(sorted({n for n in names if n == "bertpipe" or n.startswith("bertpipe.")}))
    return hashlib.sha256(ast.dump(tree).encode()).hexdigest(), mods


def _closure(todo: list[Path]) -> tuple[str, ...]:
    """The files of ``todo`` and every bertpipe module they import, transitively, the undigested ones neither
    counted nor followed (relative to ORIGIN, sorted)."""
    seen: set[str] = set()
    while todo:
        rel = _rel(todo.pop())
        if rel in seen or undigested(rel):
            continue
        seen.add(rel)
        for mod in _parsed(rel)[1]:
            f = _module_file(mod)
            if f is not None:
                todo.append(f)
                # importing bertpipe.a.b runs bertpipe/a/__init__.py too
                parts = mod.split(".")
                todo += [x for i in range(1, len(parts)) if (x := _module_file(".".join(parts[:i]))) is not None]
    return tuple(sorted(seen))


@functools.lru_cache(maxsize=None)
def code_files(packages: tuple[str, ...]) -> tuple[str, ...]:
    """The source files (relative to ORIGIN) of ``packages`` (stage packages under bertpipe/stages/, e.g.
    ``("vocab",)``) and what they import."""
    return _closure([p for pkg in packages for p in sorted((PACKAGE / "stages" / pkg).glob("*.py"))])


@functools.lru_cache(maxsize=None)
def module_code(modules: tuple[str, ...]) -> dict[str, str]:
    """``{path: digest[:16]}`` of ``modules`` (dotted names, e.g. ``("bertpipe.lib.measures.windows",)``) and what they
    import, by the stages' rule: the code identity of something derived outside a stage (a keyed store), so an edit
    to any module its builder runs makes a new one."""
    files = []
    for mod in modules:
        f = _module_file(mod)
        if f is None:
            raise ValueError(f"{mod}: no such module under {ORIGIN}")
        files.append(f)
    return {rel: _parsed(rel)[0][:16] for rel in _closure(files)}


def module_digest(modules: tuple[str, ...]) -> str:
    """One digest of ``module_code(modules)``."""
    return hashlib.sha256(repr(sorted(module_code(modules).items())).encode()).hexdigest()[:32]


def lib_versions(libs: tuple[str, ...]) -> dict[str, str]:
    """Each library's release, without a local build label (torch's ``2.13.0+cpu`` is ``2.13.0``): the CPU and the
    CUDA wheel of one release compute the same, and a digest must not depend on which index the wheel came from."""
    out = {}
    for lib in libs:
        try:
            out[lib] = version(lib).split("+")[0]
        except PackageNotFoundError:
            out[lib] = "absent"
    return out


@functools.lru_cache(maxsize=None)
def code_identity(packages: tuple[str, ...], libs: tuple[str, ...]) -> dict:
    """``{"digest", "files": {path: digest[:16]}, "libs": {dist: version}}``: what manifest.json records as "code"."""
    files = {rel: _parsed(rel)[0][:16] for rel in code_files(packages)}
    versions = lib_versions(libs)
    blob = repr((sorted(files.items()), sorted(versions.items())))
    return {"digest": hashlib.sha256(blob.encode()).hexdigest()[:32], "files": files, "libs": versions}
