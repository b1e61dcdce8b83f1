"""YAML with bounds: what a scenario file or a `--set` value may cost to load.

PyYAML's safe loader builds whatever a document describes. A ~1 KB document
of nested aliases ("billion laughs") expands to gigabytes; nesting 10k
levels deep overflows its recursive composer (a RecursionError, reported
as a bug); a 5,000-digit integer trips Python's int-conversion limit; a
duplicate key silently wins (issue 34). This loader refuses each of these
with a `yaml.YAMLError` naming the line, before building anything big:

- nesting deeper than `MAX_DEPTH`, found from the parser's event stream
  (iterative, so depth costs nothing to measure);
- aliases whose expansion exceeds `MAX_EXPANSION` times the nodes written
  (measured on the composed graph, where an alias is one shared node);
- integers longer than `MAX_INT_DIGITS` digits;
- a key given twice in one mapping.
"""

from __future__ import annotations

from typing import Any

import yaml

MAX_DEPTH = 64
MAX_EXPANSION = 10
MAX_INT_DIGITS = 100


class BoundError(yaml.YAMLError):
    """A document past one of the bounds; `problem_mark` says where, as PyYAML's errors do."""

    def __init__(self, problem: str, mark: yaml.Mark | None) -> None:
        super().__init__(problem)
        self.problem = problem
        self.problem_mark = mark


class _BoundedLoader(yaml.SafeLoader):
    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if isinstance(key_node, yaml.ScalarNode):
                key = (key_node.tag, key_node.value)
                if key in seen:
                    raise BoundError(
                        f"key {key_node.value[:40]!r} given twice in one mapping; allowed: each key once",
                        key_node.start_mark,
                    )
                seen.add(key)
        return super().construct_mapping(node, deep=deep)

    def construct_yaml_int(self, node: yaml.ScalarNode) -> int:
        digits = sum(c.isalnum() for c in node.value)
        if digits > MAX_INT_DIGITS:
            raise BoundError(f"an integer of {digits} digits; allowed: at most {MAX_INT_DIGITS}", node.start_mark)
        return super().construct_yaml_int(node)


_BoundedLoader.add_constructor("tag:yaml.org,2002:int", _BoundedLoader.construct_yaml_int)


def _check_depth(text: str) -> None:
    depth = 0
    for event in yaml.parse(text, Loader=yaml.SafeLoader):
        if isinstance(event, yaml.CollectionStartEvent):
            depth += 1
            if depth > MAX_DEPTH:
                problem = f"nested deeper than {MAX_DEPTH} levels; allowed: at most {MAX_DEPTH}"
                raise BoundError(problem, event.start_mark)
        elif isinstance(event, yaml.CollectionEndEvent):
            depth -= 1


def _check_expansion(root: yaml.Node) -> None:
    """Count the nodes written (each once) and the nodes the data would
    hold (an alias counted as its whole target), without expanding."""
    expanded: dict[int, int] = {}

    def size(node: yaml.Node) -> int:  # depth is bounded by MAX_DEPTH: recursion is safe
        known = expanded.get(id(node))
        if known is not None:
            return known
        total = 1
        if isinstance(node, yaml.MappingNode):
            total += sum(size(k) + size(v) for k, v in node.value)
        elif isinstance(node, yaml.SequenceNode):
            total += sum(size(item) for item in node.value)
        expanded[id(node)] = total
        return total

    full = size(root)
    written = len(expanded)
    if full > MAX_EXPANSION * written + 100:
        raise BoundError(
            f"aliases expand {written} nodes to {full}; allowed: at most {MAX_EXPANSION}x the nodes written",
            root.start_mark,
        )


def compose_bounded(text: str) -> yaml.Node | None:
    """The document's node graph, after the depth and expansion checks."""
    _check_depth(text)
    node = yaml.compose(text, Loader=_BoundedLoader)
    if node is not None:
        _check_expansion(node)
    return node


def construct(node: yaml.Node | None) -> Any:
    """The data of a node from `compose_bounded` (duplicate keys and huge integers refused)."""
    if node is None:
        return None
    loader = _BoundedLoader("")
    try:
        return loader.construct_document(node)
    finally:
        loader.dispose()


def safe_load_bounded(text: str) -> Any:
    """`yaml.safe_load`, within the bounds above."""
    return construct(compose_bounded(text))
