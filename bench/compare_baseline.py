"""Which variant `compare` takes ratios against when `--baseline` is not given.

The one the scenario declares (`report.baseline`), as `run`'s table does;
without a declaration, the scenario's first variant (its order, not the
files' alphabetical one); for labelled sets (`compare a=DIR b=DIR`), that
variant of the first set. Each result carries its scenario's document
(`scenario_config.document`), so this needs no scenario file. Results that
do not (written before they described themselves) keep the first variant
as given.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence


def _declared(document: dict) -> str | None:
    """The scenario's baseline variant, read from its raw document."""
    report = document.get("report")
    if isinstance(report, dict) and isinstance(report.get("baseline"), str):
        return report["baseline"]
    variants = document.get("variants")
    if isinstance(variants, list) and variants and isinstance(variants[0], dict):
        name = variants[0].get("name")
        return name if isinstance(name, str) else None
    matrix = document.get("matrix")
    if isinstance(matrix, dict) and matrix:
        # Variants are the product of the axes in order (scenario.py): the first takes each axis' first label.
        firsts = [next(iter(axis), None) if isinstance(axis, dict) else None for axis in matrix.values()]
        labels = [x for x in firsts if isinstance(x, str)]
        return "+".join(labels) if len(labels) == len(firsts) else None
    return "default"


def default_baseline(results: Sequence[dict], labels: Sequence[str]) -> str | None:
    """The baseline variant name as the results call it (`LABEL/variant` in
    labelled sets), or None when the results do not say (the first is used)."""
    prefix = f"{labels[0]}/" if labels else ""
    names = {r["variant"] for r in results}
    for r in results:
        if not r["variant"].startswith(prefix):
            continue
        config = r.get("scenario_config")
        document = config.get("document") if isinstance(config, dict) else None
        declared = _declared(document) if isinstance(document, dict) else None
        if declared is not None and prefix + declared in names:
            return prefix + declared
        return None
    return None


def _declared_order(document: dict) -> list[str]:
    """The scenario's variant names in its own order (a list's, or the
    matrix's product of its axes), [] when the document does not say."""
    variants = document.get("variants")
    if isinstance(variants, list):
        return [v["name"] for v in variants if isinstance(v, dict) and isinstance(v.get("name"), str)]
    matrix = document.get("matrix")
    if isinstance(matrix, dict) and matrix and all(isinstance(axis, dict) for axis in matrix.values()):
        return ["+".join(map(str, combo)) for combo in itertools.product(*(list(axis) for axis in matrix.values()))]
    return []


def in_scenario_order(results: Sequence[dict]) -> list[dict]:
    """One result set's results with their variants in the scenario's order
    (as `run`'s table shows them), not the files' alphabetical one; results of
    variants the scenario does not name keep their place after those it does."""
    config = results[0].get("scenario_config") if results else None
    document = config.get("document") if isinstance(config, dict) else None
    order = _declared_order(document) if isinstance(document, dict) else []
    rank = {name: i for i, name in enumerate(order)}
    return sorted(results, key=lambda r: rank.get(r["variant"], len(rank)))
