"""Sentence segmentation (Chinese first), for stages that build pretraining segments out of prepared documents."""

from __future__ import annotations

import re

# A sentence ends after a run of terminators (。！？；… and their half-width forms after NFKC), or after a period
# followed by whitespace (English), plus any closing quotes or brackets right after them; a newline always ends one.
_END = re.compile(r"(?:[。！？；!?;…]+|\.(?=\s|$))[”’\"'」』）)》】〕]*")


def split_sentences(text: str) -> list[str]:
    """``'他说：“好！”然后走了。'`` -> ``['他说：“好！”', '然后走了。']``; blank pieces are dropped."""
    out: list[str] = []
    for line in text.split("\n"):
        start = 0
        for m in _END.finditer(line):
            piece = line[start : m.end()].strip()
            if piece:
                out.append(piece)
            start = m.end()
        piece = line[start:].strip()
        if piece:
            out.append(piece)
    return out
