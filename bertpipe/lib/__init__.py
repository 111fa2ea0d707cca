"""Shared libraries and domain helpers (training, inference, measures, corpora, model facts): what stages compute
with."""
