"""How an encoder runs, below the stages: torch.compile (attention kernels: ``bertpipe.infra.attention``).

Compilation: ``compile: auto | on | off``. Inductor needs a C++ compiler on the CPU and Triton on CUDA; ``on``
without one is an error naming the key, ``auto`` compiles only a run long enough to repay the compile time
(``AUTO_MIN_STEPS``, measured with bench/bench_pretrain.py --variants compiled and bench/bench_finetune.py --compile;
docs/speed.md). Pretraining and finetuning both decide with ``should_compile``.
"""

from __future__ import annotations

import os
import shutil

import torch

from bertpipe.infra.errors import BertpipeError
from bertpipe.infra.switches import CompileSetting

# Steps from which `compile: auto` compiles. Measured on the 2-core AVX512-BF16 CPU (bench_pretrain.py, 2L/256H,
# seq 128, batch 16, bf16, load ~12): compiling took ~190 s and made a step ~1.6x faster (2.8 s saved of 7.3), so
# it repays itself after ~70 steps; each new shape (length buckets, evaluation) compiles again, so the threshold
# keeps a margin of several times that. The demo stages (tens to a few hundred steps) stay eager. docs/speed.md.
AUTO_MIN_STEPS = 500

# The same for a finetune (bench_finetune.py --compile, 1 layer, hidden 256, batch 16, bf16, length buckets, load
# ~5.7): ~155 s compiling and a step 1.5x faster (0.12 s saved of 0.37): even after ~1,250 steps. A finetune
# compiles once per trial and seed, a deeper encoder compiles longer (2 layers: ~300 s for the first graph), and
# early stopping and a search's pruning end runs before their planned steps, so the threshold keeps a margin; the
# demo's finetunes (~560-1,130 planned steps) stay eager.
FINETUNE_AUTO_MIN_STEPS = 2000


# ---------------------------------------------------------------- torch.compile


def cxx_compiler() -> str | None:
    """The C++ compiler Inductor would use on the CPU ($CXX, else g++/c++/clang++ on PATH), or None."""
    cxx = os.environ.get("CXX")
    if cxx:
        return shutil.which(cxx)
    return next((p for p in map(shutil.which, ("g++", "c++", "clang++")) if p), None)


def compiler_missing(device: torch.device) -> str | None:
    """Why torch.compile cannot build kernels for ``device``, or None when it can."""
    if device.type == "cuda":
        try:
            from torch.utils._triton import has_triton
        except ImportError:  # pragma: no cover - every torch 2.x has it
            return "Triton is not importable"
        return None if has_triton() else "Triton is not installed (Inductor's CUDA kernels need it)"
    if device.type == "cpu":
        if cxx_compiler() is None:
            where = f"CXX={os.environ['CXX']!r} is not an executable" if os.environ.get("CXX") else \
                "no g++, c++ or clang++ on PATH"
            return f"Inductor's CPU kernels need a C++ compiler ({where})"
        return None
    return f"torch.compile is not supported here on device {device.type!r}"


def should_compile(setting: CompileSetting, steps: int, device: torch.device, key: str,
                   min_steps: int = AUTO_MIN_STEPS) -> tuple[bool, str]:
    """(compile?, why) for ``setting`` and a run of ``steps`` optimizer steps (``auto`` compiles from ``min_steps``);
    ``on`` without a working compiler is a BertpipeError naming ``key``."""
    if setting == "off":
        return False, "compile: off"
    missing = compiler_missing(device)
    if setting == "on":
        if missing:
            raise BertpipeError(f"{key}: on, but torch.compile cannot run: {missing}; set {key}: off or auto")
        return True, "compile: on"
    if missing:
        return False, f"compile: auto, not compiled ({missing})"
    if steps < min_steps:
        return False, f"compile: auto, not compiled ({steps} steps < {min_steps} that repay the compile time)"
    return True, f"compile: auto, compiled ({steps} steps >= {min_steps})"


# How compiled graphs treat shapes. In place (pretraining, packed rows of one length): torch's automatic dynamic
# shapes (None), a static graph, and one more with the changed dimensions symbolic should another shape come.
DYNAMIC: bool | None = None
# The compiled view (finetuning, length-bucketed batches: every batch another length): symbolic from the start, one
# graph for every length, never a recompile per length nor the fall-back to eager at the recompile limit.
# bench/bench_finetune.py --compile (1 layer, hidden 256, 114 lengths): True compiled one graph in ~155 s (load
# ~5.7), None a static one then a symbolic one, ~245 s (load ~6-9); docs/speed.md.
BUCKETED_DYNAMIC: bool | None = True


def compile_in_place(module: torch.nn.Module) -> None:
    """Compile ``module``'s forward in place (``nn.Module.compile``): its state_dict keys stay the same, so
    checkpoints and the saved model are those of the eager module, and everything that calls it runs compiled."""
    module.compile(dynamic=DYNAMIC)


def compiled(module: torch.nn.Module) -> torch.nn.Module:
    """A compiled view of ``module`` sharing its parameters (``torch.compile``), for a loop that trains through the
    view but evaluates, saves and hands back the eager ``module`` (an evaluation graph would compile again for
    every inference shape, and the caller's later scoring should not pay for it)."""
    return torch.compile(module, dynamic=BUCKETED_DYNAMIC)


def compile_seconds(step_times: list[float]) -> float | None:
    """What compiling cost, from a run's first step times: the time of the steps slower than twice the median over
    the median (Inductor compiles lazily, at the first call and at the first new shapes). None under 3 steps."""
    if len(step_times) < 3:
        return None
    median = sorted(step_times)[len(step_times) // 2]
    return sum(t - median for t in step_times if t > 2 * median)
