"""Placeholder: the pretrain stage's build lands with its issue."""

from bertpipe.errors import BertpipeError

VERSION = "0"


def own_inputs(cfg):
    return {}


def build(ctx):
    raise BertpipeError("the pretrain stage is not implemented yet")
