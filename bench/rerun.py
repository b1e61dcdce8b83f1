"""Re-run a result from its results JSON file.

A result carries `scenario_config`: the scenario document as it ran (after
`--set`), where it came from, the overrides and the runtime. That is enough
to rebuild the very same `Scenario` — same variants, seeds and settings —
and the result names its variant and repeat (the repeat picks the seed), so
`disagg-sim run results/x/s__fixed__r0.json` repeats that one run; on the
in-process runtime the new result equals the old one bit for bit (outside
`provenance` and wall-clock timings). `--only` or `--repeats` run the
rebuilt scenario's variants and repeats instead.
"""

from __future__ import annotations

from pathlib import Path

from .errors import InputError
from .results import load_result
from .scenario import Scenario


def is_result_file(target: str) -> bool:
    path = Path(target)
    return path.suffix == ".json" and path.is_file()


def scenario_from_result(target: str) -> Scenario:
    data = load_result(target)
    config = data.get("scenario_config")
    if not isinstance(config, dict) or not isinstance(config.get("document"), dict):
        raise InputError(
            f"{target}: has no scenario_config (written before results described themselves); "
            "allowed: a result JSON written by this version of disagg-sim"
        )
    document = dict(config["document"])
    if config.get("runtime") in ("inproc", "ray"):
        document["runtime"] = config["runtime"]  # the runtime it ran on, even if chosen by --runtime
    source = str(config.get("source") or target)
    overrides = config.get("overrides") or {}
    scenario = Scenario(
        document, source, overrides=overrides, origins={k: f"{target}: overrides.{k}" for k in overrides}
    )
    want = config.get("trace_sha256")
    if want is not None:
        from .sweep import file_sha256

        have = file_sha256(scenario.trace_path())
        if have != want:
            raise InputError(
                f"{target}: the trace {scenario.trace_path()} is not the one this result replayed "
                f"(sha256 {have} != {want}); allowed: the same trace file"
            )
    return scenario


def run_of_result(target: str, scenario: Scenario) -> tuple[str, int]:
    """(variant, repeat) of the run a result file records, checked against its scenario."""
    data = load_result(target)
    variant, repeat = data.get("variant"), data.get("repeat")
    if variant not in scenario.variant_names:
        raise InputError(
            f"{target}: variant {variant!r} is not one of its scenario's; allowed: {', '.join(scenario.variant_names)}"
        )
    if isinstance(repeat, bool) or not isinstance(repeat, int) or not 0 <= repeat < scenario.file.repeats:
        raise InputError(
            f"{target}: repeat {repeat!r} is not one of its scenario's {scenario.file.repeats}; "
            f"allowed: 0 to {scenario.file.repeats - 1}"
        )
    return variant, repeat
