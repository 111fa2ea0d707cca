"""How an encoder runs, below the stages: document-confined attention masks for packed rows, and torch.compile.

Document-confined attention: a packed row holds several documents (``doc_ids`` numbers them 1, 2, ... per token,
0 on padding). Every transformers 5 encoder family builds its attention mask with ``create_bidirectional_mask``, which
passes a 4D mask ``(batch, 1, query, key)`` through untouched; so confining attention is one tensor handed to the
unmodified model, whatever its family, and the saved model stays a plain ``save_pretrained`` directory. For SDPA the
mask is boolean (True: attend), for eager attention additive (0 or the dtype's minimum). A padding query attends to
every real key of its row, as under a 2D padding mask, so no softmax row is all masked (which would make NaNs).

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


# ---------------------------------------------------------------- document-confined attention


def document_ids(words, ids_len: int, n_first: int):
    """Per-token document number of one packed example (1, 2, ...): a single segment (``n_first == ids_len``) is
    cut after each interior separator (the tokens with word index -1 between [CLS] and the final [SEP]); a pair
    example (A [SEP] B) is one document. ``words`` is the example's word-index array (numpy)."""
    import numpy as np

    out = np.ones(ids_len, np.int64)
    if n_first == ids_len and ids_len > 2:
        inner = np.asarray(words[1 : ids_len - 1]) < 0  # the separators that end a document
        # a separator belongs to the document it closes: the next document starts one token after it
        out[2:ids_len] += np.cumsum(inner)
    return out


def document_mask(doc_ids: torch.Tensor, attn_implementation: str | None, dtype: torch.dtype = torch.float32):
    """The 4D attention mask confining each token to its own document: ``(batch, 1, L, L)``, boolean for SDPA (and
    any other implementation that takes one), additive in ``dtype`` for eager attention."""
    q, k = doc_ids[:, :, None], doc_ids[:, None, :]
    allowed = ((q == k) & (k > 0)) | ((q == 0) & (k > 0))  # a padding query reads its row's real tokens
    allowed = allowed[:, None]
    if attn_implementation == "eager":
        zero = torch.zeros((), dtype=dtype, device=doc_ids.device)
        return torch.where(allowed, zero, torch.finfo(dtype).min)
    return allowed


def encoder_mask(model, attention_mask: torch.Tensor, doc_ids: torch.Tensor | None):
    """What to pass as ``attention_mask`` to ``model`` (any transformers encoder): the 2D padding mask when every row
    is one document (``doc_ids`` None), else the document-confined 4D mask for the model's attention kernel."""
    if doc_ids is None:
        return attention_mask
    impl = getattr(model.config, "_attn_implementation", None)
    return document_mask(doc_ids, impl, next(model.parameters()).dtype)


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
