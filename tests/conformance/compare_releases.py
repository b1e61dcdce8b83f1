"""The same conformance scenarios through several vLLM releases' real schedulers,
release against release and each against our engine: what changed between the
releases that shipped the fence (0.29.0 without the cascade fix, 0.30–0.33 with it).

    python tests/conformance/compare_releases.py \\
        --release 0.33.0=~/.cache/disagg-sim/vllm-oracle/bin/python \\
        --release 0.29.0=~/.cache/disagg-sim/vllm-oracle-0.29.0/bin/python \\
        [--count 200] [--caching-count 200] [--pd-count 200]

Build an older release with the kit: `bash tools/oracle/kit/build.sh VENV 0.29.0`.
The first release is the reference. Prints, per suite (plain, prefix caching,
P/D by role) and per pair, how many scenarios differ and the classes of the
first difference (the same signatures as run_v1.py); docs/deviations.md ("v1:
releases") holds the table this produced.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections import Counter, defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import v1_harness  # noqa: E402
from v1_compare import compare  # noqa: E402


def suite_of(scenario: dict) -> str:
    sid = scenario["id"]
    if "kv" in scenario["config"]:
        return f"pd {scenario['config']['kv']['role']}"
    kind = "hand" if sid.startswith("hand-") else "cache" if sid.startswith("cache-") else "rand"
    return kind + (" prefix guard" if scenario["config"]["prefix_guard"] else "")


def isolate(scenario: dict) -> dict:
    """The scenario without the release differences already explained, so that
    a comparison shows what remains: no long-prefill threshold (0.29.0 caps a
    lone request's chunk too; 0.30+ only with more than one request), no
    request-level load failures (0.29.0's KVConnectorOutput has no
    failed_recving), and the pre-fix retry on every side (0.29.0 has no fix)."""
    out = dict(scenario, config=dict(scenario["config"], long_prefill_token_threshold=0, prefix_guard=True))
    if "worker" in scenario:
        out["worker"] = dict(scenario["worker"], failure_mode="invalid_blocks")
        out["worker"].pop("requests", None)
    return out


def run_release(python: str, scenarios: list[dict]) -> tuple[str, list[dict]]:
    os.environ["DISAGG_SIM_ORACLE_V1"] = str(Path(python).expanduser())
    answer = v1_harness.launch.run_driver(v1_harness.DRIVER, {"scenarios": scenarios})
    return answer["vllm_version"], answer["traces"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--release", action="append", required=True, help="VERSION=PYTHON (first = reference)")
    ap.add_argument("--count", type=int, default=200)
    ap.add_argument("--caching-count", type=int, default=200)
    ap.add_argument("--pd-count", type=int, default=200)
    ap.add_argument(
        "--isolate",
        action="store_true",
        help="leave out the differences already explained (see isolate()) to show what remains",
    )
    args = ap.parse_args(argv)
    from v1_ours import run_ours

    scenarios, _ = v1_harness.default_scenarios(
        args.count, 0, True, True, caching_count=args.caching_count, pd_count=args.pd_count
    )
    if args.isolate:
        scenarios = [isolate(s) for s in scenarios]
    traces: dict[str, list[dict]] = {}
    for spec in args.release:
        label, _, python = spec.partition("=")
        version, traces[label] = run_release(python, scenarios)
        if version != label:
            print(f"note: {python} is vLLM {version}, labelled {label}", file=sys.stderr)
    traces["ours"] = run_ours(scenarios)
    labels = list(traces)
    reference = labels[0]
    suites = sorted({suite_of(s) for s in scenarios})
    totals = Counter(suite_of(s) for s in scenarios)
    pairs = [(reference, other) for other in labels[1:]] + [(other, "ours") for other in labels[1:-1]]
    for a, b in pairs:
        differ: dict[str, list[str]] = defaultdict(list)
        classes: dict[str, Counter] = defaultdict(Counter)
        for i, scenario in enumerate(scenarios):
            m = compare(traces[a][i], traces[b][i])
            if m is not None:
                differ[suite_of(scenario)].append(scenario["id"])
                classes[suite_of(scenario)][f"{m.signature[0]} {list(m.signature[1])}"] += 1
        print(f"\n{a} vs {b}: {sum(map(len, differ.values()))} of {len(scenarios)} scenarios differ")
        for suite in suites:
            ids = differ.get(suite, [])
            top = ", ".join(f"{k} x{v}" for k, v in classes[suite].most_common(3))
            print(f"  {suite:<22} {len(ids):>4} / {totals[suite]:<4} {top}")
            if ids:
                print(f"  {'':<22} e.g. {', '.join(ids[:5])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
