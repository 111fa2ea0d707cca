"""Which attention kernel keeps each token to its own document, and the one helper that hands an encoder what it needs.

A packed pretraining row holds several documents (``doc_ids`` numbers them 1, 2, ... per token, 0 on padding); a
padded finetune or inference batch holds one document per row and padding after it. Each token attends only to its
own document, through one of three kernels, chosen by ``attention: auto | mask | varlen | flex`` (``pretrain``,
``base`` and ``tapt``: ``<stage>.attention``; finetune: ``finetune.train.attention``; inference: ``auto``):

- ``mask``: the model's own attention (SDPA, or eager) with the padding mask, or for packed rows the 4D mask of
  ``document_mask`` (``(batch, 1, L, L)``: every transformers 5 encoder family builds its mask with
  ``create_bidirectional_mask``, which passes a 4D mask through untouched). On the CPU SDPA's kernel takes that mask
  at the cost of the padding mask (docs/speed.md). On CUDA, FlashAttention takes no arbitrary mask: a packed or
  padded batch falls back to the memory-efficient kernel reading an LxL mask per row.
- ``varlen``: each document, and each row's padding run on its own, is one sequence of a nested jagged tensor over
  the batch's tokens (``torch.nested``; its offsets, cu_seqlens, are computed on the host with the batch, so no step
  waits for the device). SDPA over it runs FlashAttention-2's variable-length kernel on CUDA in bf16/fp16 (the
  memory-efficient variable-length kernel in fp32), attention dropout included; on the CPU the math kernel, a loop
  over the sequences (slow: the reference the tests compare). No LxL mask is built. A batch with neither padding nor
  packed documents runs the plain SDPA path (FlashAttention without a mask already).
- ``flex``: FlexAttention with a document BlockMask; compiled on CUDA (a Triton kernel that skips the blocks no
  query of a document reads), eager on the CPU (a reference that computes the full score matrix, forward only).
  FlexAttention has no attention dropout and no backward on the CPU, so training with it there, or training a model
  that has attention dropout, is refused.

``auto``: ``mask`` everywhere. On the CPU SDPA with the mask costs what the padding mask costs and the others are
slower (varlen's math loop; flex eager or compiled per shape). On CUDA ``varlen`` is the candidate (FlashAttention's
own kernel with no mask and no compile, attention dropout kept: flex and ``torch.nn.attention.varlen.varlen_attn``
have none; the latter, CUDA-only, is what the check times at the kernel level beside these), but no GPU has run it
yet, with or without torch.compile: ``auto`` moves to it once the device check (``bench/gpu_check.sh``, which times
every kernel, compiled and eager) shows it ahead; until then ``attention: varlen`` opts in.

The kernel is a runtime setting of the model (``kernel``: transformers' ``set_attn_implementation`` with a function
registered in its ``AttentionInterface``), undone when the block ends; transformers never writes it to config.json,
so a saved model is a plain ``save_pretrained`` directory that loads with its default attention. Called without the
document inputs, the registered functions run transformers' own SDPA with the mask they are given.
"""

from __future__ import annotations

import contextlib
import functools
from typing import Iterator

import torch

from bertpipe.infra.errors import BertpipeError
# the names the kernels are registered under in transformers' AttentionInterface
IMPLEMENTATIONS = {"varlen": "bertpipe_varlen", "flex": "bertpipe_flex"}
# what the forward of a batch may carry besides the attention mask (``prepare`` adds them on the host)
DOC_KEYS = ("doc_ids", "doc_offsets")


def choose(setting: str, device: torch.device, key: str) -> tuple[str, str]:
    """(kernel, why) for ``setting`` on ``device``: ``auto`` is ``mask`` (the module's docstring says why). varlen
    and flex need the encoder to hand its forward's keyword arguments to the attention function, as every family of
    transformers 5 does: set explicitly under an older transformers, either is a BertpipeError naming ``key``."""
    old = _transformers_before_5()
    if setting != "auto":
        if setting != "mask" and old:
            raise BertpipeError(f"{key}: {setting} needs transformers >= 5 (its encoders pass the document inputs to "
                                f"the attention function), this is {old}; set {key}: mask or auto")
        return setting, f"attention: {setting}"
    if device.type != "cuda":
        return "mask", f"attention: auto, mask on {device.type}"
    return "mask", "attention: auto, mask on cuda (varlen is opt-in until bench/gpu_check.sh measures it on a GPU)"


def _transformers_before_5() -> str | None:
    """transformers' version when it is older than 5, else None."""
    import transformers

    return None if int(transformers.__version__.split(".")[0]) >= 5 else transformers.__version__


# ---------------------------------------------------------------- the mask (the ``mask`` kernel)


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
    any other implementation that takes one), additive in ``dtype`` for eager attention. A padding query attends to
    every real key of its row, as under a 2D padding mask, so no softmax row is all masked (which would make NaNs)."""
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


# ---------------------------------------------------------------- the batch: host side, then the forward's inputs


def segment_offsets(doc_ids: torch.Tensor) -> torch.Tensor:
    """The cu_seqlens (int32) of ``doc_ids`` (batch, L; a host tensor, so no device sync): the starts of the runs of
    one document id within each row, the rows laid end to end, and the total. Each document is a run, and so is a
    row's padding (id 0): padding attends to padding, never to a document, and no sequence is empty."""
    b, n = doc_ids.shape
    flat = doc_ids.reshape(-1)
    starts = torch.ones(b * n, dtype=torch.bool)
    starts[1:] = flat[1:] != flat[:-1]
    starts[::n] = True
    return torch.cat([starts.nonzero().flatten(), torch.tensor([b * n])]).to(torch.int32)


def prepare(batch: dict, kind: str) -> dict:
    """``batch`` (host tensors) with what ``kind`` reads besides the attention mask: ``doc_offsets`` (varlen) or
    ``doc_ids`` (flex), when a row packs documents (``doc_ids``) or the batch has padding; unchanged otherwise."""
    if kind == "mask":
        return batch
    docs = batch.get("doc_ids")
    if docs is None:
        mask = batch["attention_mask"]
        if bool(mask.all()):  # one document a row and no padding: SDPA without a mask is FlashAttention already
            return batch
        docs = mask
    if kind == "varlen":
        return {**batch, "doc_offsets": segment_offsets(docs)}
    return {**batch, "doc_ids": docs}


def kind_of(model) -> str:
    """The kernel ``model`` (a transformers model, or a module holding one as ``config``) runs: mask, varlen or flex."""
    impl = getattr(getattr(model, "config", None), "_attn_implementation", None)
    return next((k for k, name in IMPLEMENTATIONS.items() if name == impl), "mask")


def encoder_inputs(model, attention_mask: torch.Tensor, doc_ids: torch.Tensor | None = None,
                   doc_offsets: torch.Tensor | None = None) -> dict:
    """The attention inputs of a transformers encoder's forward for the kernel it runs: ``attention_mask`` (the 2D or
    the document 4D mask), or no mask and the document inputs of ``varlen`` (``doc_offsets``, ``doc_max_len``) or
    ``flex`` (``doc_block_mask``)."""
    kind = kind_of(model)
    if kind == "varlen" and doc_offsets is not None:
        return {"attention_mask": None, "doc_offsets": doc_offsets, "doc_max_len": attention_mask.shape[1]}
    if kind == "flex" and doc_ids is not None:
        return {"attention_mask": None, "doc_block_mask": document_block_mask(doc_ids)}
    return {"attention_mask": encoder_mask(model, attention_mask, doc_ids)}


def model_batch(model, batch: dict) -> dict:
    """``batch`` (on the device) as a transformers model's forward takes it: its attention mask and ``prepare``'s
    document inputs become ``encoder_inputs``; a batch without document inputs is passed as it is."""
    if not any(k in batch for k in DOC_KEYS):
        return batch
    rest = {k: v for k, v in batch.items() if k != "attention_mask" and k not in DOC_KEYS}
    return {**rest, **encoder_inputs(model, batch["attention_mask"], batch.get("doc_ids"), batch.get("doc_offsets"))}


# ---------------------------------------------------------------- the kernels, registered with transformers


def _sdpa(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """transformers' SDPA with the mask it is given (a forward without document inputs)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                  **kwargs)


def varlen_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, doc_offsets=None,
                     doc_max_len=None, **kwargs):
    """SDPA over nested jagged tensors whose sequences are the ``doc_offsets`` runs of the batch's tokens.
    ``query``/``key``/``value``: (batch, heads, L, head_dim); returns (batch, L, heads, head_dim), as transformers'
    attention functions do. ``doc_max_len`` (the row length) bounds the longest run, so nothing reads the offsets."""
    if doc_offsets is None:
        return _sdpa(module, query, key, value, attention_mask, dropout, scaling, **kwargs)
    b, h, n, d = query.shape

    def jagged(x: torch.Tensor) -> torch.Tensor:
        tokens = x.transpose(1, 2).reshape(b * n, h, d)
        nt = torch.nested.nested_tensor_from_jagged(tokens, doc_offsets, min_seqlen=1, max_seqlen=doc_max_len)
        return nt.transpose(1, 2)

    out = torch.nn.functional.scaled_dot_product_attention(jagged(query), jagged(key), jagged(value),
                                                           dropout_p=dropout, scale=scaling)
    return out.transpose(1, 2).values().view(b, n, h, d), None


@functools.cache
def _flex_kernel(device_type: str):
    """flex_attention, compiled on CUDA (its fused kernel exists only compiled), eager elsewhere (the reference)."""
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention) if device_type == "cuda" else flex_attention


def document_block_mask(doc_ids: torch.Tensor):
    """FlexAttention's BlockMask keeping each token to the tokens of its row with its document id."""
    from torch.nn.attention.flex_attention import create_block_mask

    def same_document(b, h, q, k):
        return doc_ids[b, q] == doc_ids[b, k]

    batch, n = doc_ids.shape
    return create_block_mask(same_document, batch, None, n, n, device=doc_ids.device)


def flex_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, doc_block_mask=None,
                   **kwargs):
    """FlexAttention under ``doc_block_mask``; (batch, L, heads, head_dim) as transformers' attention functions."""
    if doc_block_mask is None:
        return _sdpa(module, query, key, value, attention_mask, dropout, scaling, **kwargs)
    out = _flex_kernel(query.device.type)(query, key, value, block_mask=doc_block_mask, scale=scaling)
    return out.transpose(1, 2).contiguous(), None


@functools.cache
def _registered() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    for kind, fn in (("varlen", varlen_attention), ("flex", flex_attention)):
        AttentionInterface.register(IMPLEMENTATIONS[kind], fn)
        # a forward without document inputs builds the mask SDPA takes (2D padding -> 4D boolean, or none)
        AttentionMaskInterface.register(IMPLEMENTATIONS[kind], sdpa_mask)


def attention_dropout(config) -> float:
    """The attention-probability dropout of an encoder's config (BERT-likes and ALBERT, DistilBERT)."""
    return float(getattr(config, "attention_probs_dropout_prob", None) or getattr(config, "attention_dropout", 0.0)
                 or 0.0)


def _trainable_with_flex(models: list, key: str) -> None:
    """FlexAttention trains only on CUDA (no backward on the CPU) and without attention dropout (it has none)."""
    device = next((p.device for m in models for p in m.parameters()), None)
    if device is not None and device.type != "cuda":
        raise BertpipeError(f"{key}: flex trains only on CUDA (FlexAttention has no backward on {device.type}); set "
                            f"{key}: auto, mask or varlen")
    p = max((attention_dropout(m.config) for m in models), default=0.0)
    if p > 0:
        raise BertpipeError(f"{key}: flex has no attention dropout, and the model trains with {p:g}; set {key}: "
                            "varlen or mask")


@contextlib.contextmanager
def kernel(module: torch.nn.Module, kind: str, key: str, training: bool = False) -> Iterator[str]:
    """Run the transformers models in ``module`` (itself included) with the ``kind`` kernel inside the block, their
    own attention again after it. ``flex`` when ``training`` off CUDA or a model with attention dropout is a
    BertpipeError naming ``key``."""
    if kind == "mask":
        yield kind
        return
    from transformers import PreTrainedModel

    models = [m for m in module.modules() if isinstance(m, PreTrainedModel)]
    if kind == "flex" and training:
        _trainable_with_flex(models, key)
    _registered()
    before = {id(m.config): (m, m.config._attn_implementation) for m in models}
    try:
        for m, _ in before.values():
            m.set_attn_implementation(IMPLEMENTATIONS[kind])
        yield kind
    finally:
        for m, impl in before.values():
            m.set_attn_implementation(impl)
