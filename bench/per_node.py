"""Per-node figures of a result: `variant@node`.

A results JSON sums its counters over nodes (and takes the max of peaks);
each node's own counters are under `nodes` and its step aggregates under
`steps_per_node`. With two decode nodes the totals can hide that one of
them does all the preempting, so thresholds can name a node
(`num_preemptions[fixed@decode-1] == 0`) and the table can show a column
per node (`--by-node`). A node has no serving metrics of its own (TTFT and
throughput are the client's), only counters and step aggregates.
"""

from __future__ import annotations

from collections.abc import Sequence

SEP = "@"


def split_variant(text: str) -> tuple[str, str | None]:
    """`fixed@decode-1` -> ("fixed", "decode-1"); `fixed` -> ("fixed", None)."""
    variant, sep, node = text.partition(SEP)
    return (variant, node) if sep else (text, None)


def node_names(results: Sequence[dict]) -> list[str]:
    """Every node named in these results, in name order."""
    return sorted({n for r in results for n in (r.get("nodes") or {})} | _step_nodes(results))


def _step_nodes(results: Sequence[dict]) -> set[str]:
    return {n for r in results for n in (r.get("steps_per_node") or {})}


def node_view(result: dict, node: str) -> dict | None:
    """The node's counters and step aggregates as one flat result, or None
    when the run had no such node."""
    counters = (result.get("nodes") or {}).get(node)
    steps = (result.get("steps_per_node") or {}).get(node)
    if counters is None and steps is None:
        return None
    return {**(steps or {}), **(counters or {}), "variant": result["variant"], "repeat": result["repeat"]}


def by_node_results(results: Sequence[dict]) -> list[dict]:
    """A pseudo-result per node of every result, its variant `variant@node`."""
    out = []
    for r in results:
        for node in node_names([r]):
            view = node_view(r, node)
            if view is not None:
                out.append({**view, "variant": f"{r['variant']}{SEP}{node}"})
    return out
