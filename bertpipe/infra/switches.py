"""Settings written as words that YAML 1.1 also reads as booleans.

PyYAML (YAML 1.1) reads an unquoted ``on``/``off`` (and ``yes``/``no``, ``true``/``false``) as true/false, so
``compile: on`` in a params file arrives as ``True``. A setting whose words include ``on`` and ``off`` takes the
boolean as the word written: one annotated type every params model uses, so base, pretrain, finetune and distill
read it alike. Light on purpose (no torch): the params models load in every door.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BeforeValidator


def on_off(value: Any) -> Any:
    """``True`` -> ``"on"``, ``False`` -> ``"off"``; anything else unchanged (the Literal then validates it)."""
    return {True: "on", False: "off"}[value] if isinstance(value, bool) else value


# torch.compile of a model: on, off, or auto (bertpipe.infra.execution.should_compile decides what auto means)
CompileSetting = Annotated[Literal["auto", "on", "off"], BeforeValidator(on_off)]

# the attention kernel that keeps each token to its own document: auto, mask, varlen or flex
# (bertpipe.infra.attention.choose decides what auto means)
AttentionSetting = Literal["auto", "mask", "varlen", "flex"]
