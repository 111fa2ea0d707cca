"""Fields of a task record read as what they must be: text (a string or a number, never a list's repr), and NER
spans that do not overlap. Every error names the record's ``file:line``."""

from __future__ import annotations

from typing import Any

from bertpipe.errors import BertpipeError


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
