"""Extractive QA: question+context windows with the usual doc stride, start/end targets, and n-best span search."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from bertpipe.lib.labelled import Example


def _cap_question(tokenizer, question: str, max_query_len: int) -> str:
    enc = tokenizer(question, add_special_tokens=False, return_offsets_mapping=True)
    if len(enc["input_ids"]) <= max_query_len:
        return question
    return question[: enc["offset_mapping"][max_query_len - 1][1]]


def qa_features(
    tokenizer, examples: Sequence[Example], max_len: int, doc_stride: int, max_query_len: int, train: bool
) -> list[dict]:
    """One feature per window: input ids, token types, context offsets (None outside the context), and for training
    the start/end token of the first answer ([CLS] when the answer is not wholly inside the window)."""
    questions = [_cap_question(tokenizer, ex.question or "", max_query_len) for ex in examples]
    overlap = max(0, min(doc_stride, max_len - max_query_len - 4))  # the tokenizer rejects an overlap >= the window
    enc = tokenizer(
        questions,
        [ex.text for ex in examples],
        truncation="only_second",
        max_length=max_len,
        stride=overlap,
        return_overflowing_tokens=True,
        return_offsets_mapping=True,
    )
    feats = []
    for i in range(len(enc["input_ids"])):
        ex_i = enc["overflow_to_sample_mapping"][i]
        seq = enc.sequence_ids(i)
        offsets = [tuple(o) if s == 1 else None for o, s in zip(enc["offset_mapping"][i], seq)]
        f = {"input_ids": enc["input_ids"][i], "example": ex_i, "offsets": offsets}
        if "token_type_ids" in enc:
            f["token_type_ids"] = enc["token_type_ids"][i]
        if train:
            start_tok = end_tok = 0
            answers = examples[ex_i].answers
            if answers:
                text, a = answers[0]
                b = a + len(text)
                ctx = [j for j, o in enumerate(offsets) if o is not None]
                if ctx and offsets[ctx[0]][0] <= a and offsets[ctx[-1]][1] >= b:
                    start_tok = next(j for j in ctx if offsets[j][1] > a)
                    end_tok = next(j for j in reversed(ctx) if offsets[j][0] < b)
            f["start_positions"], f["end_positions"] = start_tok, end_tok
        feats.append(f)
    return feats


def best_spans(
    examples: Sequence[Example],
    feats: Sequence[dict],
    start_logits: Sequence[np.ndarray],
    end_logits: Sequence[np.ndarray],
    n_best: int = 20,
    max_answer_len: int = 30,
) -> list[dict]:
    """The best answer per example over all its windows: the top ``n_best`` starts x ends inside the context with
    ``start <= end`` and at most ``max_answer_len`` tokens, scored by start + end logit."""
    best: list[dict] = [{"text": "", "start": -1, "score": float("-inf")} for _ in examples]
    for f, sl, el in zip(feats, start_logits, end_logits):
        ex = examples[f["example"]]
        offsets = f["offsets"]
        n = len(offsets)
        starts = np.argsort(sl[:n])[::-1][:n_best]
        ends = np.argsort(el[:n])[::-1][:n_best]
        for s in starts:
            if offsets[s] is None:
                continue
            for e in ends:
                if offsets[e] is None or e < s or e - s + 1 > max_answer_len:
                    continue
                score = float(sl[s] + el[e])
                cur = best[f["example"]]
                if score > cur["score"]:
                    a, b = offsets[s][0], offsets[e][1]
                    best[f["example"]] = {"text": ex.text[a:b], "start": a, "score": score}
    return best
