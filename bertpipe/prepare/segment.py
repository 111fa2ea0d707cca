"""Sentence segmentation: the one splitter lives in ``bertpipe.textseg`` (re-exported here for old imports)."""

from bertpipe.textseg import split_sentences  # noqa: F401
