"""A fair masked-LM comparison of encoders whose vocabularies differ: NLL per masked character on the same words.

Per-token perplexity cannot compare an encoder with an extended vocabulary (one token predicts a whole word) with its
base (one token per character, the rest of the word visible). Here the *text* decides what is hidden:

1. windows: the first characters of each text (a seeded sample of ``mlm_max_texts``) of the domain **test** split
   (never the valid split that pretraining early-stopped on), cut at a jieba word boundary; the window length is set
   in characters, so every model sees the same text;
2. spans: a fixed fraction of each window's jieba words (those with a letter or digit), drawn with a RNG seeded by
   ``(seed, window text)`` — the span set depends only on the texts and the seed, never on a tokenizer;
3. each model masks, in its own tokenizer, every token whose character range overlaps a chosen span, and is scored by
   the negative log-likelihood of the gold tokens at the masked positions, summed and divided by the characters those
   tokens cover. A window a model cannot fit whole is dropped — for every compared model alike.

See docs/evaluation.md.
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Callable, Sequence

from bertpipe.infra.errors import BertpipeError
from bertpipe.lib import model_families
from bertpipe.lib.measures.windows import Window, choose_windows
from bertpipe.lib.modelinfo import clamp_seq_len

def window_chars(requested_seq_len: int, models: Sequence, log: Callable[[str], None] | None = None) -> int:
    """Characters per window: the sequence length clamped to the smallest position table among ``models``, less
    [CLS]/[SEP]. WordPiece never makes more tokens than characters, so such a window fits every compared model."""
    n = requested_seq_len
    for m in models:
        n = clamp_seq_len(n, m, "evaluate.mlm_max_seq_len", log)
    return max(n - 2, 1)


def _masked_tokens(offsets, special, spans) -> tuple[list[bool], int]:
    """Which tokens overlap a chosen span (those are masked), and how many characters they cover."""
    m = [not special[t] and e > s and any(a < e and s < b for a, b in spans) for t, (s, e) in enumerate(offsets)]
    covered = {c for t, (s, e) in enumerate(offsets) if m[t] for c in range(s, e)}
    return m, len(covered)


def _batch_nll(model, head, ids: list[list[int]], masks: list[list[bool]], mask_id: int, pad_id: int, device):
    """Summed NLL of the gold tokens at the masked positions, per row; masked positions are [MASK] in the input."""
    import torch

    width = max(len(x) for x in ids)
    gold = torch.full((len(ids), width), pad_id)
    att = torch.zeros((len(ids), width), dtype=torch.long)
    chosen = torch.zeros((len(ids), width), dtype=torch.bool)
    for r, (x, m) in enumerate(zip(ids, masks)):
        gold[r, : len(x)], att[r, : len(x)], chosen[r, : len(x)] = torch.tensor(x), 1, torch.tensor(m)
    gold, att, chosen = gold.to(device), att.to(device), chosen.to(device)
    inputs = torch.where(chosen, torch.full_like(gold, mask_id), gold)
    if head is not None:  # the vocabulary projection only where a token is masked: most of the compute
        logits = head(model.base_model(input_ids=inputs, attention_mask=att).last_hidden_state[chosen])
    else:
        logits = model(input_ids=inputs, attention_mask=att).logits[chosen]
    nll = torch.nn.functional.cross_entropy(logits.float(), gold[chosen], reduction="none").double().cpu()
    return torch.zeros(len(ids), dtype=torch.float64).index_add_(0, chosen.nonzero()[:, 0].cpu(), nll).tolist()


def score_windows(model_dir, windows: Sequence[Window], max_len: int, batch_size: int = 16, desc: str = "",
                  device: str = "cpu") -> list[tuple[float, int, int] | None]:
    """Per window: (summed NLL in nats, masked characters, masked tokens), or None if the window did not fit
    ``max_len`` tokens in this model's tokenizer."""
    import torch
    from tqdm.auto import tqdm
    from transformers import AutoModelForMaskedLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    if not getattr(tok, "is_fast", False):
        raise BertpipeError(f"{model_dir}: the fair comparison needs a fast tokenizer (character offsets)")
    model, info = AutoModelForMaskedLM.from_pretrained(str(model_dir), output_loading_info=True)
    fresh = [k for k in info.get("missing_keys", ())
             if not k.startswith(model.base_model_prefix + ".") and "decoder.weight" not in k]
    if fresh:  # a headless encoder would be scored with a random head: a meaningless number
        raise BertpipeError(f"{model_dir}: no masked-LM head to score (missing {fresh[0]}; an RTD-trained "
                            "discriminator has none): the masked-LM comparison does not apply")
    model.to(device).eval()
    head = model_families.mlm_head(model)  # BERT / RoBERTa / ALBERT / DistilBERT / ELECTRA layouts
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    out: list[tuple[float, int, int] | None] = []
    bar = tqdm(range(0, len(windows), batch_size), desc=f"fair MLM {desc or model_dir}", unit="batch",
               file=sys.stderr, leave=False, mininterval=2.0)
    with torch.inference_mode():
        for i in bar:
            batch = windows[i : i + batch_size]
            enc = tok([w for w, _ in batch], return_offsets_mapping=True, return_special_tokens_mask=True)
            rows = [j for j in range(len(batch)) if len(enc["input_ids"][j]) <= max_len]
            marked = [_masked_tokens(enc["offset_mapping"][j], enc["special_tokens_mask"][j], batch[j][1])
                      for j in rows]
            res: dict[int, tuple[float, int, int]] = {}
            if rows:
                nll = _batch_nll(model, head, [enc["input_ids"][j] for j in rows], [m for m, _ in marked],
                                 tok.mask_token_id, pad, device)
                res = {j: (nll[r], marked[r][1], sum(marked[r][0])) for r, j in enumerate(rows)}
            out.extend(res.get(j) for j in range(len(batch)))
    return out


def has_mlm_head(model_dir) -> bool:
    """Whether a saved model dir holds a masked-LM head (its architecture), without loading the weights. The encoder
    of ``pretrain.objective: rtd`` (ELECTRA's discriminator) is saved headless: nothing here can score it."""
    import json

    try:
        arch = (json.loads((Path(model_dir) / "config.json").read_text()).get("architectures") or [""])[0]
    except (OSError, ValueError):
        return True  # a hub id or an unreadable dir: let the scorer load it and say what is wrong
    return arch.endswith("ForMaskedLM") or (arch.endswith("ForPreTraining") and not arch.startswith("Electra"))


def eval_device(p) -> str:
    from bertpipe.infra.device import pick_device

    return str(pick_device(p.device))


def summarize(scores: Sequence[tuple[float, int, int] | None], windows: Sequence[Window]) -> dict:
    kept = [(s, w) for s, w in zip(scores, windows) if s is not None]
    nll = sum(s[0] for s, _ in kept)
    chars = sum(s[1] for s, _ in kept)
    per_char = nll / chars if chars else float("nan")
    return {"nll_per_char": per_char, "bits_per_char": per_char / math.log(2), "masked_chars": chars,
            "masked_tokens": sum(s[2] for s, _ in kept), "spans": sum(len(w[1]) for _, w in kept),
            "windows": len(kept)}


def compare_encoders(models: dict[str, object], texts: Sequence[str] | None, p,
                     log: Callable[[str], None] | None = None, n_boot: int = 1000, boot_seed: int = 0,
                     choose: Callable[[int], list[Window]] | None = None) -> dict:
    """{name: summary} for every model on the same windows and spans (windows any model could not fit are dropped for
    all), plus ``delta`` (last − first model's NLL per character, with a paired bootstrap interval over windows) and
    ``gate``: {name: {"neg_nll_per_char", "max_len"}}, each model's encoder gate score (``encoder_gate``: over every
    window that model fits, the number register gates on). ``choose(max_chars)``: the windows (the evaluate stage
    reads them from ``windows.open_windows``'s store), else they are chosen from ``texts``."""
    from bertpipe.lib.measures.bootstrap import paired_bootstrap, ratio

    max_chars = window_chars(p.mlm_max_seq_len, list(models.values()), log)
    windows = choose(max_chars) if choose else choose_windows(texts, max_chars, p.mlm_mask_prob, p.mlm_seed)
    scores, max_lens = {}, {}
    for name, m in models.items():
        max_lens[name] = clamp_seq_len(p.mlm_max_seq_len, m, "evaluate.mlm_max_seq_len")  # window_chars logged it
        scores[name] = score_windows(m, windows, max_lens[name], p.mlm_batch_size, desc=name, device=eval_device(p))
    keep = [i for i in range(len(windows)) if all(s[i] is not None for s in scores.values())]
    out: dict = {"split": "test", "window_chars": max_chars, "dropped_windows": len(windows) - len(keep)}
    for name, s in scores.items():
        out[name] = summarize([s[i] for i in keep], [windows[i] for i in keep])
    names = list(models)
    if len(names) == 2 and keep:
        a, b = ([scores[n][i][:2] for i in keep] for n in names)
        if n_boot:
            d = paired_bootstrap([None] * len(keep), a, b, ratio, n=n_boot, seed=boot_seed)
            how = f"paired bootstrap over {len(keep)} text windows (n={n_boot}, seed {boot_seed})"
        else:
            none = [None] * len(keep)  # the statistic reads no gold
            d = {"mean": ratio(none, b) - ratio(none, a), "ci95": None}
            how = "none (evaluate.bootstrap_samples = 0)"
        out["delta"] = {"nll_per_char": d["mean"], "bits_per_char": d["mean"] / math.log(2), "ci95": d["ci95"],
                        "ci_method": how}
    out["gate"] = {name: {"neg_nll_per_char": -float(summarize(s, windows)["nll_per_char"]),
                          "max_len": max_lens[name]} for name, s in scores.items()}
    return out
