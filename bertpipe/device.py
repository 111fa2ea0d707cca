"""Device, precision and optimizer-group rules shared by every training stage (pretrain, base, finetune, distill,
evaluate's and register's scoring), so they cannot drift apart."""

from __future__ import annotations

import torch


def pick_device(name: str) -> torch.device:
    """``auto``: CUDA when there is one, else the CPU; anything else is a torch device name."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def bf16_ok(device: torch.device) -> bool:
    """Whether bf16 autocast is fast and exact enough here: CUDA's own check; on the CPU, oneDNN's bf16 support
    (what torch's CPU autocast uses), else the AVX512-BF16 / AMX instructions."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    try:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except Exception:  # noqa: BLE001 (an old or unusual build: ask the CPU directly)
        pass
    try:
        return bool(torch.cpu._is_avx512_bf16_supported()) or bool(torch.cpu._is_amx_tile_supported())
    except AttributeError:
        return False


def no_weight_decay(name: str, param: torch.Tensor) -> bool:
    """Biases, norms (LayerNorm and friends) and other vectors are not decayed; matrices and embeddings are."""
    return param.ndim < 2 or "norm" in name.lower()


def weight_decay_groups(model: torch.nn.Module, weight_decay: float, lr_of=None) -> list[dict]:
    """AdamW parameter groups by (lr, weight decay): ``lr_of(name)`` gives a parameter's learning rate (None: the
    optimizer's); frozen parameters are left out."""
    groups: dict[tuple, list] = {}
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        wd = 0.0 if no_weight_decay(name, p) else weight_decay
        groups.setdefault((lr_of(name) if lr_of else None, wd), []).append(p)
    return [{"params": ps, "weight_decay": wd, **({"lr": lr} if lr is not None else {})}
            for (lr, wd), ps in groups.items()]
