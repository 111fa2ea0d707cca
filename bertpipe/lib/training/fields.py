"""Fields of a task record read as what they must be: text (a string or a number, never a list's repr), a class label
(one spelling per number, never empty), and NER spans that do not overlap. Every error names the record's
``file:line``."""

from __future__ import annotations

import math
from typing import Any

from bertpipe.infra.errors import BertpipeError


def get(rec: dict, key: str, where: str, required: bool = True) -> Any:
    """Field ``key`` of a record; a missing (or null) one is an error when ``required``, else None."""
    if key not in rec or rec[key] is None:
        if required:
            raise BertpipeError(f"{where}: missing field {key!r} (have {sorted(rec)})")
        return None
    return rec[key]


def scalar_text(value: Any, where: str, what: str) -> str:
    """A string or a number as text; anything else (a list, a mapping, bytes) is an error: its Python repr would
    become the text or the class name."""
    if isinstance(value, (str, int, float)):
        return str(value)
    kind = {list: "a list", dict: "a mapping", bytes: "bytes"}.get(type(value), f"a {type(value).__name__}")
    raise BertpipeError(f"{where}: {what} holds {kind}; expected a string")


def text(rec: dict, key: str, where: str, required: bool = True) -> str | None:
    """Field ``key`` as text (see ``scalar_text``); None when it is missing and not ``required``."""
    v = get(rec, key, where, required)
    return None if v is None else scalar_text(v, where, f"field {key!r}")


def label(rec: dict, key: str, where: str) -> str:
    """Field ``key`` as a class name. A number (JSON, SQLite) is one class whatever its type: an integral one is
    spelled without a fraction (1 and 1.0 are "1"), any other as its shortest decimal (0.50 is "0.5"); a boolean as
    JSON spells it (true and "true" are "true"). An empty or blank label is an error: it would become a class."""
    v = get(rec, key, where)
    if isinstance(v, bool):
        v = "true" if v else "false"
    elif isinstance(v, float):
        if not math.isfinite(v):
            raise BertpipeError(f"{where}: field {key!r} is {v}; expected a label")
        v = int(v) if v.is_integer() else v
    out = scalar_text(v, where, f"field {key!r}")
    if not out.strip():
        raise BertpipeError(f"{where}: field {key!r} is empty; every example needs a label (label the row or remove it)")
    return out


def disjoint(spans: list[tuple[int, int, str]], where: str) -> list[tuple[int, int, str]]:
    """``spans`` sorted, a repeated span once; two spans sharing a character are an error naming both (each
    character gets one tag, so the later span would overwrite the earlier one's)."""
    out: list[tuple[int, int, str]] = []
    for span in sorted(set(spans)):
        last = out[-1] if out else None  # the spans so far are disjoint and sorted: the last reaches furthest
        if last is not None and span[0] < last[1]:
            raise BertpipeError(f"{where}: spans [{last[0]}, {last[1]}, {last[2]}] and [{span[0]}, {span[1]}, "
                                f"{span[2]}] overlap; a character takes one entity tag, so keep one of them")
        out.append(span)
    return out
