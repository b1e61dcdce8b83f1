"""Command line for the v1 differential harness (`make conformance` runs it via
tools/conformance.sh).

    python tests/conformance/run_v1.py                    # hand-written + 200 random (+ pre-fix twins)
    python tests/conformance/run_v1.py --count 1000 --first-seed 5000
    python tests/conformance/run_v1.py --scenario build/conformance/v1/rand-0042.repro.json
    python tests/conformance/run_v1.py --only rand-0042 --verbose
    python tests/conformance/run_v1.py --record-golden      # refresh golden/v1_traces.json

Exit status: 0 all matched, 1 mismatches or failed expectations, 2 oracle absent.
For each mismatch class the first scenario is shrunk and written, with both
sides' differing records, to build/conformance/v1/<id>-min.repro.json.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import v1_harness  # noqa: E402


def _load_scenarios(paths: list[str]) -> list[dict]:
    out = []
    for p in paths:
        doc = json.loads(Path(p).read_text())
        if isinstance(doc, dict) and "scenario" in doc:  # a repro file
            doc = doc["scenario"]
        out += doc if isinstance(doc, list) else [doc]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--count", type=int, default=200, help="random scenarios (default 200)")
    ap.add_argument("--first-seed", type=int, default=0)
    ap.add_argument(
        "--caching-count", type=int, default=500, help="random scenarios with prefix caching on (default 500)"
    )
    ap.add_argument(
        "--pd-count",
        type=int,
        default=500,
        help="random P/D scenarios: a KV connector in each role (default 500; see pd_generate.py)",
    )
    ap.add_argument("--no-prefix-twins", action="store_true", help="skip the pre-fix-guard replays")
    ap.add_argument("--no-handwritten", action="store_true")
    ap.add_argument("--scenario", action="append", default=[], help="replay scenario/repro JSON file(s) only")
    ap.add_argument("--only", action="append", default=[], help="keep only these scenario ids")
    ap.add_argument("--out", type=Path, default=v1_harness.DEFAULT_OUT, help="where repro files go")
    ap.add_argument("--no-shrink", action="store_true", help="dump failing scenarios unshrunk")
    ap.add_argument("--verbose", action="store_true", help="print every mismatch in full")
    ap.add_argument(
        "--record-golden",
        action="store_true",
        help="re-record vLLM's traces of the golden scenarios into "
        f"{v1_harness.GOLDEN_FILE.relative_to(v1_harness.REPO)}",
    )
    args = ap.parse_args(argv)

    reason = v1_harness.oracle_missing_reason()
    if reason:
        print(f"cannot run: {reason}; build it with bash tools/conformance.sh", file=sys.stderr)
        return 2

    if args.record_golden:
        path = v1_harness.record_golden()
        print(f"recorded vLLM traces of the golden scenarios into {path}")
        return 0

    if args.scenario:
        scenarios, expectations = _load_scenarios(args.scenario), {}
    else:
        scenarios, expectations = v1_harness.default_scenarios(
            args.count,
            args.first_seed,
            not args.no_prefix_twins,
            not args.no_handwritten,
            args.caching_count,
            args.pd_count,
        )
    if args.only:
        scenarios = [s for s in scenarios if s["id"] in set(args.only)]
        if not scenarios:
            print(f"no scenario has an id in {args.only}", file=sys.stderr)
            return 1

    result = v1_harness.run_harness(scenarios, expectations, shrink_mismatches=not args.no_shrink, out_dir=args.out)
    shown = result.mismatches if args.verbose else [g[0] for g in result.classes().values()]
    for m in shown:
        print(m.describe())
        print()
    print(result.summary())
    return 0 if not result.mismatches and not result.expectation_failures else 1


if __name__ == "__main__":
    sys.exit(main())
