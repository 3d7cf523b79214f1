"""Bounded YAML: what attnflow reads from config files, sweep files and ``--set`` values.

:func:`load_yaml` is ``yaml.safe_load`` with limits, so that no input can hang or exhaust the
machine: at most :data:`MAX_BYTES` of text, :data:`MAX_DEPTH` levels of nesting and
:data:`MAX_NODES` values once aliases are expanded (an "alias bomb" of nine nested anchors
expands to a billion strings from a few hundred bytes), and no alias cycle (``a: &a [*a]``). Duplicate keys in a mapping are refused
instead of silently keeping the last one. :func:`excerpt` shortens any value for an error message.
"""

from __future__ import annotations

import reprlib
from typing import Any

import yaml
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from attnflow.config.errors import ConfigError
from attnflow.core.errors import UnsafeInputError

#: Largest YAML document read (bytes of text); configs and sweep files are a few kB.
MAX_BYTES = 1_000_000
#: Deepest nesting of mappings and lists; a config has four levels.
MAX_DEPTH = 64
#: Most values in a document with every alias expanded.
MAX_NODES = 200_000
#: Longest excerpt of a value echoed in an error message (characters).
EXCERPT_CHARS = 80


class YAMLLimitError(ConfigError, UnsafeInputError):
    """A YAML document beyond the limits of this module (size, depth, alias expansion, duplicate keys)."""


class _BoundedLoader(yaml.SafeLoader):
    """``SafeLoader`` that tracks nesting depth while composing and refuses duplicate keys."""

    def __init__(self, stream: str):
        super().__init__(stream)
        self._depth = 0

    def compose_node(self, parent: Node | None, index: Any) -> Node:
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                mark = self.peek_event().start_mark
                raise YAMLLimitError(
                    f"it is nested more than {MAX_DEPTH} levels deep (at line {mark.line + 1}); a config is a few "
                    "levels deep"
                )
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict:
        seen: dict[Any, Any] = {}
        for key_node, _ in node.value:
            if isinstance(key_node, ScalarNode):
                key = self.construct_scalar(key_node)
                if key in seen:
                    raise YAMLLimitError(
                        f"the key {excerpt(key)} appears twice in one mapping (lines {seen[key] + 1} and "
                        f"{key_node.start_mark.line + 1}); keep one"
                    )
                seen[key] = key_node.start_mark.line
        return super().construct_mapping(node, deep=deep)


def _expanded_size(root: Node) -> int:
    """Number of values in ``root`` with aliases expanded (memoised per node, stops past the limit).

    A node that contains itself through an alias (``a: &a [*a]``, 12 bytes that expand forever) is
    refused with :class:`YAMLLimitError`: the nodes on the current path are tracked, so a cycle is
    seen the moment it closes, before anything grows."""
    memo: dict[int, int] = {}
    on_path: set[int] = set()
    stack: list[tuple[Node, bool]] = [(root, False)]
    while stack:
        node, ready = stack.pop()
        if id(node) in memo:
            continue
        children: list[Node] = []
        if isinstance(node, SequenceNode):
            children = list(node.value)
        elif isinstance(node, MappingNode):
            children = [n for pair in node.value for n in pair]
        if not ready:
            on_path.add(id(node))
            stack.append((node, True))
            for c in children:
                if id(c) in on_path:
                    line = c.start_mark.line + 1 if c.start_mark is not None else "?"
                    raise YAMLLimitError(
                        f"an alias refers to a value that contains it (a cycle, at line {line}); it would expand "
                        "forever. Write the values out"
                    )
                if id(c) not in memo:
                    stack.append((c, False))
            continue
        on_path.discard(id(node))
        total = 1
        for c in children:
            total += memo.get(id(c), 1)
            if total > MAX_NODES:
                break
        memo[id(node)] = min(total, MAX_NODES + 1)
    return memo[id(root)]


def load_yaml(text: str) -> Any:
    """Parse one YAML document within the limits; raises :class:`YAMLLimitError` or ``yaml.YAMLError``.

    Callers put the source (file name, ``--set`` item) in front of the message.
    """
    if len(text) > MAX_BYTES:
        raise YAMLLimitError(f"it is {len(text):,} characters long, more than the {MAX_BYTES:,} a YAML input may have")
    loader = _BoundedLoader(text)
    try:
        try:
            node = loader.get_single_node()
        except RecursionError:
            raise YAMLLimitError(f"it is nested more than {MAX_DEPTH} levels deep") from None
        if node is None:
            return None
        if _expanded_size(node) > MAX_NODES:
            raise YAMLLimitError(
                f"its aliases expand to more than {MAX_NODES:,} values (an alias bomb?); write the values out"
            )
        return loader.construct_document(node)
    finally:
        loader.dispose()


_repr = reprlib.Repr()
_repr.maxstring = EXCERPT_CHARS
_repr.maxother = EXCERPT_CHARS
_repr.maxlist = _repr.maxtuple = _repr.maxdict = _repr.maxset = 6
_repr.maxlevel = 3
_repr.maxlong = 40


def excerpt(value: Any, limit: int = EXCERPT_CHARS) -> str:
    """A short ``repr`` of ``value`` for an error message: at most ``limit`` characters, any size or depth."""
    try:
        text = _repr.repr(value)
    except Exception:  # a value whose repr fails is still named
        text = f"<{type(value).__name__}>"
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."
