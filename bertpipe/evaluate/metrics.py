"""Task metrics: classification (scikit-learn), NER (seqeval, strict), QA (CMRC-style EM/F1), MLM perplexity.

Each scorer returns ``(flat, details)``: ``flat`` maps metric name -> float in [0, 1] (what tables and MLflow show),
``details`` holds per-class breakdowns and confusion matrices.
"""

from __future__ import annotations

import math
import re
import string
import sys
from typing import Sequence

PRIMARY = {"classification": "macro_f1", "pair_classification": "macro_f1", "ner": "f1", "qa": "f1"}


def classification_metrics(gold: Sequence[str], pred: Sequence[str], labels: Sequence[str]) -> tuple[dict, dict]:
    from sklearn.metrics import accuracy_score, confusion_matrix, precision_recall_fscore_support

    labels = list(labels)
    if not gold:
        return {}, {}
    p, r, f, s = precision_recall_fscore_support(gold, pred, labels=labels, zero_division=0)
    present = [i for i, n in enumerate(s) if n > 0]  # macro over the classes the split holds
    macro = lambda v: float(sum(v[i] for i in present) / max(len(present), 1))  # noqa: E731
    flat = {
        "accuracy": float(accuracy_score(gold, pred)),
        "macro_f1": macro(f),
        "macro_precision": macro(p),
        "macro_recall": macro(r),
    }
    details = {
        "per_class": {
            lab: {"precision": float(p[i]), "recall": float(r[i]), "f1": float(f[i]), "support": int(s[i])}
            for i, lab in enumerate(labels)
        },
        "confusion": {"labels": labels, "matrix": confusion_matrix(gold, pred, labels=labels).tolist()},
    }
    return flat, details


def ner_metrics(gold_tags: list[list[str]], pred_tags: list[list[str]]) -> tuple[dict, dict]:
    """Entity-level precision/recall/F1 with seqeval in strict mode (IOB2: an entity counts only if exact)."""
    from seqeval.metrics import classification_report
    from seqeval.scheme import IOB2

    if not gold_tags:
        return {}, {}
    # One pass: the report's micro average is the entity-level precision/recall/F1.
    rep = classification_report(gold_tags, pred_tags, mode="strict", scheme=IOB2, zero_division=0, output_dict=True)
    micro = rep.get("micro avg", {"precision": 0.0, "recall": 0.0, "f1-score": 0.0})
    flat = {"precision": float(micro["precision"]), "recall": float(micro["recall"]), "f1": float(micro["f1-score"])}
    per_type = {
        k: {"precision": float(v["precision"]), "recall": float(v["recall"]), "f1": float(v["f1-score"]),
            "support": int(v["support"])}
        for k, v in rep.items()
        if not k.endswith(" avg")
    }
    for k, v in per_type.items():
        flat[f"f1_{k}"] = v["f1"]
    return flat, {"per_type": per_type}


# ---------------------------------------------------------------- QA, as the CMRC 2018 evaluation script scores it

_PUNCT = set(string.punctuation) | set(
    "，。、；：？！…—·ˉ¨‘’“”々～‖∶＂＇｀｜〃〔〕〈〉《》「」『』．〖〗【】（）［］｛｝「」￥％＠＃＆＊＋－＝＜＞／＼＾＿　"
)


def _segment(text: str) -> list[str]:
    """CMRC's mixed segmentation: each CJK character on its own, runs of other characters as one token."""
    out, buf = [], ""
    for ch in text.lower().strip():
        if re.match(r"[\u4e00-\u9fa5]", ch) or ch in _PUNCT or ch.isspace():
            if buf:
                out.append(buf)
                buf = ""
            if not ch.isspace():
                out.append(ch)
        else:
            buf += ch
    if buf:
        out.append(buf)
    return out


def _strip_punct(text: str) -> str:
    return "".join(ch for ch in text.lower().strip() if ch not in _PUNCT and not ch.isspace())


def _lcs_len(a: Sequence[str], b: Sequence[str]) -> int:
    """Length of the longest common substring (contiguous), CMRC's F1 basis."""
    best = 0
    prev = [0] * (len(b) + 1)
    for x in a:
        cur = [0] * (len(b) + 1)
        for j, y in enumerate(b, 1):
            if x == y:
                cur[j] = prev[j - 1] + 1
                best = max(best, cur[j])
        prev = cur
    return best


def qa_f1(pred: str, answer: str) -> float:
    p = [t for t in _segment(pred) if t not in _PUNCT]
    a = [t for t in _segment(answer) if t not in _PUNCT]
    lcs = _lcs_len(p, a)
    if lcs == 0:
        return 0.0
    prec, rec = lcs / len(p), lcs / len(a)
    return 2 * prec * rec / (prec + rec)


def qa_metrics(preds: Sequence[str], answers: Sequence[Sequence[str]]) -> tuple[dict, dict]:
    """Exact match and F1, each the best over an example's reference answers, averaged over examples."""
    pairs = [(p, a) for p, a in zip(preds, answers) if a]
    if not pairs:
        return {}, {}
    em = sum(max(float(_strip_punct(p) == _strip_punct(x)) for x in a) for p, a in pairs) / len(pairs)
    f1 = sum(max(qa_f1(p, x) for x in a) for p, a in pairs) / len(pairs)
    return {"exact_match": em, "f1": f1}, {"scored": len(pairs), "unanswerable_skipped": len(preds) - len(pairs)}


# ---------------------------------------------------------------- MLM


def mlm_perplexity(
    model_dir, texts: Sequence[str], max_len: int = 128, mask_prob: float = 0.15, batch_size: int = 16, seed: int = 0
) -> dict:
    """Held-out masked-LM perplexity: exp(mean cross-entropy) on a fixed random 15% of tokens per text.

    The masking depends only on ``seed`` and the text's tokens, so two encoders with the same tokenizer are scored on
    the same positions. Encoders with different vocabularies (an extended one) are scored on their own tokens.
    """
    import torch
    from tqdm.auto import tqdm
    from transformers import AutoModelForMaskedLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(model_dir))
    model = AutoModelForMaskedLM.from_pretrained(str(model_dir))
    model.eval()
    from bertpipe.modelinfo import clamp_seq_len

    max_len = clamp_seq_len(max_len, model, "evaluate.mlm_max_seq_len", lambda m: print(m, file=sys.stderr))
    head = getattr(model, "cls", None) or getattr(model, "lm_head", None)  # BERT / RoBERTa-style MLM heads
    specials = set(tok.all_special_ids)
    gen = torch.Generator().manual_seed(seed)
    total_loss, total_tokens = 0.0, 0
    bar = tqdm(range(0, len(texts), batch_size), desc=f"perplexity {model_dir}", unit="batch", file=sys.stderr,
               leave=False)
    with torch.inference_mode():
        for i in bar:
            enc = tok(list(texts[i : i + batch_size]), truncation=True, max_length=max_len, padding=True,
                      return_tensors="pt")
            ids = enc["input_ids"]
            can = enc["attention_mask"].bool() & ~torch.isin(ids, torch.tensor(sorted(specials)))
            chosen = (torch.rand(ids.shape, generator=gen) < mask_prob) & can
            if not chosen.any():
                continue
            inputs = dict(enc)
            inputs["input_ids"] = torch.where(chosen, torch.full_like(ids, tok.mask_token_id), ids)
            if head is not None:  # the vocabulary projection only where a token is masked: most of the compute
                hidden = model.base_model(**inputs).last_hidden_state
                logits, target = head(hidden[chosen]), ids[chosen]
            else:
                logits, target = model(**inputs).logits[chosen], ids[chosen]
            loss = torch.nn.functional.cross_entropy(logits.float(), target, reduction="sum")
            total_loss += float(loss)
            total_tokens += int(chosen.sum())
            bar.set_postfix(tokens=total_tokens)
    mean = total_loss / max(total_tokens, 1)
    return {"loss": mean, "perplexity": math.exp(min(mean, 50.0)), "masked_tokens": total_tokens, "texts": len(texts)}
