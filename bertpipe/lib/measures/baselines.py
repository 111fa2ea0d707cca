"""Baselines every finetuned model must beat to be worth anything, trained on the task's train split and scored on
its test split with the same metric functions the finetuned models are scored with.

- classification: ``majority`` (always the most frequent train label) and ``tfidf`` (character 1–2-gram TF-IDF +
  logistic regression, scikit-learn; seconds on CPU);
- NER: ``majority`` (everything ``O``: no entities) and ``lexicon`` (the train split's entity strings, longest match
  first, keeping only strings that are entities most of the times they occur in train text);
- QA: none.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Sequence

from bertpipe.lib.measures import metrics as M
from bertpipe.lib.training import tagging as T

TFIDF = {"analyzer": "char", "ngram_range": (1, 2), "min_df": 2, "max_features": 200_000, "sublinear_tf": True}
PAIR_SEP = " ‖ "  # joins text and text_pair for the pair-classification baseline


def _input(ex) -> str:
    return ex.text if ex.text_pair is None else ex.text + PAIR_SEP + ex.text_pair


def _labels(train: Sequence, test: Sequence, labels: Sequence[str] | None) -> list[str]:
    seen = {ex.label for ex in list(train) + list(test) if ex.label is not None}
    return list(labels or []) + sorted(seen - set(labels or []))


def majority_predictions(train: Sequence, test: Sequence) -> list[str]:
    counts = Counter(ex.label for ex in train)
    top = min(counts.items(), key=lambda kv: (-kv[1], kv[0]))[0]  # ties: the alphabetically first label
    return [top] * len(test)


def tfidf_predictions(train: Sequence, test: Sequence, seed: int = 0) -> list[str]:
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression

    y = [ex.label for ex in train]
    if len(set(y)) < 2:
        return majority_predictions(train, test)
    vec = TfidfVectorizer(**({**TFIDF, "min_df": 1} if len(train) < 50 else TFIDF))
    x = vec.fit_transform([_input(ex) for ex in train])
    clf = LogisticRegression(max_iter=2000, C=10.0, random_state=seed)
    clf.fit(x, y)
    return [str(p) for p in clf.predict(vec.transform([_input(ex) for ex in test]))]


def _classification(train: Sequence, test: Sequence, labels: Sequence[str] | None) -> dict[str, tuple[dict, dict]]:
    gold = [ex.label for ex in test]
    labs = _labels(train, test, labels)
    preds = {"majority": majority_predictions(train, test), "tfidf": tfidf_predictions(train, test)}
    return {name: M.classification_metrics(gold, pred, labs) for name, pred in preds.items()}


# ---------------------------------------------------------------- NER


class Lexicon:
    """Entity strings seen in train, matched longest-first left to right over a text."""

    def __init__(self, entries: dict[str, str]):
        self.entries = entries
        self.max_len = max((len(s) for s in entries), default=0)

    def match(self, text: str) -> list[tuple[int, int, str]]:
        out, i = [], 0
        while i < len(text):
            for n in range(min(self.max_len, len(text) - i), 0, -1):
                t = self.entries.get(text[i : i + n])
                if t is not None:
                    out.append((i, i + n, t))
                    i += n
                    break
            else:
                i += 1
        return out

    @classmethod
    def from_train(cls, train: Sequence, min_precision: float = 0.5) -> Lexicon:
        types: dict[str, Counter] = defaultdict(Counter)
        for ex in train:
            for a, b, t in ex.spans:
                if ex.text[a:b].strip():
                    types[ex.text[a:b]][t] += 1
        lex = cls({s: c.most_common(1)[0][0] for s, c in types.items()})
        # Matching train text with the full lexicon tells which strings are usually *not* entities (a one-character
        # place abbreviation inside ordinary words): those are dropped, once.
        hits, right = Counter(), Counter()
        for ex in train:
            gold = {tuple(s) for s in ex.spans}
            for a, b, t in lex.match(ex.text):
                hits[ex.text[a:b]] += 1
                right[ex.text[a:b]] += (a, b, t) in gold
        return cls({s: t for s, t in lex.entries.items() if hits[s] and right[s] / hits[s] >= min_precision})


def _units(ex) -> list[tuple[int, int]]:
    """The units seqeval scores on: the example's own tokens, or (jsonl spans) its non-space characters."""
    return [tuple(u) for u in ex.units] or [(i, i + 1) for i, ch in enumerate(ex.text) if not ch.isspace()]


def _ner_scored(test: Sequence, pred_spans: Sequence[Sequence[tuple[int, int, str]]]) -> tuple[dict, dict]:
    gold_tags, pred_tags = [], []
    for ex, pred in zip(test, pred_spans):
        units = _units(ex)
        gold_tags.append(T.spans_to_unit_tags(units, ex.spans))
        pred_tags.append(T.spans_to_unit_tags(units, pred))
    flat, details = M.ner_metrics(gold_tags, pred_tags)
    return {k: flat.get(k, 0.0) for k in ("precision", "recall", "f1")} | flat, details


def ner_scores(test: Sequence, pred_spans: Sequence[Sequence[tuple[int, int, str]]]) -> dict:
    return _ner_scored(test, pred_spans)[0]


def _ner(train: Sequence, test: Sequence) -> dict[str, tuple[dict, dict]]:
    lex = Lexicon.from_train(train)
    return {"majority": _ner_scored(test, [[] for _ in test]),
            "lexicon": _ner_scored(test, [lex.match(ex.text) for ex in test])}


def class_scores(details: dict) -> dict[str, dict]:
    """{class or entity type: {"precision", "recall", "f1", "support"}} from the details of
    ``metrics.classification_metrics`` / ``ner_metrics``, for the classes the scored split holds."""
    per = details.get("per_class") or details.get("per_type") or {}
    return {c: v for c, v in per.items() if v["support"]}


def scored_baselines(task_type: str, splits: dict[str, list], labels: Sequence[str] | None = None
                     ) -> dict[str, tuple[dict, dict]]:
    """{baseline name: ({metric: value}, details)} on the test split, details as the metric functions give them
    ({} when the task type has none or test is empty)."""
    train, test = splits.get("train", []), splits.get("test", [])
    if not train or not test:
        return {}
    if task_type in ("classification", "pair_classification"):
        return _classification(train, test, labels)
    if task_type == "ner":
        return _ner(train, test)
    return {}


def task_baselines(task_type: str, splits: dict[str, list], labels: Sequence[str] | None = None) -> dict:
    """{baseline name: {metric: value}} on the test split ({} when the task type has none or test is empty)."""
    return {name: flat for name, (flat, _) in scored_baselines(task_type, splits, labels).items()}
