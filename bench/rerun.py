"""Re-run a scenario from one of its results JSON files.

A result carries `scenario_config`: the scenario document as it ran (after
`--set`), where it came from, the overrides and the runtime. That is enough
to rebuild the very same `Scenario` — same variants, seeds and settings — so
`disagg-sim run results/x/s__fixed__r0.json` repeats the run; on the
in-process runtime the new results equal the old ones bit for bit (outside
`provenance` and wall-clock timings).
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
