"""New embedding rows: resize the model to the extended tokenizer and start each new row from the old pieces."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Callable, Sequence

import torch

from bertpipe.infra.errors import BertpipeError
from bertpipe.lib import model_families

# The initialisations of new rows that vocab.init "best" compares on held-out text.
INITS = ("mean", "mean_rare_bias", "mean_cov", "random")


def load_mlm(src: Path | str, log: Callable[[str], None] = print):
    """An AutoModelForMaskedLM; a checkpoint without an MLM head (an encoder-only BertModel) gets a fresh one."""
    from transformers import AutoModelForMaskedLM

    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # its load report would say "MISSING" for a head we handle and log below
    try:
        model, info = AutoModelForMaskedLM.from_pretrained(str(src), output_loading_info=True)
    except Exception as e:
        raise BertpipeError(f"{src}: not a masked-LM-compatible model ({type(e).__name__}: {str(e)[:200]})") from None
    finally:
        hf_logging.set_verbosity(level)
    missing = [k for k in info.get("missing_keys", []) if "embeddings.position_ids" not in k]
    head_missing = [k for k in missing if k.split(".")[0] != model.base_model_prefix]
    if head_missing:
        log(
            f"{src}: the checkpoint has no MLM head ({len(head_missing)} weights missing, e.g. {head_missing[0]}); "
            "initialised a fresh head (decoder tied to the input embeddings)"
        )
    body_missing = [k for k in missing if k not in head_missing]
    if body_missing:
        raise BertpipeError(f"{src}: encoder weights missing from the checkpoint (e.g. {body_missing[0]})")
    model.eval()
    return model, bool(head_missing)


def head_parameters(model) -> list[torch.nn.Parameter]:
    """The MLM head's own parameters (transform and bias), without the decoder weight tied to the embeddings."""
    out = model.get_output_embeddings()
    emb = model.get_input_embeddings().weight
    base_prefix = getattr(model, "base_model_prefix", "bert") + "."
    return [
        p
        for n, p in model.named_parameters()
        if not n.startswith(base_prefix) and p.data_ptr() != emb.data_ptr() and (out is None or p is not out.weight)
    ]


def fit_head(model, tok, texts: Sequence[str], steps: int, lr: float = 1e-3, max_length: int = 128,
             batch: int = 16, seed: int = 0, log: Callable[[str], None] = print) -> float:
    """Fit a freshly initialised MLM head on masked ``texts`` with everything else frozen; returns the last loss.

    A random head predicts near-uniformly (loss ~ ln|V|), which would hide any difference between embedding
    initialisations; a head fitted on the base vocabulary reads the frozen encoder the way a real one would.
    """
    texts = [t for t in texts if t and t.strip()]
    params = head_parameters(model)
    if steps <= 0 or not texts or not params:
        return float("nan")
    head = model_families.mlm_head(model)
    if head is None:
        return float("nan")
    head_parts = model_families.head_modules(model)
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    gen = torch.Generator().manual_seed(seed)
    last = float("nan")
    head_ids = {id(p) for p in params}
    # The decoder weight is the (tied) input embedding matrix: it stays as the checkpoint has it.
    frozen = [(p, p.requires_grad) for p in model.parameters() if id(p) not in head_ids]
    for p, _ in frozen:
        p.requires_grad_(False)
    for m in head_parts:
        m.train()
    try:
        for step in range(steps):
            idx = torch.randint(len(texts), (min(batch, len(texts)),), generator=gen).tolist()
            enc = tok([texts[i] for i in idx], truncation=True, max_length=max_length, padding=True,
                      return_tensors="pt", return_special_tokens_mask=True)
            special = enc.pop("special_tokens_mask").bool() | (enc["attention_mask"] == 0)
            mask = (torch.rand(enc["input_ids"].shape, generator=gen) < 0.15) & ~special
            if not mask.any():
                continue
            labels = enc["input_ids"][mask]
            enc["input_ids"] = torch.where(mask, torch.full_like(enc["input_ids"], tok.mask_token_id), enc["input_ids"])
            # The encoder is frozen: run it without a graph and train the head on the masked positions only.
            with torch.no_grad():
                hidden = model.base_model(**model_families.model_inputs(enc, model)).last_hidden_state[mask]
            loss = torch.nn.functional.cross_entropy(head(hidden), labels)
            opt.zero_grad()
            loss.backward()
            opt.step()
            last = float(loss.detach())
            if step % 50 == 0 or step == steps - 1:
                log(f"fitting the fresh MLM head: step {step + 1}/{steps} loss {last:.3f}")
    finally:
        for m in head_parts:
            m.eval()
        for p, flag in frozen:
            p.requires_grad_(flag)
    return last


def output_bias(model) -> torch.nn.Parameter | None:
    out = model.get_output_embeddings()
    return getattr(out, "bias", None) if out is not None else None


def piece_ids(base_tok, tokens: Sequence[str]) -> list[list[int]]:
    """The base pieces of each new token inside running text ("##x" counts as "x"; see model_families.word_piece_ids);
    a token the base cannot split maps to [UNK]."""
    prefix = getattr(base_tok.backend_tokenizer.model, "continuing_subword_prefix", None) or "##"
    texts = [t[len(prefix) :] if t.startswith(prefix) and len(t) > len(prefix) else t for t in tokens]
    enc = model_families.word_piece_ids(base_tok, texts)
    unk = base_tok.unk_token_id if base_tok.unk_token_id is not None else 0
    return [list(ids) if ids else [unk] for ids in enc]


@torch.no_grad()
def extend_model(model, base_tok, new_tok, method: str = "mean", seed: int = 0) -> dict[str, float]:
    """Resize ``model`` to ``new_tok`` and initialise the rows of the tokens ``new_tok`` adds to ``base_tok``.

    "mean": each row is the mean of its base pieces' rows, the output bias the mean of their biases.
    "mean_rare_bias": rows as "mean"; the output bias that of the rarest piece minus ln(number of pieces).
    "mean_cov": rows drawn from a normal with the old rows' mean and (scaled-down) covariance, bias = mean bias.
    "random": rows drawn like a fresh model's (normal, initializer_range), bias 0 (the ablation baseline).
    """
    old_rows = model.get_input_embeddings().weight.shape[0]
    if old_rows < len(base_tok):
        raise BertpipeError(f"model has {old_rows} embedding rows but its tokenizer has {len(base_tok)} ids")
    new_ids = list(range(len(base_tok), len(new_tok)))
    vocab = new_tok.convert_ids_to_tokens(new_ids)
    tied_before = _tied(model)
    model.resize_token_embeddings(max(old_rows, len(new_tok)), mean_resizing=False)
    emb = model.get_input_embeddings().weight
    bias = output_bias(model)
    if not new_ids:
        return {"new_rows": 0.0}
    ids_t = torch.tensor(new_ids)
    gen = torch.Generator().manual_seed(seed)
    base_rows = emb[: len(base_tok)].float()
    if method in ("mean", "mean_rare_bias"):
        pieces = piece_ids(base_tok, vocab)
        for i, p in zip(new_ids, pieces):
            emb[i] = emb[p].float().mean(0).to(emb.dtype)
            if bias is not None:
                b = bias[p].float()
                # A word is rarer than its rarest piece: starting its prior logit at the pieces' mean makes the
                # model predict new words where their pieces belong (held-out loss above random init on the laws).
                value = b.mean() if method == "mean" else b.min() - math.log(len(p))
                bias[i] = value.to(bias.dtype)
    elif method == "mean_cov":
        mu = base_rows.mean(0)
        centred = base_rows - mu
        cov = centred.T @ centred / base_rows.shape[0]
        # Like transformers' mean_resizing: the covariance shrunk so new rows stay near the mean.
        dist = torch.distributions.MultivariateNormal(mu, covariance_matrix=1e-5 * cov + 1e-9 * torch.eye(len(mu)))
        torch.manual_seed(seed)
        emb[ids_t] = dist.sample((len(new_ids),)).to(emb.dtype)
        if bias is not None:
            bias[ids_t] = bias[: len(base_tok)].float().mean().to(bias.dtype)
    elif method == "random":
        std = float(getattr(model.config, "initializer_range", 0.02))
        emb[ids_t] = (torch.randn(len(new_ids), emb.shape[1], generator=gen) * std).to(emb.dtype)
        if bias is not None:
            bias[ids_t] = 0
    else:
        raise BertpipeError(f"vocab.init: expected one of {', '.join(INITS)}, got {method!r}")
    if tied_before and not _tied(model):
        raise BertpipeError("resizing untied the input and output embeddings")
    model.config.vocab_size = emb.shape[0]
    return {"new_rows": float(len(new_ids)), "rows": float(emb.shape[0])}


def _tied(model) -> bool:
    out = model.get_output_embeddings()
    return out is not None and out.weight.data_ptr() == model.get_input_embeddings().weight.data_ptr()


@torch.no_grad()
def mlm_loss(
    model, tok, texts: Sequence[str], max_length: int = 128, mask_prob: float = 0.15, seed: int = 0, batch: int = 16
) -> float:
    """Mean MLM cross-entropy over a fixed random 15% of the (non-special) tokens, each replaced by [MASK].

    The masked positions depend only on ``seed`` and the token sequence, so two models with one tokenizer are
    compared on exactly the same predictions.
    """
    texts = [t for t in texts if t and t.strip()]
    if not texts or tok.mask_token_id is None:
        return float("nan")
    model.eval()
    gen = torch.Generator().manual_seed(seed)
    total, count = 0.0, 0
    for i in range(0, len(texts), batch):
        enc = tok(texts[i : i + batch], truncation=True, max_length=max_length, padding=True, return_tensors="pt",
                  return_special_tokens_mask=True)
        special = enc.pop("special_tokens_mask").bool() | (enc["attention_mask"] == 0)
        mask = (torch.rand(enc["input_ids"].shape, generator=gen) < mask_prob) & ~special
        if not mask.any():
            continue
        labels = torch.where(mask, enc["input_ids"], torch.full_like(enc["input_ids"], -100))
        enc["input_ids"] = torch.where(mask, torch.full_like(enc["input_ids"], tok.mask_token_id), enc["input_ids"])
        head = model_families.mlm_head(model)
        enc = model_families.model_inputs(enc, model)
        if head is not None:  # vocabulary logits only where a prediction is scored
            logits = head(model.base_model(**enc).last_hidden_state[mask])
            targets = labels[mask]
        else:
            logits = model(**enc).logits.view(-1, model.config.vocab_size)
            targets = labels.view(-1)
        loss = torch.nn.functional.cross_entropy(logits.float(), targets, reduction="sum", ignore_index=-100)
        total += float(loss)
        count += int(mask.sum())
    return total / count if count else float("nan")





def compare_inits(model, base_tok, new_tok, texts: Sequence[str], methods: Sequence[str] = INITS,
                  max_length: int = 128, seed: int = 0) -> dict[str, float]:
    """Held-out MLM loss of ``model`` extended to ``new_tok`` with each init in ``methods`` (on a copy; ``model`` is
    left as it is). Every candidate is scored on the same masked positions of ``texts``."""
    import copy

    out = {}
    for method in methods:
        trial = copy.deepcopy(model)
        extend_model(trial, base_tok, new_tok, method, seed=seed)
        out[method] = mlm_loss(trial, new_tok, texts, max_length=max_length, seed=seed)
        del trial
    return out


def choose_init(requested: str, scored: dict[str, float]) -> tuple[str, str]:
    """(init to use, why). ``best`` takes the lowest held-out loss (mean when nothing could be scored); a named init
    is used as asked, with the comparison still reported."""
    finite = {m: v for m, v in scored.items() if v == v}
    if requested != "best":
        if finite and requested in finite and min(finite.values()) < finite[requested]:
            best = min(finite, key=finite.get)
            return requested, f"as vocab.init asks, though {best} scored better ({finite[best]:.4f} vs " \
                              f"{finite[requested]:.4f})"
        return requested, "as vocab.init asks"
    if not finite:
        return "mean", "nothing to score (no new ids or no held-out texts): mean of the pieces"
    best = min(finite, key=finite.get)
    others = ", ".join(f"{m} {v:.4f}" for m, v in sorted(finite.items(), key=lambda x: x[1]) if m != best)
    return best, f"lowest held-out MLM loss: {finite[best]:.4f}" + (f"; {others}" if others else "")
