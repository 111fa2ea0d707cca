"""Loading the model to pretrain (a checkpoint, or a fresh one from params) and its MLM (+ pair) loss.

The loss runs the encoder over the whole batch but the MLM head (transform + vocabulary projection, the costliest
matmul of a small BERT) only at the chosen positions: ~15% of the tokens instead of every token and pad. Documents
packed into one row attend only to themselves, through the kernel ``bertpipe.infra.attention`` runs.
"""

from __future__ import annotations

from pathlib import Path

from torch import nn

from bertpipe.infra.errors import BertpipeError
from bertpipe.infra.attention import encoder_inputs
from bertpipe.lib import model_families
from bertpipe.lib.mlm.masking import IGNORE

# model types whose AutoModelForMaskedLM has the BERT layout (encoder + MLM head over hidden states)
BERT_FAMILY = model_families.ENCODER_TYPES


def load_tokenizer(ref: Path | str):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(ref))
    except Exception as e:  # noqa: BLE001 - transformers raises many types for a bad dir/id
        raise BertpipeError(f"{ref}: cannot load a tokenizer ({type(e).__name__}: {str(e).splitlines()[0][:160]})")


def load_checkpoint(ref: Path | str, log=print):
    """(model, tokenizer, fresh_head) from a save_pretrained dir or hub id holding a BERT-family encoder."""
    from transformers import AutoConfig, AutoModelForMaskedLM

    if isinstance(ref, Path) and not ref.exists():
        raise BertpipeError(f"{ref}: model checkpoint does not exist")
    try:
        config = AutoConfig.from_pretrained(str(ref))
    except Exception as e:  # noqa: BLE001
        raise BertpipeError(f"{ref}: not a model checkpoint ({type(e).__name__}: {str(e).splitlines()[0][:160]})")
    if config.model_type not in BERT_FAMILY:
        raise BertpipeError(f"{ref}: model_type {config.model_type!r} is not a BERT-family encoder ({sorted(BERT_FAMILY)})")
    try:
        model, info = AutoModelForMaskedLM.from_pretrained(str(ref), output_loading_info=True)
    except Exception as e:  # noqa: BLE001
        raise BertpipeError(f"{ref}: cannot load as AutoModelForMaskedLM ({type(e).__name__}: {str(e)[:160]})")
    missing = [k for k in info.get("missing_keys", []) if "decoder.weight" not in k]
    # Whatever is missing outside the encoder is the head (cls., lm_head., predictions., vocab_*, generator_*).
    fresh_head = any(not k.startswith(model.base_model_prefix + ".") for k in missing)
    if fresh_head:
        log(f"{ref}: checkpoint has no MLM head; a fresh head is initialised ({len(missing)} tensors)")
    tokenizer = load_tokenizer(ref)
    return model, tokenizer, fresh_head


def from_scratch(tokenizer, arch, max_seq_len: int):
    from transformers import BertConfig, BertForMaskedLM

    if arch.max_positions < max_seq_len:
        raise BertpipeError(f"base.max_seq_len ({max_seq_len}) exceeds base.arch.max_positions ({arch.max_positions})")
    config = BertConfig(
        vocab_size=len(tokenizer),
        hidden_size=arch.hidden,
        num_hidden_layers=arch.layers,
        num_attention_heads=arch.heads,
        intermediate_size=arch.intermediate,
        max_position_embeddings=arch.max_positions,
        hidden_dropout_prob=arch.dropout,
        attention_probs_dropout_prob=arch.dropout,
        type_vocab_size=2,
        pad_token_id=tokenizer.pad_token_id,
    )
    return BertForMaskedLM(config)


def check_compatible(model, tokenizer, max_seq_len: int, where: str) -> None:
    cfg = model.config
    if len(tokenizer) > cfg.vocab_size:
        raise BertpipeError(
            f"{where}: tokenizer has {len(tokenizer)} tokens but the model's embedding table {cfg.vocab_size}"
            " (tokenizer/model vocab mismatch)"
        )
    limit = getattr(cfg, "max_position_embeddings", None)
    if limit is not None and max_seq_len > limit:
        raise BertpipeError(f"max_seq_len ({max_seq_len}) exceeds {where}'s position table ({limit})")
    if tokenizer.mask_token_id is None or tokenizer.pad_token_id is None:
        raise BertpipeError(f"{where}: tokenizer has no [MASK] or [PAD] token; expected a BERT-style tokenizer")


def _split_head(model) -> tuple[nn.Module | None, nn.Module | None]:
    """(encoder, head taking hidden states) when the layout allows computing the head at chosen positions only."""
    head = model_families.mlm_head(model)
    return (model_families.encoder(model), head) if head is not None else (None, None)


class PretrainModel(nn.Module):
    """The MLM model plus an optional pair (NSP/SOP) head on [CLS]; forward returns the losses.

    The pair head is a training-only helper (dense+tanh+linear, like BERT's pooler and NSP head) and is not saved:
    the output is a plain ``AutoModelForMaskedLM``.
    """

    def __init__(self, mlm, pair: bool, masked_only: bool = True):
        super().__init__()
        self.mlm = mlm
        self.encoder, self.head = _split_head(mlm) if masked_only else (None, None)
        h = mlm.config.hidden_size
        self.pair_head = nn.Sequential(nn.Linear(h, h), nn.Tanh(), nn.Linear(h, 2)) if pair else None
        # RoBERTa/XLM-R have one token type and DistilBERT none: segment B is told apart by its separator only.
        self.token_types = model_families.uses_token_types(mlm)

    @property
    def saved(self) -> nn.Module:
        """What becomes model/ (the interface every objective's module has; see ``rtd.RtdModel``)."""
        return self.mlm

    def forward(self, input_ids, attention_mask, token_type_ids, labels, pair_labels=None, doc_ids=None,
                doc_offsets=None) -> dict:
        """Losses of one batch; ``doc_ids`` (``data.collate``'s, when a row packs several documents) and
        ``doc_offsets`` (``attention.prepare``'s) confine each token's attention to its own document."""
        sel = labels != IGNORE
        inputs = {"input_ids": input_ids, **encoder_inputs(self.mlm, attention_mask, doc_ids, doc_offsets)}
        if self.token_types:
            inputs["token_type_ids"] = token_type_ids
        if self.encoder is not None:
            hidden = self.encoder(**inputs).last_hidden_state
            logits = self.head(hidden[sel])
            target = labels[sel]
        else:  # an unknown layout: full logits (correct, just slower)
            out = self.mlm(**inputs, output_hidden_states=self.pair_head is not None)
            logits, target = out.logits[sel], labels[sel]
            hidden = out.hidden_states[-1] if self.pair_head is not None else None
        # The sum lets the training loop normalise by the masked tokens of a whole step (see train.MaskedLM).
        mlm_sum = nn.functional.cross_entropy(logits.float(), target, reduction="sum")
        n_masked = sel.sum()
        mlm_loss = mlm_sum / n_masked.clamp(min=1)
        result = {"mlm_loss": mlm_loss, "mlm_sum": mlm_sum, "loss": mlm_loss, "n_masked": n_masked}
        if self.pair_head is not None and pair_labels is not None:
            pair_logits = self.pair_head(hidden[:, 0])
            pair_loss = nn.functional.cross_entropy(pair_logits.float(), pair_labels)
            result["pair_loss"] = pair_loss
            result["pair_acc"] = (pair_logits.argmax(-1) == pair_labels).float().mean()
            result["loss"] = mlm_loss + pair_loss
        return result

