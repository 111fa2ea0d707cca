"""Whole-word ids for tokenised text: the one implementation lives in ``bertpipe.textseg`` (shared by vocab,
pretraining and evaluation); re-exported here for the vocab stage's imports."""

from bertpipe.textseg import _jieba, _UnionFind, _word_index, jieba_spans, tokenize_with_words  # noqa: F401
