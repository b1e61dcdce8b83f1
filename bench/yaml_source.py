"""A YAML document with the line of every key, so errors can say `file:line`.

`load_yaml_with_lines(text)` returns the data and a map from each key path
(`("cluster", "decode", "engine", "num_gpu_blocks")`, list items by index)
to its 1-based line. `line_of(lines, path)` answers for the longest prefix
of `path` the document has, so an error about a key the user did not write
(a missing one, or a default) points at its parent.
"""

from __future__ import annotations

from typing import Any

import yaml

from .bounded_yaml import compose_bounded, construct, safe_load_bounded

Path_ = tuple[Any, ...]


def load_yaml_with_lines(text: str) -> tuple[Any, dict[Path_, int]]:
    """Parse one YAML document (safe loader, within `bounded_yaml`'s bounds)
    and map key paths to lines."""
    node = compose_bounded(text)
    data = construct(node)
    lines: dict[Path_, int] = {}
    if node is not None:
        _walk(node, (), lines)
    return data, lines


def _walk(node: yaml.Node, path: Path_, lines: dict[Path_, int]) -> None:
    lines.setdefault(path, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            key = _scalar(key_node)
            sub = (*path, key)
            lines[sub] = key_node.start_mark.line + 1
            _walk(value_node, sub, lines)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            _walk(item, (*path, i), lines)


def _scalar(node: yaml.Node) -> Any:
    if isinstance(node, yaml.ScalarNode):
        return node.value if node.tag.endswith(":str") else safe_load_bounded(node.value)
    return None


def line_of(lines: dict[Path_, int], path: Path_) -> int | None:
    """The line of `path`, or of its longest prefix present in the document."""
    for n in range(len(path), 0, -1):
        line = lines.get(tuple(path[:n]))
        if line is not None:
            return line
    return None


def find_control_characters(data: Any, path: Path_ = ()) -> tuple[Path_, str] | None:
    """The first string (key or value) holding a NUL or another control
    character other than tab/newline/CR, with its path. Such bytes end up in
    file names, logs and HTML, where they break things after the run."""
    if isinstance(data, str):
        bad = next((c for c in data if (ord(c) < 32 and c not in "\t\n\r") or ord(c) == 127), None)
        return (path, bad) if bad is not None else None
    if isinstance(data, dict):
        for k, v in data.items():
            hit = find_control_characters(k, (*path, k)) or find_control_characters(v, (*path, k))
            if hit:
                return hit
    elif isinstance(data, list):
        for i, v in enumerate(data):
            hit = find_control_characters(v, (*path, i))
            if hit:
                return hit
    return None
