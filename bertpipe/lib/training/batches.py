"""Batches of features: training batches of similar length in a shuffled order, inference batches cut by padded
tokens, and the collator that pads a batch into the tensors a model's forward takes."""

from __future__ import annotations

import random
from typing import Sequence

import numpy as np
import torch


def _padded(rows: Sequence[Sequence[int]], n: int, fill: int) -> torch.Tensor:
    """Rows of ints padded to ``n`` with ``fill``: one numpy array filled row by row, one tensor at the end (a
    torch.tensor per row was most of collate's time on short rows)."""
    arr = np.full((len(rows), n), fill, dtype=np.int64)
    for i, r in enumerate(rows):
        arr[i, : len(r)] = r
    return torch.from_numpy(arr)


def collate(feats: Sequence[dict], pad_id: int) -> dict[str, torch.Tensor]:
    """Pad a batch of features; only keys a model's forward takes become tensors."""
    n = max(len(f["input_ids"]) for f in feats)
    out: dict[str, torch.Tensor] = {}
    out["input_ids"] = _padded([f["input_ids"] for f in feats], n, pad_id)
    lens = torch.tensor([len(f["input_ids"]) for f in feats])
    out["attention_mask"] = (torch.arange(n)[None, :] < lens[:, None]).long()
    if "token_type_ids" in feats[0]:
        out["token_type_ids"] = _padded([f["token_type_ids"] for f in feats], n, 0)
    if "labels" in feats[0]:
        if isinstance(feats[0]["labels"], list):
            out["labels"] = _padded([f["labels"] for f in feats], n, -100)
        else:
            out["labels"] = torch.tensor([f["labels"] for f in feats], dtype=torch.long)
    for k in ("start_positions", "end_positions"):
        if k in feats[0]:
            out[k] = torch.tensor([f[k] for f in feats], dtype=torch.long)
    return out


def batches(feats: Sequence[dict], batch_size: int, gen: random.Random, bucket: int = 50) -> list[list[int]]:
    """Shuffled batches of similar length (sorted within shuffled chunks), so little compute goes to padding."""
    order = list(range(len(feats)))
    gen.shuffle(order)
    out = []
    for c in range(0, len(order), batch_size * bucket):
        chunk = sorted(order[c : c + batch_size * bucket], key=lambda i: len(feats[i]["input_ids"]))
        out.extend(chunk[i : i + batch_size] for i in range(0, len(chunk), batch_size))
    gen.shuffle(out)
    return out


# Tokens per inference batch: rows sorted by length are grouped up to this many (padded) tokens, and never fewer
# rows than the caller's batch size, so short texts run in large batches while long ones stay within memory. On an
# accelerator large batches keep the device busy; on the CPU a batch beyond a few thousand tokens runs slower per
# token (its activations outgrow the caches: a 2-layer encoder scored the same dev split in 1.4x the time with
# 32,768 tokens a batch as with 8,192; docs/speed.md). Rows do not interact (each attends to its own tokens), so the
# grouping changes no result.
INFERENCE_TOKENS = 32768
CPU_INFERENCE_TOKENS = 8192


def inference_tokens(device: torch.device) -> int:
    """The padded tokens an inference batch on ``device`` grows to."""
    return CPU_INFERENCE_TOKENS if device.type == "cpu" else INFERENCE_TOKENS


def inference_batches(order: Sequence[int], lengths: Sequence[int], batch_size: int, max_tokens: int
                      ) -> list[list[int]]:
    """``order`` (indices sorted by length) cut into batches of at least ``batch_size`` rows, more while the batch
    stays within ``max_tokens`` padded tokens (``inference_tokens``: the budget of the device it runs on)."""
    out, cur = [], []
    for i in order:
        if cur and len(cur) >= batch_size and (len(cur) + 1) * max(lengths[i], 1) > max_tokens:
            out.append(cur)
            cur = []
        cur.append(i)
    if cur:
        out.append(cur)
    return out
