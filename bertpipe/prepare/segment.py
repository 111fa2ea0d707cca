"""Chinese sentence segmentation, for stages that build pretraining segments out of prepared documents."""

from __future__ import annotations

import re

# A sentence runs up to its terminators (。！？；… and their half-width forms after NFKC) plus any closing quotes or
# brackets right after them, or up to a newline.
_SENTENCE = re.compile(r"[^。！？；!?;…\n]+(?:[。！？；!?;…]+[”’\"'」』）)》】〕]*)?|[。！？；!?;…]+[”’\"'」』）)》】〕]*")


def split_sentences(text: str) -> list[str]:
    """``'他说：“好！”然后走了。'`` -> ``['他说：“好！”', '然后走了。']``; blank pieces are dropped."""
    out: list[str] = []
    for line in text.split("\n"):
        out.extend(s for s in (m.group(0).strip() for m in _SENTENCE.finditer(line)) if s)
    return out
