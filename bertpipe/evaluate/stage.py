"""Placeholder: the evaluate stage's build lands with its issue."""

from bertpipe.errors import BertpipeError

VERSION = "0"


def own_inputs(cfg):
    return {}


def build(ctx):
    raise BertpipeError("the evaluate stage is not implemented yet")
