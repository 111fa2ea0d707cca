"""The one loader for YAML a user hands bertpipe (params.yaml with its profiles, an own-domain params file).

``yaml.safe_load`` accepts things a configuration must not mean silently, and some it cannot survive:
- a duplicate key: last-wins, so half of what the user wrote is ignored;
- a top-level ``false``, ``0`` or ``[]``: callers doing ``safe_load(...) or {}`` read it as "all defaults";
- aliases: a few hundred bytes of nested anchors (a "billion laughs") load as a small shared graph, but every
  consumer that copies or validates it (deepcopy, pydantic, model_dump) expands it: gigabytes;
- deep nesting: the composer recurses per level, so a few hundred levels end in a RecursionError traceback.
Each is refused here with one ``<file>:<line>: ...`` BertpipeError. The limits are far above what a params file
needs (sections nest a handful of levels; the bundled params files use no aliases).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from yaml.composer import ComposerError
from yaml.events import AliasEvent, MappingStartEvent, SequenceStartEvent
from yaml.nodes import MappingNode, Node, SequenceNode

from bertpipe.infra.errors import BertpipeError, utf8_error

MAX_DEPTH = 64  # nesting levels (mappings + sequences)
MAX_ALIASES = 100  # `*name` references in one document
MAX_NODES = 200_000  # scalars + collections once every alias is expanded


class _Refused(Exception):
    def __init__(self, line: int | None, message: str):
        super().__init__(message)
        self.line, self.message = line, message


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that bounds depth and alias count while composing and refuses duplicate keys when constructing."""

    def __init__(self, stream):
        super().__init__(stream)
        self._depth = 0
        self._aliases = 0

    def compose_node(self, parent, index):
        event = self.peek_event()
        if isinstance(event, AliasEvent):
            self._aliases += 1
            if self._aliases > MAX_ALIASES:
                raise _Refused(event.start_mark.line + 1,
                               f"more than {MAX_ALIASES} aliases (*{event.anchor}); aliases that expand this much "
                               "are refused (a YAML alias bomb?)")
            return super().compose_node(parent, index)
        nests = isinstance(event, (MappingStartEvent, SequenceStartEvent))
        if nests:
            self._depth += 1
            if self._depth > MAX_DEPTH:
                raise _Refused(event.start_mark.line + 1, f"nested deeper than {MAX_DEPTH} levels")
        try:
            return super().compose_node(parent, index)
        finally:
            if nests:
                self._depth -= 1

    def construct_mapping(self, node, deep=False):
        if isinstance(node, MappingNode):
            # Explicit keys only: a key from a `<<: *base` merge may be overridden, that is what merges are for.
            seen: dict[Any, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=True)
                try:
                    first = seen.get(key)
                except TypeError:  # an unhashable key: SafeConstructor names it below
                    continue
                if first is not None:
                    raise _Refused(key_node.start_mark.line + 1,
                                   f"duplicate key {key!r} (first at line {first}); keep one of them")
                seen[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep=deep)


def _expanded_size(node: Node) -> int:
    """How many nodes the document has once aliases are expanded (an alias is the same Node object again)."""
    memo: dict[int, int] = {}
    order, stack = [], [node]
    while stack:  # iterative post-order: depth is bounded already, but recursion is not needed
        n = stack.pop()
        if id(n) in memo:
            continue
        memo[id(n)] = -1
        order.append(n)
        for child in _children(n):
            if id(child) not in memo:
                stack.append(child)
    for n in reversed(order):
        memo[id(n)] = 1 + sum(memo[id(c)] for c in _children(n))
        if memo[id(n)] > MAX_NODES:
            return memo[id(n)]
    return memo[id(node)]


def _children(n: Node) -> list[Node]:
    if isinstance(n, SequenceNode):
        return list(n.value)
    if isinstance(n, MappingNode):
        return [x for pair in n.value for x in pair]
    return []


def load_yaml_text(text: str, source: str) -> Any:
    """The single document of ``text`` (None when empty), or one BertpipeError naming ``source`` and the line."""
    loader = _StrictLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        size = _expanded_size(node)
        if size > MAX_NODES:
            raise _Refused(None, f"expands to more than {MAX_NODES:,} values through its aliases; refused "
                                 "(a YAML alias bomb?)")
        return loader.construct_document(node)
    except _Refused as e:
        where = f":{e.line}" if e.line else ""
        raise BertpipeError(f"{source}{where}: {e.message}") from None
    except (ComposerError, yaml.YAMLError) as e:
        mark = getattr(e, "problem_mark", None)
        where = f":{mark.line + 1}" if mark is not None else ""
        raise BertpipeError(f"{source}{where}: not valid YAML ({getattr(e, 'problem', None) or e})") from None
    except RecursionError:  # belt and braces: MAX_DEPTH stops nesting long before this
        raise BertpipeError(f"{source}: nested too deeply") from None
    finally:
        loader.dispose()


def load_yaml_mapping(path: Path, what: str = "a mapping of sections") -> dict:
    """A user's YAML file that must hold a mapping at the top level: {} when empty, else the mapping, else one
    BertpipeError (``false``, ``0``, ``[]`` and a bare string are refused, not read as "all defaults")."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise utf8_error(path, e) from None
    except OSError as e:
        raise BertpipeError(f"{path}: cannot read the params file ({e.strerror or e})") from None
    data = load_yaml_text(text, str(path))
    if data is None:
        return {}
    if not isinstance(data, dict):
        got = repr(data) if len(repr(data)) <= 40 else type(data).__name__
        raise BertpipeError(f"{path}: expected {what} at the top level (got {got})")
    return data
