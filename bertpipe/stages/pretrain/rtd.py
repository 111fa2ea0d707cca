"""ELECTRA's replaced-token detection (Clark et al. 2020) as the pretraining objective: ``pretrain.objective: rtd``.

A small generator (an MLM, ``rtd.generator_ratio`` of the discriminator's width, same depth) predicts the masked
tokens; its samples replace them; the discriminator - the encoder being adapted - classifies every input token as
original or replaced. loss = generator MLM loss + ``rtd.disc_weight`` (the paper's lambda = 50) x discriminator loss.
The discriminator learns from every token rather than the ~15% an MLM head sees, which is where the paper's "same
quality with ~1/4 of the compute" comes from (checked, not assumed: bench/bench_objectives.py, docs/objectives.md).

- The discriminator is the checkpoint's own encoder (``base_model`` of the loaded ``AutoModelForMaskedLM``) with a new
  head (dense + GELU + dense to one logit, as ELECTRA's). What the stage saves is that encoder alone (a headless
  ``save_pretrained`` dir: ``AutoModel`` and every finetune Auto class load it); the MLM head of the checkpoint is not
  trained by RTD and is not saved, so nothing can score the encoder with a stale head.
- The generator is an ``ElectraForMaskedLM`` whose token embeddings *are* the discriminator's (one tensor): with a
  smaller hidden size, ELECTRA's ``embedding_size`` plus a projection, as the paper does. Only the token embeddings
  are tied (the paper: tying token embeddings gives nearly all of the gain of tying everything), so the generator
  works under any encoder family's position/type embedding scheme.
- Sampling: inverse CDF of the generator's softmax with one uniform per masked position. In training the uniforms
  come from the global RNG, which the loop seeds per (seed, step, micro-batch) - so a resumed run draws the same
  samples; in evaluation from a generator seeded by the batch's ids, so every evaluation scores the same
  replacements for the same generator.

Interface: the same as ``model.PretrainModel`` (``forward(input_ids, attention_mask, token_type_ids, labels,
pair_labels)`` -> dict with ``mlm_sum``/``mlm_loss``/``n_masked``, ``saved``: the module that becomes model/), plus
``disc_sum`` (summed over non-padding tokens), ``disc_weight`` and the discriminator's accuracy counts, which
``train.MaskedLM`` (the training objective) and ``train.evaluate`` add when present.
"""

from __future__ import annotations

import hashlib

import torch
from torch import nn

from bertpipe.infra.attention import encoder_inputs
from bertpipe.lib.mlm.masking import IGNORE


def generator_config(disc_config, embedding_size: int, vocab_size: int, ratio: float):
    """An ElectraConfig for the generator: the discriminator's depth, ``ratio`` of its width, its head size kept."""
    from transformers import ElectraConfig

    h = disc_config.hidden_size
    heads = getattr(disc_config, "num_attention_heads", None) or getattr(disc_config, "n_heads", 1)
    head_dim = max(1, h // heads)
    g_heads = max(1, round(h * ratio) // head_dim)
    g_hidden = max(g_heads, (max(1, round(h * ratio)) // g_heads) * g_heads)
    inter = getattr(disc_config, "intermediate_size", None) or getattr(disc_config, "hidden_dim", 4 * h)
    layers = getattr(disc_config, "num_hidden_layers", None) or getattr(disc_config, "n_layers", 1)
    positions = getattr(disc_config, "max_position_embeddings", 512)
    return ElectraConfig(
        vocab_size=vocab_size, embedding_size=embedding_size, hidden_size=g_hidden, num_hidden_layers=layers,
        num_attention_heads=g_heads, intermediate_size=max(1, round(inter * ratio)), max_position_embeddings=positions,
        type_vocab_size=max(2, getattr(disc_config, "type_vocab_size", 2) or 2),
        pad_token_id=getattr(disc_config, "pad_token_id", 0) or 0,
    )


class RtdModel(nn.Module):
    def __init__(self, mlm, generator_ratio: float, disc_weight: float, seed: int):
        super().__init__()
        from transformers import ElectraForMaskedLM

        self.disc = mlm.base_model
        self.disc_weight = float(disc_weight)
        self.seed = int(seed)
        self.type_ids = getattr(self.disc.config, "type_vocab_size", 0) > 0  # DistilBERT has no token types
        shared = self.disc.get_input_embeddings()
        h = self.disc.config.hidden_size
        # New weights from their own seeded stream: the same seed gives the same generator and head, and the global
        # RNG (dropout, sampling) is left as the training loop seeded it.
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self.seed)
            self.disc_head = nn.Sequential(nn.Linear(h, h), nn.GELU(), nn.Linear(h, 1))
            gcfg = generator_config(self.disc.config, shared.weight.shape[1], shared.weight.shape[0], generator_ratio)
            self.generator = ElectraForMaskedLM(gcfg)
        self.generator.electra.embeddings.word_embeddings = shared  # one tensor: gradients from both models
        self.generator.generator_lm_head.weight = shared.weight  # the output projection tied to it, as in ELECTRA

    @property
    def saved(self) -> nn.Module:
        """The adapted encoder: what becomes model/ (the discriminator, without its RTD head)."""
        return self.disc

    def _encode(self, encoder, input_ids, attention_mask, token_type_ids, doc_ids=None, doc_offsets=None):
        kw = {"token_type_ids": token_type_ids} if self.type_ids and token_type_ids is not None else {}
        # packed documents attend only to themselves
        attn = encoder_inputs(encoder, attention_mask, doc_ids, doc_offsets)
        return encoder(input_ids=input_ids, **attn, **kw).last_hidden_state

    def _uniforms(self, ids: torch.Tensor, n: int) -> torch.Tensor:
        if self.training:
            return torch.rand(n, device=ids.device)
        digest = hashlib.sha256(ids.detach().cpu().numpy().tobytes()).digest()
        g = torch.Generator().manual_seed((self.seed * 1000003 + int.from_bytes(digest[:7], "little")) % (1 << 62))
        return torch.rand(n, generator=g).to(ids.device)

    def forward(self, input_ids, attention_mask, token_type_ids, labels, pair_labels=None, doc_ids=None,
                doc_offsets=None) -> dict:
        sel = labels != IGNORE
        g = self.generator
        gen_hidden = self._encode(g.electra, input_ids, attention_mask, token_type_ids, doc_ids, doc_offsets)
        logits = g.generator_lm_head(g.generator_predictions(gen_hidden[sel])).float()
        target = labels[sel]
        mlm_sum = nn.functional.cross_entropy(logits, target, reduction="sum")
        n_masked = sel.sum()
        with torch.no_grad():  # no gradient through sampling (the paper's choice; the generator learns by MLM only)
            cdf = logits.detach().softmax(-1).cumsum(-1)
            u = self._uniforms(input_ids, int(target.numel())).to(cdf.dtype)
            sampled = torch.searchsorted(cdf, u[:, None]).squeeze(-1).clamp(max=cdf.shape[-1] - 1)
            disc_ids = input_ids.clone()
            disc_ids[sel] = sampled
            original = torch.where(sel, labels, input_ids)
            valid = attention_mask.bool()
            replaced = (disc_ids != original) & valid  # a sample equal to the original counts as original
        hidden = self._encode(self.disc, disc_ids, attention_mask, token_type_ids, doc_ids, doc_offsets)
        d_logits = self.disc_head(hidden[valid]).squeeze(-1).float()
        d_target = replaced[valid].float()
        disc_sum = nn.functional.binary_cross_entropy_with_logits(d_logits, d_target, reduction="sum")
        n_tokens = valid.sum()
        mlm_loss = mlm_sum / n_masked.clamp(min=1)
        disc_loss = disc_sum / n_tokens.clamp(min=1)
        return {
            "mlm_sum": mlm_sum, "mlm_loss": mlm_loss, "n_masked": n_masked,
            "disc_sum": disc_sum, "disc_loss": disc_loss, "disc_weight": self.disc_weight, "n_tokens": n_tokens,
            "disc_correct": ((d_logits > 0).float() == d_target).sum(), "n_replaced": d_target.sum(),
            "loss": mlm_loss + self.disc_weight * disc_loss,
        }
