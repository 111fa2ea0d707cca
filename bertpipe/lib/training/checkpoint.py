"""Checkpoints a killed run resumes from: written atomically, loaded as data only (``weights_only``)."""

from __future__ import annotations

from pathlib import Path

import torch

from bertpipe.infra.errors import BertpipeError


def plain(obj):
    """``obj`` as tensors and plain Python values only (numpy scalars become numbers), so it loads with
    ``weights_only=True``: a checkpoint is data, never code to unpickle."""
    if isinstance(obj, torch.Tensor) or obj is None or isinstance(obj, (str, int, float, bool)):
        return obj
    if isinstance(obj, dict):
        return {k: plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(plain(v) for v in obj)
    if hasattr(obj, "item"):
        return obj.item()
    raise TypeError(f"checkpoint value of type {type(obj).__name__} is not a tensor or plain value")


def atomic_save(obj, path: Path) -> None:
    """Write then rename: a reader (or a resumed run after SIGKILL) sees the old file or the new one, never half."""
    from bertpipe.core.outputs import atomic_file

    with atomic_file(path) as tmp:
        torch.save(plain(obj), tmp)


def safe_load(path: Path) -> dict:
    """Load a checkpoint with ``weights_only=True``; anything else in it (a crafted pickle) is refused."""
    import pickle

    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, ValueError) as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0][:200]
        raise BertpipeError(f"{path}: not a checkpoint of tensors and plain values, refusing to load it ({first}); "
                            f"delete it to start this stage over") from None


def load_checkpoint(scratch: Path) -> dict | None:
    p = scratch / "last.pt"
    return safe_load(p) if p.is_file() else None
