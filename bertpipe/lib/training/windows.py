"""Long inputs: truncation strategies (head, tail, head+tail), sliding windows, and putting window outputs back together
(mean of logits or a vote for classification, max-context stitching for token labels).

Everything works on the word pieces of the whole text (no special tokens); special tokens are added per window.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np


@dataclass
class Pieces:
    """One text as word pieces: ids, character offsets into the text, and the tokenizer's word index per piece."""

    ids: list[int]
    offsets: list[tuple[int, int]]
    word_ids: list[int | None]


def encode_pieces(tokenizer, texts: Sequence[str], batch: int = 1000) -> list[Pieces]:
    out: list[Pieces] = []
    for i in range(0, len(texts), batch):
        enc = tokenizer(
            list(texts[i : i + batch]), add_special_tokens=False, return_offsets_mapping=True, verbose=False
        )
        for j in range(len(enc["input_ids"])):
            out.append(Pieces(enc["input_ids"][j], [tuple(o) for o in enc["offset_mapping"][j]], enc.word_ids(j)))
    return out


def truncate(n: int, budget: int, strategy: str, head_tokens: int = 128) -> list[int]:
    """Indices of the pieces kept when ``n`` pieces must fit ``budget``: head, tail or head_tail."""
    if n <= budget:
        return list(range(n))
    if strategy == "tail":
        return list(range(n - budget, n))
    if strategy == "head_tail":
        h = min(head_tokens, budget)
        return list(range(h)) + list(range(n - (budget - h), n))
    return list(range(budget))


def windows(n: int, size: int, stride: int) -> list[tuple[int, int]]:
    """``[start, end)`` windows of at most ``size`` pieces, starting every ``stride``, that together cover 0..n."""
    if size < 1:
        raise ValueError("window size must be positive")
    stride = max(1, min(stride, size))  # a stride beyond the size would skip pieces
    out, start = [], 0
    while True:
        end = min(start + size, n)
        out.append((start, end))
        if end >= n:
            return out
        start += stride


def with_specials(tokenizer, ids: list[int]) -> list[int]:
    """[CLS] ids [SEP] (or <s> ids </s>): what the tokenizer adds around a single sequence."""
    first = tokenizer.cls_token_id if tokenizer.cls_token_id is not None else tokenizer.bos_token_id
    last = tokenizer.sep_token_id if tokenizer.sep_token_id is not None else tokenizer.eos_token_id
    return ([first] if first is not None else []) + list(ids) + ([last] if last is not None else [])


def n_specials(tokenizer) -> int:
    return len(with_specials(tokenizer, []))


def aggregate(logits: np.ndarray, how: str = "mean") -> np.ndarray:
    """One row of class scores from the rows of a document's windows: the mean of logits, or a vote.

    The vote returns vote counts with the mean logits as a tie-break (scaled below one vote).
    """
    if logits.shape[0] == 1:
        return logits[0]
    mean = logits.mean(axis=0)
    if how == "vote":
        votes = np.bincount(logits.argmax(axis=1), minlength=logits.shape[1]).astype(np.float64)
        span = float(mean.max() - mean.min()) or 1.0
        return votes + 0.5 * (mean - mean.min()) / span
    return mean


def stitch(n: int, spans: Sequence[tuple[int, int]], window_rows: Sequence[np.ndarray]) -> np.ndarray:
    """Per-piece rows for a document of ``n`` pieces from overlapping windows.

    Each piece takes its row from the window where it has the most context on its shorter side, so pieces near a
    window's edge are predicted by the neighbouring window that sees both sides of them.
    """
    width = window_rows[0].shape[-1]
    out = np.zeros((n, width), dtype=np.float32)
    best = np.full(n, -1, dtype=np.int64)
    for (start, end), rows in zip(spans, window_rows):
        pos = np.arange(start, end)
        ctx = np.minimum(pos - start, end - 1 - pos)
        take = ctx > best[start:end]
        out[start:end][take] = rows[: end - start][take]
        best[start:end][take] = ctx[take]
    if (best < 0).any():
        raise ValueError(f"windows leave pieces uncovered: {np.flatnonzero(best < 0)[:5].tolist()}")
    return out
