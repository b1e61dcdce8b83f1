"""Instructions the in-process runtime executes (issue 15), counted by
valgrind's callgrind: a figure this shared 2-core machine cannot move, where
wall and CPU times of one configuration vary by up to 1.9x from run to run
(benchmarks/RESULTS.md). Use it to compare two trees, or one tree's
configurations, when a few per cent matter.

    .venv/bin/python -m benchmarks.inproc_instructions [--requests 2000] [--old-commit C] [--record]

Each count runs `benchmarks/inproc_speed.py --child` under callgrind twice,
with and without the run itself (`"dry"`: imports, workload and spec only),
and reports the difference: the run's own instructions. The workloads and
cluster settings are inproc_speed's (W1 and W2; aggregated with shadow KV
off and on, and 1 prefill + 1 decode node; `--prefix-caching` as there);
`--old-commit` adds the old tree's aggregated shadow-off runs, checked out in
a temporary worktree.
Python's hash randomisation moves a count by well under 0.1 %. Slow: about
45 s per 1,000 requests and count. Needs valgrind (Debian package `valgrind`).

`--scenario FILE` counts a scenario file's runs instead: one in-process run
(repeat 0) of each variant, the same way (the run less the child without
it), on the current tree and, with `--old-commit`, the old one:

    .venv/bin/python -m benchmarks.inproc_instructions --scenario scenarios/frozen-workload.yaml
        [--old-commit C] [--record]

`--cache-sim` runs cachegrind's cache simulation instead and adds, per
configuration, the run's first-level instruction and data cache misses and
last-level misses per 1,000 instructions: why a wall-time ratio can trail the
instruction ratio (a run that misses the first-level caches more often
executes fewer instructions per cycle, and suffers more from neighbours on a
shared machine). Slower still: about 3 minutes per 1,000 requests of the
current tree, 20 for fbeab57.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path

from benchmarks import inproc_speed, scenario_child
from benchmarks.tree_state import tree_label

CONFIGS = [("agg", False), ("agg", True), ("1P1D", False)]


# cachegrind's summary lines: "I refs:", "I1 misses:", "D refs:", "D1 misses:", "LL misses:", ...
_CACHEGRIND_LINE = re.compile(r"==\d+== (I|I1|D|D1|LLi|LLd|LL)\s+(refs|misses):\s+([\d,]+)")


def counters(tree: Path, workload_file: str, cluster: dict, dry: bool, cache_sim: bool = False) -> dict[str, int]:
    """One child under valgrind: {"I": instructions} (callgrind), or with
    `cache_sim` cachegrind's counts ("I", "I1", "D", "D1", "LL", ...: refs
    for I and D, misses for the others)."""
    payload = json.dumps({"workload_file": workload_file, "cluster": cluster, "dry": dry})
    return _valgrind(tree, [str(inproc_speed.HERE), "--child", payload], cache_sim)


def scenario_counters(tree: Path, scenario_file: Path, variant: str, dry: bool) -> dict[str, int]:
    """`counters` for one run of a scenario's variant (`scenario_child`)."""
    payload = json.dumps({"scenario": str(scenario_file), "variant": variant, "dry": dry})
    return _valgrind(tree, [str(scenario_child.HERE), payload], False)


def _valgrind(tree: Path, child_args: list[str], cache_sim: bool) -> dict[str, int]:
    if cache_sim:
        cmd = ["valgrind", "--tool=cachegrind", "--cache-sim=yes", "--cachegrind-out-file=/dev/null"]
    else:
        cmd = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null"]
    cmd += [sys.executable, *child_args]
    env = dict(os.environ, PYTHONPATH=str(tree))
    proc = subprocess.run(cmd, cwd=tree, env=env, capture_output=True, text=True)
    if cache_sim:
        found = {m[0]: int(m[2].replace(",", "")) for m in _CACHEGRIND_LINE.findall(proc.stderr)}
    else:
        collected = re.search(r"Collected : (\d+)", proc.stderr)
        found = {"I": int(collected.group(1))} if collected else {}
    if proc.returncode != 0 or "I" not in found or "RESULT " not in proc.stdout:
        tool = "cachegrind" if cache_sim else "callgrind"
        raise RuntimeError(f"{tool} run in {tree} failed (exit {proc.returncode}): {proc.stderr[-2000:]}")
    inproc_speed.check_child_tree(json.loads(proc.stdout.split("RESULT ")[-1].splitlines()[0]), tree)
    return found


def run_counters(tree: Path, workload_file: str, cluster: dict, cache_sim: bool = False) -> dict[str, int]:
    """The run's own counts: the whole child less the same child without the run."""
    whole = counters(tree, workload_file, cluster, False, cache_sim)
    dry = counters(tree, workload_file, cluster, True, cache_sim)
    return {k: whole[k] - dry.get(k, 0) for k in whole}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--old-commit", default=None, help="count this commit's aggregated shadow-off runs too")
    ap.add_argument("--workloads", default="W1,W2")
    ap.add_argument("--prefix-caching", action="store_true", help="prefix caching on (inproc_speed.py's flag)")
    ap.add_argument("--cache-sim", action="store_true", help="cachegrind's cache misses per 1,000 instructions too")
    ap.add_argument("--scenario", type=Path, default=None, help="count one run of each variant of this file")
    ap.add_argument("--record", action="store_true")
    args = ap.parse_args()
    if shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed; install the Debian package `valgrind`")
    if args.scenario is not None:
        scenario_main(args)
        return
    names = [w for w in args.workloads.split(",") if w]
    for w in names:
        if w not in inproc_speed.WORKLOADS:
            raise SystemExit(f"--workloads: {w!r} is unknown; allowed: {', '.join(inproc_speed.WORKLOADS)}")
    if args.requests < 1:
        raise SystemExit(f"--requests={args.requests} is invalid; allowed: >= 1")
    commit = tree_label()
    inproc_speed.precompile(inproc_speed.REPO)  # a change since the last run would be compiled in the first count
    old_tree = inproc_speed._worktree(args.old_commit) if args.old_commit else None
    counts: dict[tuple[str, str, bool, str], dict[str, int]] = {}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for w in names:
                wl = f"{tmp}/{w}.json"
                Path(wl).write_text(json.dumps(inproc_speed.workload_rows(w, args.requests)))
                for topo, shadow in CONFIGS:
                    sides = [("new", inproc_speed.REPO)]
                    if old_tree is not None and topo == "agg" and not shadow:
                        sides.insert(0, ("old", old_tree))
                    for side, tree in sides:
                        old = side == "old" and not inproc_speed.knows_prefix_caching(tree)
                        cluster = inproc_speed.cluster_dict(topo, shadow, old=old, caching=args.prefix_caching)
                        c = counts[(w, topo, shadow, side)] = run_counters(tree, wl, cluster, args.cache_sim)
                        label = f"{w} {topo} shadow={'on' if shadow else 'off'} {side}"
                        print(f"{label}: {c['I']:,} instructions{_misses_text(c)}", flush=True)
    finally:
        if old_tree is not None:
            inproc_speed._drop_worktree(old_tree)
    text = _entry(args, counts, names, commit)
    print(text)
    if args.record:
        from benchmarks.results_md import record_entry

        record_entry("## In-process runtime instructions (benchmarks/inproc_instructions.py)", text)


def scenario_main(args) -> None:
    """`--scenario FILE`: one run of each variant, current tree (and old)."""
    from bench.scenario import load_scenario

    path = args.scenario.resolve()
    variants = load_scenario(path).variant_names  # (refuses a bad file with its own message)
    commit = tree_label()
    inproc_speed.precompile(inproc_speed.REPO)
    old_tree = inproc_speed._worktree(args.old_commit) if args.old_commit else None
    counts: dict[tuple[str, str], int] = {}
    try:
        for variant in variants:
            sides = [("old", old_tree), ("new", inproc_speed.REPO)] if old_tree else [("new", inproc_speed.REPO)]
            for side, tree in sides:
                assert tree is not None
                whole = scenario_counters(tree, path, variant, False)["I"]
                counts[(variant, side)] = whole - scenario_counters(tree, path, variant, True)["I"]
                print(f"{variant} {side}: {counts[(variant, side)]:,} instructions", flush=True)
    finally:
        if old_tree is not None:
            inproc_speed._drop_worktree(old_tree)
    shown = path.relative_to(inproc_speed.REPO) if path.is_relative_to(inproc_speed.REPO) else path
    lines = [
        f"### {datetime.now(UTC):%Y-%m-%d %H:%M} UTC — `{shown}`, one run of each variant, instructions"
        + (f", against {args.old_commit}" if args.old_commit else ""),
        "",
        f"Tree: {commit}. Repeat 0 of each variant, in-process, the scenario's own settings. Command: "
        f"`.venv/bin/python -m benchmarks.inproc_instructions --scenario {shown}"
        + (f" --old-commit {args.old_commit}" if args.old_commit else "")
        + " --record`.",
        "",
        "| variant | tree | instructions (millions) |",
        "|---|---|---:|",
    ]
    for (variant, side), n in counts.items():
        lines.append(f"| {variant} | {side} | {n / 1e6:,.0f} |")
    lines.append("")
    if old_tree is not None:
        for variant in variants:
            ratio = counts[(variant, "old")] / counts[(variant, "new")]
            lines.append(f"- {variant}: {args.old_commit} / current: {ratio:.2f}x")
        lines.append("")
    text = "\n".join(lines)
    print(text)
    if args.record:
        from benchmarks.results_md import record_entry

        record_entry("## In-process runtime instructions (benchmarks/inproc_instructions.py)", text)


_MISSES = [("I1", "I1"), ("D1", "D1"), ("LL", "LL")]  # (counter, column label): misses per 1,000 instructions


def _per_kilo(c: dict[str, int], key: str) -> float:
    return 1000 * c[key] / c["I"] if c["I"] else 0.0


def _misses_text(c: dict[str, int]) -> str:
    if "D1" not in c:
        return ""
    return ", misses per 1,000 instructions: " + ", ".join(f"{label} {_per_kilo(c, k):.2f}" for k, label in _MISSES)


def _entry(args, counts: dict, names: list[str], commit: str) -> str:
    cache_sim = args.cache_sim
    lines = [
        f"### {datetime.now(UTC):%Y-%m-%d %H:%M} UTC — W1/W2, {args.requests} requests, instructions"
        + (" and cache misses" if cache_sim else "")
        + (f", against {args.old_commit}" if args.old_commit else ""),
        "",
        f"Tree: {commit}. Settings of inproc_speed.py, prefix caching {'**on**' if args.prefix_caching else 'off'}. "
        f"Command: `.venv/bin/python -m benchmarks.inproc_instructions --requests {args.requests}"
        + (f" --old-commit {args.old_commit}" if args.old_commit else "")
        + (f" --workloads {args.workloads}" if args.workloads != "W1,W2" else "")
        + (" --prefix-caching" if args.prefix_caching else "")
        + (" --cache-sim" if cache_sim else "")
        + " --record`."
        + (
            " Counted by cachegrind's cache simulation (first-level I1 and D1, last level LL, the sizes"
            " valgrind reads off this machine); misses per 1,000 instructions."
            if cache_sim
            else ""
        ),
        "",
        "| workload | nodes | shadow KV | tree | instructions (millions) |"
        + (" I1 misses | D1 misses | LL misses |" if cache_sim else ""),
        "|---|---|---|---|---:|" + ("---:|---:|---:|" if cache_sim else ""),
    ]
    for (w, topo, shadow, side), c in counts.items():
        row = f"| {w} | {topo} | {'on' if shadow else 'off'} | {side} | {c['I'] / 1e6:,.0f} |"
        if cache_sim:
            row += "".join(f" {_per_kilo(c, k):.2f} |" for k, _ in _MISSES)
        lines.append(row)
    lines.append("")
    for w in names:
        off = counts[(w, "agg", False, "new")]
        if (w, "agg", False, "old") in counts:
            old = counts[(w, "agg", False, "old")]
            lines.append(f"- {w}: {args.old_commit} / current (aggregated, shadow off): {old['I'] / off['I']:.2f}x")
            if cache_sim:
                rates = ", ".join(
                    f"{label} {_per_kilo(off, k) / _per_kilo(old, k):.2f}x" for k, label in _MISSES if old[k]
                )
                lines.append(f"- {w}: misses per instruction, current / {args.old_commit}: {rates}")
        shadow_on, pd = counts[(w, "agg", True, "new")], counts[(w, "1P1D", False, "new")]
        lines.append(f"- {w}: shadow on / off (aggregated): {shadow_on['I'] / off['I']:.3f}x")
        lines.append(f"- {w}: 1P+1D / aggregated (shadow off): {pd['I'] / off['I']:.3f}x")
    lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
