"""The drop dir (``flow.drop_dir``): new domain files enter it only after prepare has been shown able to read them.

A file that prepare cannot read would make every later run fail until someone deleted it by hand, and a file the
incoming source's glob does not match would be reported as added and then silently ignored. So `bertpipe retrain
--add` reads each file exactly as prepare will (``bertpipe.stages.prepare.ingest`` with ``flow.incoming_source``) before
copying anything; one bad file rejects the whole call and the drop dir stays as it was.
"""

from __future__ import annotations

import fnmatch
import shutil
from pathlib import Path

from bertpipe.core.outputs import atomic_file
from bertpipe.infra.config import Config
from bertpipe.infra.errors import BertpipeError


def drop_dir(cfg: Config) -> Path:
    return cfg.path(cfg.params.flow.drop_dir)


def _source(cfg: Config, path: Path):
    from bertpipe.infra.config import validated
    from bertpipe.stages.prepare.params import SourceParams

    return validated(SourceParams, {**cfg.params.flow.incoming_source, "path": str(path)}, "flow.incoming_source")


def check_file(cfg: Config, path: Path) -> int:
    """Usable records in ``path`` read as prepare will read it from the drop dir; a one-line error otherwise."""
    from bertpipe.stages.prepare.ingest import Ingest, file_format

    from bertpipe.stages.prepare.files import regular_file

    if not path.exists():
        raise BertpipeError(f"--add {path}: not a file (it does not exist)")
    regular_file(path, "--add")  # a FIFO would block the read below forever
    src = _source(cfg, path)
    pattern = src.glob or "*"
    if path.name.startswith(".") or not fnmatch.fnmatch(path.name, pattern):
        raise BertpipeError(f"--add {path}: prepare reads only files matching {pattern!r} (not starting with '.') "
                            "from the drop dir (flow.incoming_source.glob); rename the file")
    ingest = Ingest(cfg.path)
    reader = getattr(ingest, f"_read_{file_format(src, path)}")
    usable = 0
    try:
        for _, _, row in reader(src, path):
            text = row.get(src.text_field)
            usable += isinstance(text, str) and bool(text.strip())
    except BertpipeError as e:
        raise BertpipeError(f"--add {e}") from None
    if not usable:
        raise BertpipeError(f"--add {path}: no record with a non-empty {src.text_field!r} field "
                            f"(flow.incoming_source.text_field); nothing for prepare to read")
    return usable


def plan(cfg: Config, paths: list[str]) -> list[tuple[Path, Path]]:
    """(file, where it goes in the drop dir) for every file, each checked; copies nothing. A file already there
    with the same bytes counts as added; one with other content under that name is an error."""
    drop = drop_dir(cfg)
    out: list[tuple[Path, Path]] = []
    for p in paths:
        src = Path(p)
        check_file(cfg, src)
        dest = drop / src.name
        if dest.exists() and dest.read_bytes() != src.read_bytes():
            raise BertpipeError(f"--add {p}: {dest} already exists with other content; rename the new file")
        if any(d == dest for _, d in out):
            raise BertpipeError(f"--add {p}: two files named {src.name}; rename one")
        out.append((src, dest))
    return out


def add_files(cfg: Config, paths: list[str]) -> list[Path]:
    """Check every file (``plan``), then copy each into the drop dir (atomically; the originals are never touched)."""
    todo = plan(cfg, paths)
    drop_dir(cfg).mkdir(parents=True, exist_ok=True)
    for src, dest in todo:
        if dest.exists():
            continue
        with atomic_file(dest) as tmp:
            shutil.copyfile(src, tmp)
    return [d for _, d in todo]
