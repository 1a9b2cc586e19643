"""YAML read within limits checked before anything is expanded, so a small file cannot take all memory."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import yaml


@dataclass(frozen=True)
class YamlLimits:
    """What a config may hold (a sweep or grid config is a few kilobytes)."""

    max_bytes: int = 1 << 20  # the text itself
    max_nodes: int = 100_000  # scalars, lists and mappings, every alias expanded
    max_chars: int = 2 << 20  # characters of all scalars, every alias expanded
    max_string: int = 10_000  # characters of one scalar
    max_depth: int = 64  # lists and mappings inside each other


LIMITS = YamlLimits()


class YamlLimitError(ValueError):
    """A YAML document over a limit, or not readable as YAML; the message says which."""


def load_bounded(text: str, source: str = "<yaml>", limits: YamlLimits = LIMITS) -> Any:
    """``yaml.safe_load`` of ``text``; :class:`YamlLimitError` naming ``source`` when over ``limits`` or not YAML."""
    size = len(text.encode("utf-8", errors="replace"))
    if size > limits.max_bytes:
        raise YamlLimitError(f"{source}: {size:,} bytes; a config may have at most "
                             f"{limits.max_bytes:,}")
    loader = yaml.SafeLoader(text)
    try:
        _check_events(text, source, limits)
        node = loader.get_single_node()
        if node is None:
            return None
        _Counter(source, limits).count(node)
        return loader.construct_document(node)
    except yaml.YAMLError as err:
        raise YamlLimitError(f"{source}: invalid YAML: {' '.join(str(err).split())}") from None
    except (ValueError, RecursionError) as err:  # an integer of 5,000 digits, ...
        if isinstance(err, YamlLimitError):
            raise
        raise YamlLimitError(f"{source}: cannot read the YAML: {type(err).__name__}: "
                             f"{str(err).splitlines()[0] if str(err) else ''}") from None
    finally:
        loader.dispose()


def _check_events(text: str, source: str, limits: YamlLimits) -> None:
    """Nesting depth from the parser's events, before the (recursive) composer runs."""
    depth = 0
    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        if isinstance(event, (yaml.SequenceStartEvent, yaml.MappingStartEvent)):
            depth += 1
            if depth > limits.max_depth:
                raise YamlLimitError(f"{source}: lists and mappings nested more than "
                                     f"{limits.max_depth} deep (line {_line(event)})")
        elif isinstance(event, (yaml.SequenceEndEvent, yaml.MappingEndEvent)):
            depth -= 1


def _line(item: Any) -> int:
    mark = getattr(item, "start_mark", None)
    return mark.line + 1 if mark is not None else 0


class _Counter:
    """Nodes and characters a node stands for, aliases expanded (each distinct node walked once)."""

    def __init__(self, source: str, limits: YamlLimits) -> None:
        self.source, self.limits = source, limits
        self.sizes: dict[int, tuple[int, int]] = {}
        self.open: set[int] = set()

    def count(self, node: yaml.Node) -> tuple[int, int]:
        key = id(node)
        if key in self.sizes:
            return self.sizes[key]
        if key in self.open:
            raise YamlLimitError(f"{self.source}: line {_line(node)}: an alias refers to a node "
                                 "that contains it (a recursive value)")
        if isinstance(node, yaml.ScalarNode):
            chars = len(node.value)
            if chars > self.limits.max_string:
                raise YamlLimitError(f"{self.source}: line {_line(node)}: a value of {chars:,} "
                                     f"characters; at most {self.limits.max_string:,} are allowed")
            size = (1, chars)
        else:
            self.open.add(key)
            children = ([item for pair in node.value for item in pair]
                        if isinstance(node, yaml.MappingNode) else node.value)
            nodes, chars = 1, 0
            for child in children:
                child_nodes, child_chars = self.count(child)
                nodes, chars = nodes + child_nodes, chars + child_chars
                self._check(node, nodes, chars)
            self.open.discard(key)
            size = (nodes, chars)
        self._check(node, *size)
        self.sizes[key] = size
        return size

    def _check(self, node: yaml.Node, nodes: int, chars: int) -> None:
        limits = self.limits
        for count, limit, what in ((nodes, limits.max_nodes, "items"), (chars, limits.max_chars, "characters")):
            if count > limit:
                raise YamlLimitError(f"{self.source}: line {_line(node)}: the value stands for more than {limit:,} "
                                     f"{what} once its aliases (*name) are expanded; a config may not grow that much "
                                     "(an alias bomb?)")
