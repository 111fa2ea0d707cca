"""Per-family facts about BERT-style encoders, so no stage has to assume a WordPiece BERT.

Families handled (any checkpoint AutoModelForMaskedLM loads with one of these layouts): BERT and its Chinese
variants (RoBERTa-wwm, MacBERT: BERT format), RoBERTa / CamemBERT / XLM-R (``lm_head``), ALBERT (``predictions``,
factorised embeddings), DistilBERT (no token types; four head modules), ELECTRA (the discriminator as the encoder;
``AutoModelForMaskedLM`` gives it a generator-style head on top). Everything here reads the model or tokenizer it
is given; nothing names a checkpoint.
"""

from __future__ import annotations

from typing import Callable

from torch import nn

WORDPIECE, BPE, SENTENCEPIECE = "wordpiece", "bpe", "sentencepiece"

# model types whose AutoModelForMaskedLM is an encoder plus an MLM head over its hidden states
ENCODER_TYPES = frozenset({"bert", "roberta", "xlm-roberta", "camembert", "electra", "ernie", "nezha", "megatron-bert",
                           "distilbert", "albert"})


def tokenizer_kind(tok) -> str:
    """"wordpiece" (``##`` continuations), "bpe" (byte-level BPE, ``Ġ`` for a space, RoBERTa/GPT-2) or
    "sentencepiece" (``▁`` for a space: Unigram, or BPE behind a Metaspace pre-tokenizer; XLM-R, ALBERT)."""
    backend = getattr(tok, "backend_tokenizer", None)
    if backend is None:
        raise ValueError(f"{type(tok).__name__}: expected a fast (tokenizers-backed) tokenizer")
    model = type(backend.model).__name__
    if model == "WordPiece":
        return WORDPIECE
    if model == "Unigram" or "Metaspace" in repr(backend.pre_tokenizer):
        return SENTENCEPIECE
    return BPE


def uses_token_types(model_or_config) -> bool:
    """Whether the encoder takes ``token_type_ids`` that can differ from 0 (BERT, ALBERT, ELECTRA); RoBERTa/XLM-R
    have a single type (type_vocab_size 1) and DistilBERT has no such input at all."""
    cfg = getattr(model_or_config, "config", model_or_config)
    return int(getattr(cfg, "type_vocab_size", 0) or 0) >= 2


def model_inputs(batch: dict, model) -> dict:
    """``batch`` without the inputs ``model`` cannot take (token_type_ids for RoBERTa-likes and DistilBERT)."""
    if uses_token_types(model):
        return batch
    return {k: v for k, v in batch.items() if k != "token_type_ids"}


class _Sequential(nn.Module):
    """Existing head modules applied in order (no new parameters, so nothing else changes in the state dict)."""

    def __init__(self, *parts: nn.Module):
        super().__init__()
        self.parts = list(parts)  # plain list: the modules stay registered where the model has them

    def forward(self, x):
        for p in self.parts:
            x = p(x)
        return x


def mlm_head(model) -> Callable | None:
    """The MLM head as one callable hidden states -> vocabulary logits, or None for an unknown layout."""
    for name in ("cls", "lm_head", "predictions"):  # BERT/ERNIE/NEZHA; RoBERTa/XLM-R/CamemBERT; ALBERT
        head = getattr(model, name, None)
        if isinstance(head, nn.Module):
            return head
    if hasattr(model, "vocab_projector"):  # DistilBERT
        return _Sequential(model.vocab_transform, model.activation, model.vocab_layer_norm, model.vocab_projector)
    if hasattr(model, "generator_lm_head"):  # ELECTRA
        return _Sequential(model.generator_predictions, model.generator_lm_head)
    return None


def head_modules(model) -> list[nn.Module]:
    """The modules making up the MLM head (for train/eval switching and parameter selection)."""
    head = mlm_head(model)
    if head is None:
        return []
    return list(head.parts) if isinstance(head, _Sequential) else [head]


def encoder(model) -> nn.Module:
    """The bare encoder inside an MLM or task model (``model.bert``, ``model.roberta``, ...)."""
    return model.base_model


def word_piece_ids(tok, words) -> list[list[int]]:
    """The ids each word gets inside running text, not as a text of its own: byte-level BPE sees a Latin word after a
    space (``Ġword``), and a SentencePiece tokenizer's lone ``▁`` before a word that starts its text is dropped (a
    Chinese word inside a sentence has none)."""
    words = list(words)
    if not words:
        return []
    kind = tokenizer_kind(tok)
    texts = [" " + w if kind == BPE and w[:1].isascii() and w[:1].isalnum() else w for w in words]
    enc = tok(texts, add_special_tokens=False)["input_ids"]
    if kind != SENTENCEPIECE:
        return [list(ids) for ids in enc]
    bare = {i for i in (tok.convert_tokens_to_ids("▁"),) if i is not None and i != tok.unk_token_id}
    return [list(ids[1:]) if len(ids) > 1 and ids[0] in bare else list(ids) for ids in enc]
