"""One in-process run of a scenario file's variant, in a child process whose
`PYTHONPATH` points at the tree being measured (benchmarks/inproc_instructions.py
`--scenario`): run by path, it imports nothing from the tree it lives in, so
an older tree's code is what runs.

    PYTHONPATH=TREE python benchmarks/scenario_child.py '{"scenario": PATH, "variant": NAME, "dry": false}'

Runs repeat 0 of the variant (with `"dry"`: loads the scenario only) and
prints `RESULT {"engine_file": ...}`, where the engine was imported from.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve()


def main(args_json: str) -> None:
    a = json.loads(args_json)
    import engine
    from bench.scenario import load_scenario
    from bench.sweep import run_one

    scenario = load_scenario(a["scenario"])
    if not a["dry"]:
        run_one(scenario, a["variant"], 0, "inproc")
    print("RESULT " + json.dumps({"engine_file": engine.__file__}))


if __name__ == "__main__":
    main(sys.argv[1])
