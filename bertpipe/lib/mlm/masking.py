"""MLM masking of a padded batch: whole-word choice, then 80/10/10 per chosen token, labels -100 elsewhere.

Each word is chosen independently with probability ``mask_prob`` (vectorised over the batch), so the expected share
of chosen tokens is exactly ``mask_prob`` whatever the word lengths; every piece of a chosen word is chosen together.
Special tokens and padding carry word id -1 and are never chosen. The random generator is passed in, so a mask is a
pure function of its seed: dynamic masking seeds by (step, micro-batch's place in the step), static masking by example.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

IGNORE = -100


@dataclass(frozen=True)
class MaskSpec:
    mask_prob: float = 0.15
    mask_token_ratio: float = 0.8
    random_token_ratio: float = 0.1
    keep_ratio: float = 0.1
    whole_word: bool = True

    @classmethod
    def from_params(cls, p) -> "MaskSpec":
        return cls(p.mask_prob, p.mask_token_ratio, p.random_token_ratio, p.keep_ratio, p.whole_word)


def normal_token_ids(tokenizer) -> torch.Tensor:
    """Ids a random replacement may draw: the vocabulary minus special and [unusedN] tokens."""
    special = set(tokenizer.all_special_ids)
    vocab = tokenizer.get_vocab()
    ids = [i for t, i in vocab.items() if i not in special and not (t.startswith("[unused") and t.endswith("]"))]
    return torch.tensor(sorted(ids), dtype=torch.long)


def mask_batch(
    input_ids: torch.Tensor,
    word_ids: torch.Tensor,
    spec: MaskSpec,
    mask_id: int,
    replace_ids: torch.Tensor,
    gen: torch.Generator,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Return (masked input ids, labels). ``word_ids`` [B, L]: a word index per token, -1 for special/padding."""
    valid = word_ids >= 0
    if not spec.whole_word:  # every token is its own word
        pos = torch.arange(word_ids.shape[1]).expand_as(word_ids)
        word_ids = torch.where(valid, pos, torch.full_like(word_ids, -1))
    n_words = int(word_ids.max().item()) + 1 if valid.any() else 1
    word_draw = torch.rand((input_ids.shape[0], max(n_words, 1)), generator=gen)
    chosen = (word_draw.gather(1, word_ids.clamp(min=0)) < spec.mask_prob) & valid

    # An example with nothing chosen would contribute no loss at all; choose one random word of it instead.
    empty = (~chosen.any(1)) & valid.any(1)
    if empty.any():
        score = torch.rand(word_ids.shape, generator=gen).masked_fill(~valid, -1.0)
        pick = score.argmax(1, keepdim=True)
        pick_word = word_ids.gather(1, pick)
        chosen = chosen | ((word_ids == pick_word) & valid & empty[:, None])

    labels = torch.where(chosen, input_ids, torch.full_like(input_ids, IGNORE))
    action = torch.rand(input_ids.shape, generator=gen)
    to_mask = chosen & (action < spec.mask_token_ratio)
    to_random = chosen & (action >= spec.mask_token_ratio) & (action < spec.mask_token_ratio + spec.random_token_ratio)
    out = input_ids.clone()
    out[to_mask] = mask_id
    n_rand = int(to_random.sum())
    if n_rand:
        draw = torch.randint(len(replace_ids), (n_rand,), generator=gen)
        out[to_random] = replace_ids[draw]
    return out, labels


def seeded(*parts: int) -> torch.Generator:
    """A generator whose stream depends only on ``parts`` (seed, step, micro-batch, rank ...)."""
    s = 0x9E3779B97F4A7C15
    for p in parts:
        s = (s * 1000003 + int(p) + 1) % (1 << 63)
    g = torch.Generator()
    g.manual_seed(s)
    return g
