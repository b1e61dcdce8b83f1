"""One in-process run of a scenario file's variant, in a child process whose
`PYTHONPATH` points at the tree being measured (benchmarks/inproc_instructions.py
`--scenario`): run by path, it imports nothing from the tree it lives in, so
an older tree's code is what runs.

    PYTHONPATH=TREE python benchmarks/scenario_child.py '{"scenario": PATH, "variant": NAME, "dry": false}'

Runs repeat 0 of the variant (with `"dry"`: loads the scenario only) and
prints `RESULT {"engine_file": ..., "requests": ...}`: where the engine was
imported from, and how many requests the run reported (not when dry).
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
    out: dict = {"engine_file": engine.__file__}
    if not a["dry"]:
        out["requests"] = len(run_one(scenario, a["variant"], 0, "inproc").requests)
    print("RESULT " + json.dumps(out))


if __name__ == "__main__":
    main(sys.argv[1])
