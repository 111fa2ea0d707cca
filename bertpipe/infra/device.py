"""Device, precision and optimizer-group rules shared by every training stage (pretrain, base, finetune, distill,
evaluate's and register's scoring), so they cannot drift apart.

The precision policy: native bf16 where the device has bf16 units (CUDA compute capability >= 8.0; a CPU
with AVX512-BF16 or AMX), fp16 autocast + GradScaler on older GPUs (bf16 there is emulated:
``torch.cuda.is_bf16_supported()`` says yes on a T4 or V100, so it is not asked), fp32 elsewhere; TF32 matmuls on
Ampere and later. ``choose_precision`` is a pure function of (request, capabilities) so the table is testable
without the hardware; ``device_caps`` is the only place that looks at the machine.
"""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass
from pathlib import Path

import torch

PRECISIONS = ("auto", "bf16", "fp16", "fp32")


def pick_device(name: str) -> torch.device:
    """``auto``: CUDA when there is one, else the CPU; anything else is a torch device name."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


# ---------------------------------------------------------------- capabilities (the only look at the machine)


@dataclass(frozen=True)
class Caps:
    """What the precision choice depends on."""

    kind: str  # cuda | cpu | mps | ...
    cuda_capability: tuple[int, int] | None = None  # (major, minor) on CUDA
    cpu_bf16: bool = False  # AVX512-BF16 or AMX-BF16 instructions (CPU)
    name: str = ""  # for the reason: "NVIDIA A100", "AMD EPYC", ...


def cpu_bf16_flags(flags: set[str]) -> bool:
    """Whether a CPU with these /proc/cpuinfo flags has bf16 arithmetic units: AVX512-BF16 or AMX-BF16. Plain
    AVX512 is not enough (oneDNN then emulates bf16 through fp32, no faster than fp32)."""
    return bool({"avx512_bf16", "amx_bf16"} & flags)


def _cpuinfo() -> tuple[set[str], str]:
    """(flags, model name) of the first CPU in /proc/cpuinfo; empty where there is none (macOS, Windows)."""
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return set(), ""
    flags = re.search(r"^flags\s*:\s*(.*)$", text, re.M)
    name = re.search(r"^model name\s*:\s*(.*)$", text, re.M)
    return (set(flags.group(1).split()) if flags else set()), (name.group(1).strip() if name else "")


def device_caps(device: torch.device) -> Caps:
    if device.type == "cuda":
        idx = device.index if device.index is not None else torch.cuda.current_device()
        return Caps("cuda", tuple(torch.cuda.get_device_capability(idx)), name=torch.cuda.get_device_name(idx))
    if device.type == "cpu":
        flags, name = _cpuinfo()
        if flags:
            has = cpu_bf16_flags(flags)
        else:  # no /proc/cpuinfo: ask torch's own CPU probe (cpuinfo library), never assume
            try:
                has = bool(torch.cpu._is_avx512_bf16_supported()) or bool(torch.cpu._is_amx_tile_supported())
            except AttributeError:
                has = False
        return Caps("cpu", cpu_bf16=has, name=name)
    return Caps(device.type)


# ---------------------------------------------------------------- the policy (pure)


@dataclass(frozen=True)
class Precision:
    """What a training stage runs in, and why (recorded in its manifest and shown in its progress line)."""

    dtype: str  # bf16 | fp16 | fp32
    reason: str
    tf32: bool = False  # TF32 matmuls (fp32 matmuls on Ampere+ tensor cores)

    @property
    def autocast(self) -> torch.dtype | None:
        return {"bf16": torch.bfloat16, "fp16": torch.float16}.get(self.dtype)

    @property
    def bf16(self) -> bool:
        return self.dtype == "bf16"

    @property
    def scaled(self) -> bool:
        """fp16 needs loss scaling (GradScaler): small gradients underflow fp16's range."""
        return self.dtype == "fp16"

    def words(self) -> str:
        return f"{self.dtype}{' + TF32' if self.tf32 else ''} ({self.reason})"

    def record(self) -> dict[str, str]:
        """The manifest's entries (``ctx.counts.update(p.record())``)."""
        return {"precision": self.dtype + ("+tf32" if self.tf32 else ""), "precision_reason": self.reason}


def choose_precision(requested: str, caps: Caps) -> Precision:
    """The precision for ``requested`` (auto | bf16 | fp16 | fp32) on a device with ``caps``.

    An explicit request is honoured (the user may know better, e.g. to compare), but the reason says when it is
    emulated or unscaled-slow on this device."""
    if requested not in PRECISIONS:
        raise ValueError(f"precision {requested!r}: expected one of {', '.join(PRECISIONS)}")
    cc = caps.cuda_capability
    where = caps.name or caps.kind
    if caps.kind == "cuda":
        ampere = cc is not None and cc >= (8, 0)
        ccs = f"compute capability {cc[0]}.{cc[1]}" if cc else "unknown compute capability"
        native = f"{where}, {ccs}"
        if requested == "auto":
            if ampere:
                return Precision("bf16", f"auto: native bf16 on {native}", tf32=True)
            return Precision("fp16", f"auto: {native} has no native bf16 (< 8.0): fp16 autocast + GradScaler")
        if requested == "bf16":
            return Precision("bf16", f"requested; {native}" + ("" if ampere else ": bf16 is emulated here, slow"),
                             tf32=ampere)
        if requested == "fp16":
            return Precision("fp16", f"requested; fp16 autocast + GradScaler on {native}", tf32=ampere)
        return Precision("fp32", f"requested on {native}", tf32=ampere)
    if caps.kind == "cpu":
        units = "AVX512-BF16/AMX" if caps.cpu_bf16 else "no AVX512-BF16/AMX"
        if requested == "auto":
            if caps.cpu_bf16:
                return Precision("bf16", f"auto: CPU {where} has bf16 units ({units})")
            return Precision("fp32", f"auto: CPU {where} has {units}: bf16 would be emulated")
        if requested == "bf16":
            return Precision("bf16", f"requested; CPU {where}" + ("" if caps.cpu_bf16 else f" has {units}: emulated, slow"))
        if requested == "fp16":
            return Precision("fp16", f"requested; fp16 autocast + GradScaler on CPU {where} (no fp16 units: slow)")
        return Precision("fp32", f"requested on CPU {where}")
    if requested == "auto":
        return Precision("fp32", f"auto: no precision rule for {caps.kind} devices, fp32")
    return Precision(requested, f"requested on {caps.kind}")


def precision_for(requested: str, device: torch.device) -> Precision:
    """The policy applied to this device; turns TF32 on where it is chosen (a process-wide switch)."""
    p = choose_precision(requested, device_caps(device))
    if p.tf32:
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    return p


def autocast(device: torch.device, p: Precision):
    """The autocast context of a forward pass under ``p`` (a no-op in fp32)."""
    if p.autocast is None:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=p.autocast)


def grad_scaler(device: torch.device, p: Precision) -> torch.amp.GradScaler:
    """A GradScaler that is active only for fp16 (disabled, it passes losses and steps through unchanged)."""
    return torch.amp.GradScaler(device.type, enabled=p.scaled)


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


def adamw(groups: list[dict], **kw) -> torch.optim.AdamW:
    """AdamW over ``groups``, fused (one kernel over every parameter) where torch has the kernel (CPU and CUDA,
    floating-point parameters), as HF's Trainer uses by default. The per-parameter loop costs a large share of a
    small model's step on the CPU (torch.profiler, docs/speed.md: 30 ms of a 210 ms finetune step of a 2-layer
    encoder with a 21k vocabulary, 6 ms fused)."""
    params = [q for g in groups for q in g["params"]]
    fused = bool(params) and all(q.device.type in ("cpu", "cuda") and q.is_floating_point() for q in params)
    return torch.optim.AdamW(groups, fused=fused or None, **kw)
