"""How examples become features for a task head: classification honours the truncation strategy (head, tail,
head_tail, or windows aggregated per document); NER always runs on windows over the whole sentence, kept with its
whole-sentence pieces for stitching; QA uses doc-stride windows over the context."""

from __future__ import annotations

import sys
from collections import Counter
from dataclasses import dataclass, field

from bertpipe.lib.labelled import Example
from bertpipe.lib.training import qa as Q
from bertpipe.lib.training import tagging as T
from bertpipe.lib.training import windows as W
from bertpipe.lib.training.params import TaskParams, TrainParams


@dataclass
class Split:
    """A split's examples and features; ``pieces`` keeps NER's whole-sentence tokenisation for stitching."""

    examples: list[Example]
    feats: list[dict]
    pieces: list[W.Pieces] = field(default_factory=list)
    spans: list[list[tuple[int, int]]] = field(default_factory=list)  # NER: windows per example


def featurize(tok, exs: list[Example], p: TaskParams, tp: TrainParams, label2id: dict, counts: Counter, split: str
              ) -> Split:
    budget = tp.max_seq_len - W.n_specials(tok)
    feats: list[dict] = []
    if not exs:
        return Split(exs, feats)
    if p.type == "qa":
        feats = Q.qa_features(tok, exs, tp.max_seq_len, p.doc_stride, p.max_query_len, train=split == "train")
        counts[f"{split}_features"] = len(feats)
        return Split(exs, feats)
    if p.type == "pair_classification":
        enc = tok([e.text for e in exs], [e.text_pair for e in exs], truncation="longest_first",
                  max_length=tp.max_seq_len)
        for i, ex in enumerate(exs):
            f = {"input_ids": enc["input_ids"][i], "example": i, "labels": label2id[ex.label]}
            if "token_type_ids" in enc:
                f["token_type_ids"] = enc["token_type_ids"][i]
            feats.append(f)
        counts[f"{split}_features"] = len(feats)
        return Split(exs, feats)
    pieces = W.encode_pieces(tok, [e.text for e in exs])
    out = Split(exs, feats, pieces)
    for i, (ex, pc) in enumerate(zip(exs, pieces)):
        n = len(pc.ids)
        counts[f"{split}_long"] += n > budget
        if p.type == "ner":
            labels, lost = T.align_labels(pc.offsets, pc.word_ids, ex.spans, label2id, p.model_scheme,
                                          p.label_all_pieces)
            counts[f"{split}_spans_unaligned"] += lost
            wins = W.windows(n, budget, p.stride)
            out.spans.append(wins)
            for a, b in wins:
                feats.append({"input_ids": W.with_specials(tok, pc.ids[a:b]), "example": i,
                              "labels": [T.IGNORE] + labels[a:b] + [T.IGNORE]})
        elif p.truncation == "window":
            for a, b in W.windows(n, budget, p.stride):
                feats.append({"input_ids": W.with_specials(tok, pc.ids[a:b]), "example": i,
                              "labels": label2id[ex.label]})
        else:
            keep = W.truncate(n, budget, p.truncation, p.head_tokens)
            feats.append({"input_ids": W.with_specials(tok, [pc.ids[k] for k in keep]), "example": i,
                          "labels": label2id[ex.label]})
    counts[f"{split}_features"] = len(feats)
    return out


def describe(counts: Counter) -> None:
    if counts.get("tags_repaired"):
        print(f"[finetune] repaired {counts['tags_repaired']} invalid tag sequences", file=sys.stderr)
