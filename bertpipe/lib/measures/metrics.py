"""Task metrics: classification (scikit-learn), NER (seqeval, strict), QA (CMRC-style EM/F1).

Encoders are compared by NLL per masked character in ``fair_mlm`` (per-token perplexity is not comparable across
vocabularies).

Each scorer returns ``(flat, details)``: ``flat`` maps metric name -> float in [0, 1] (what tables and MLflow show),
``details`` holds per-class breakdowns and confusion matrices.
"""

from __future__ import annotations

import re
import string
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
