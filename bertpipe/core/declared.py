"""What a stage package declares about itself: its stage families and the params sections it owns.

Each stage package has a ``declare.py`` holding one ``Family`` per ``bertpipe <command>`` it adds (the prepare
package: ``prepare``; the pretrain package: ``base`` and ``pretrain``). The graph (``bertpipe.graph.pipeline``) is the
ordered list of these families; the CLI's commands, the Prefect flow, dvc.yaml, the params model and the
import-linter contracts all follow that list, so adding a leaf stage is its package plus one line there.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from pydantic import BaseModel

from bertpipe.core.stage import Stage
from bertpipe.infra.config import Config


@dataclass(frozen=True)
class Family:
    """One entry of the graph: a stage family, its `bertpipe <name>` command (help; for a fanned-out family the
    Stage identity fields its options select by: --task, --encoder, --model) and its stages in a config."""

    name: str
    help: str
    make: Callable[[Config], list[Stage]]  # this family's stages for the config (none: not in this pipeline)
    selectors: tuple[str, ...] = ()
    # The params.yaml sections this family owns, {section: pydantic model}; the graph composes them into one model.
    params: dict[str, type[BaseModel]] = field(default_factory=dict)
    # Adjusts the validated params once loaded (prepare: files in flow.drop_dir join the domain sources).
    on_load: Callable[[Any, Path, str], Any] | None = None

    @property
    def package(self) -> str:
        """The stage package declaring it (where ``make`` is defined), e.g. ``bertpipe.stages.finetune``."""
        return self.make.__module__.rpartition(".")[0]
