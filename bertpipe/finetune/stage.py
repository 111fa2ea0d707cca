"""Placeholder: the finetune stage's build lands with its issue."""

from bertpipe.errors import BertpipeError

VERSION = "0"


def own_inputs(cfg, task):
    return {}


def build(ctx, task, encoder):
    raise BertpipeError("the finetune stage is not implemented yet")
