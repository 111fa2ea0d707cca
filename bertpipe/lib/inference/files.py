"""Batch prediction over a file (`bertpipe models predict`): jsonl / csv / txt in, jsonl out, one output line per
input line in order. A bad line becomes an ``{"line", "error"}`` output line and a stderr message naming it, and the
run goes on (``strict`` stops at the first instead). Output is written to a temp file and renamed at the end, so an
interrupted or strict-failed run leaves no half-written file and never touches an existing one. The paths are
checked (``check_paths``) before the model is loaded, so a mistyped file name costs no model load; an existing output
is replaced only when the user says so (``--force``).
"""

from __future__ import annotations

import csv
import json
import os
import sys
from pathlib import Path
from typing import Iterator

from bertpipe.core.outputs import atomic_file
from bertpipe.infra.errors import BertpipeError


SUFFIXES = (".jsonl", ".json", ".csv", ".txt", ".tsv")


def check_paths(src: Path, dst: Path, force: bool = False) -> None:
    """Refuse, naming the user's path, an input that cannot be read and an output that cannot or must not be
    written: a directory, a missing parent, the input itself, an existing file without ``force``."""
    src, dst = Path(src), Path(dst)
    if not src.is_file():
        raise BertpipeError(f"{src}: " + ("is a directory; --input names a file" if src.is_dir() else
                                          "no such input file"))
    if src.suffix.lower() not in SUFFIXES:
        raise BertpipeError(f"{src}: expected a .jsonl, .csv, .tsv or .txt file")
    if not os.access(src, os.R_OK):
        raise BertpipeError(f"{src}: cannot read (permission denied)")
    if dst.is_dir():
        raise BertpipeError(f"{dst}: is a directory; --output names the jsonl file to write")
    if not dst.parent.is_dir():
        raise BertpipeError(f"{dst}: its directory {dst.parent} does not exist")
    if dst.exists() and src.resolve() == dst.resolve():
        raise BertpipeError(f"{dst}: the output must not overwrite the input")
    if dst.exists() and not force:
        raise BertpipeError(f"{dst}: exists; give --force to replace it, or another --output")


def count_lines(path: Path) -> int:
    """Data lines of ``path`` for the progress bar's total (a csv's header is not one)."""
    n, last = 0, b"\n"
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            n += chunk.count(b"\n")
            last = chunk[-1:]
    n += last != b"\n"  # a last line without its newline
    return max(0, n - 1) if path.suffix.lower() in (".csv", ".tsv") else n


def read_rows(path: Path) -> Iterator[tuple[int, dict | None, str]]:
    """(line number, record or None, error) per data line of a .jsonl, .csv or .txt file."""
    suffix = path.suffix.lower()
    if suffix not in SUFFIXES:
        raise BertpipeError(f"{path}: expected a .jsonl, .csv, .tsv or .txt file")
    try:
        f = open(path, encoding="utf-8-sig", newline="")
    except OSError as e:
        raise BertpipeError(f"{path}: cannot read ({e.strerror})") from None
    with f:
        if suffix in (".csv", ".tsv"):
            reader = csv.DictReader(f, delimiter="\t" if suffix == ".tsv" else ",")
            for rec in reader:
                yield reader.line_num, rec, ""
            return
        for i, line in enumerate(f, 1):
            line = line.rstrip("\r\n")
            if not line.strip():
                yield i, None, "empty line"
            elif suffix == ".txt":
                yield i, {"text": line}, ""
            else:
                try:
                    rec = json.loads(line)
                except ValueError as e:
                    yield i, None, f"not valid JSON ({e.msg})"
                    continue
                if isinstance(rec, str):
                    rec = {"text": rec}
                if not isinstance(rec, dict):
                    yield i, None, "expected a JSON object or string"
                    continue
                yield i, rec, ""


def check_record(rec: dict, task_type: str) -> str:
    """'' when ``rec`` has what the task needs, else what was expected."""
    keys = ("question", "context") if task_type == "qa" else ("text",)
    for k in keys:
        if not isinstance(rec.get(k), str) or not rec[k].strip():
            return f"expected a non-empty string field {k!r} (have {sorted(rec)})"
    if task_type == "pair_classification" and not isinstance(rec.get("text_pair"), str):
        return "expected a string field 'text_pair'"
    return ""


def predict_file(predictor, src: Path, dst: Path, strict: bool = False, chunk: int = 256, force: bool = False,
                 log=lambda m: print(m, file=sys.stderr, flush=True)) -> dict:
    """Score ``src`` into ``dst``; returns {"lines", "predicted", "bad"}."""
    from tqdm.auto import tqdm

    src, dst = Path(src), Path(dst)
    check_paths(src, dst, force)
    stats = {"lines": 0, "predicted": 0, "bad": 0}
    pending: list[tuple[int, dict | None, str]] = []
    bar = tqdm(desc=f"predict {src.name}", total=count_lines(src), unit="line", file=sys.stderr, mininterval=0.5)

    def flush(out) -> None:
        good = [(n, r) for n, r, err in pending if not err]
        preds = predictor.predict([r for _, r in good]) if good else []
        by_line = {n: p for (n, _), p in zip(good, preds)}
        for n, r, err in pending:
            row = {"line": n, "error": err} if err else {"line": n, "prediction": by_line[n]}
            if r is not None and "id" in r:
                row = {"id": r["id"], **row}
            out.write(json.dumps(row, ensure_ascii=False) + "\n")
        bar.update(len(pending))
        stats["predicted"] += len(good)
        pending.clear()

    try:
        with atomic_file(dst) as tmp, open(tmp, "w", encoding="utf-8") as out:
            for n, rec, err in read_rows(src):
                stats["lines"] += 1
                err = err or check_record(rec, predictor.type)
                if err:
                    stats["bad"] += 1
                    if strict:
                        raise BertpipeError(f"{src}:{n}: {err} (--strict stops at the first bad line)")
                    log(f"error: {src}:{n}: {err}; skipped")
                pending.append((n, rec, err))
                if len(pending) >= chunk:
                    flush(out)
            flush(out)
    finally:
        bar.close()
    return stats
