"""Against the compiled peer (issue 35): our in-process runtime and NVIDIA
Dynamo's mocker (Rust; `ai-dynamo-runtime`, offline trace replay) on the
same traces, in one interleaved run.

    .venv/bin/pip install ai-dynamo-runtime==1.6.1      # benchmark-only, never a test or runtime dependency
    .venv/bin/python -m benchmarks.peer_speed [--requests 10000] [--repeats 3] [--workloads W1,W2]
        [--instructions N] [--compiled] [--record]

The workloads are benchmarks/inproc_speed.py's W1 and W2 (generated once,
here), and our clusters its settings (`max_num_seqs` 128,
`max_num_batched_tokens` 4096, 7,424 blocks of 16, `synthetic-8b`, shadow KV
off), in three configurations:

- `agg off`: one aggregated node, prefix caching off;
- `agg on`: one aggregated node, prefix caching on (the engine's default);
  every prompt is its own, so nothing hits: what the cache bookkeeping costs;
- `1P1D off`: one prefill and one decode node, prefix caching off.

The mocker replays the same requests exported as a Mooncake JSONL trace
(`export_mooncake`: timestamp in ms, input and output length, a `hash_ids`
list of the prompt's blocks of 16, unique per request) with the same engine
limits, prefix caching as ours, and for the `1P1D` row one prefill and one
decode worker (`prefill_engine_args` / `decode_engine_args` with their
`worker_type`). Its timing model is its own, so its simulated time differs
from ours; the comparison is wall time for the same trace.

Each measurement runs in a fresh process (ours: inproc_speed's child; the
mocker: this file's `--mocker-child`), ours and the mocker's back to back
(their order alternating by round), so a slow spell of this shared machine
hits both sides of a pair alike. An entry gives, per configuration, the
medians, the ratio with a 90 % bootstrap interval (inproc_speed's
`ratio_interval`) and the wall time per simulated step. Our step count is
exact (our step records). The mocker reports no step count, so its steps are
estimated as its simulated duration over its token-weighted mean
inter-token latency; the same estimate on our runs, next to our real count,
says how far to trust it.

`--compiled` adds a third side, our runtime on the compiled engine
(docs/compiled.md; `make compiled` first): each configuration is then run
pure, compiled and by the mocker in one round (the order turning by round),
and the entry adds compiled / pure and compiled / mocker. Every child says
which engine build it ran, and a child on the wrong one is refused.

`--instructions N` adds callgrind instruction counts (which the machine's
load does not move) of each configuration on both sides at N requests: the
child less the same child without the run (`"dry"`), as
benchmarks/inproc_instructions.py counts. Needs valgrind.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

from benchmarks import inproc_speed

HERE = Path(__file__).resolve()
REPO = HERE.parent.parent
BLOCK_SIZE = 16
ENGINE = {"num_gpu_blocks": 7424, "block_size": BLOCK_SIZE, "max_num_seqs": 128, "max_num_batched_tokens": 4096}
# configuration -> (our topology, prefix caching)
CONFIGS = {"agg off": ("agg", False), "agg on": ("agg", True), "1P1D off": ("1P1D", False)}


def export_mooncake(rows: list[list], path: Path) -> None:
    """The workload (inproc_speed's rows: id, arrival s, prompt, output) as a
    Mooncake JSONL trace; each prompt's blocks get hash ids of their own."""
    next_id = 0
    with path.open("w") as f:
        for _, arrival, prompt_len, output_len in rows:
            n_blocks = -(-prompt_len // BLOCK_SIZE)
            ids = list(range(next_id, next_id + n_blocks))
            next_id += n_blocks
            line = {"timestamp": arrival * 1000.0, "input_length": prompt_len, "output_length": output_len}
            f.write(json.dumps({**line, "hash_ids": ids}) + "\n")


def mocker_kwargs(config: str) -> dict:
    topology, caching = CONFIGS[config]
    engine = dict(ENGINE, enable_prefix_caching=caching)
    if topology == "agg":
        return {"extra_engine_args": {"engine": engine}}
    return {
        "prefill_engine_args": {"engine": dict(engine, worker_type="prefill")},
        "decode_engine_args": {"engine": dict(engine, worker_type="decode")},
        "num_prefill_workers": 1,
        "num_decode_workers": 1,
    }


def mocker_child(payload: str) -> None:
    """One mocker replay, in its own process; prints `RESULT {...}`."""
    a = json.loads(payload)
    from dynamo._core import run_mocker_trace_replay

    if a.get("dry"):
        print("RESULT " + json.dumps({}))
        return
    t0, c0 = time.perf_counter(), time.process_time()
    result = run_mocker_trace_replay(
        [a["trace"]], replay_mode="offline", trace_block_size=BLOCK_SIZE, **mocker_kwargs(a["config"])
    )
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    s = result.summary
    itl_s = s["mean_itl_ms"] / 1000.0
    print(
        "RESULT "
        + json.dumps(
            {
                "wall_s": wall,
                "cpu_s": cpu,
                "own_wall_s": s["wall_time_ms"] / 1000.0,
                "simulated_s": s["duration_ms"] / 1000.0,
                "completed": s["completed_requests"],
                "decode_tokens": s["total_output_tokens"],
                "mean_itl_s": itl_s,
                "steps_estimated": s["duration_ms"] / 1000.0 / itl_s,
                "max_rss_MB": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            }
        )
    )


def run_mocker(trace: Path, config: str, dry: bool = False, valgrind: bool = False) -> dict:
    payload = json.dumps({"trace": str(trace), "config": config, "dry": dry})
    cmd = [sys.executable, str(HERE), "--mocker-child", payload]
    if valgrind:
        cmd = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", *cmd]
    proc = subprocess.run(cmd, cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO)), capture_output=True, text=True)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"mocker child failed (exit {proc.returncode}): {proc.stderr[-2000:]}")
    out = json.loads(lines[-1][len("RESULT ") :])
    if valgrind:
        out["instructions"] = _collected(proc.stderr)
    return out


def _collected(stderr: str) -> int:
    found = re.search(r"Collected : (\d+)", stderr)
    if not found:
        raise RuntimeError(f"callgrind printed no count: {stderr[-2000:]}")
    return int(found.group(1))


def ours_cluster(config: str) -> dict:
    topology, caching = CONFIGS[config]
    return inproc_speed.cluster_dict(topology, shadow=False, old=False, caching=caching)


# side -> DISAGG_SIM_COMPILED for its children, and the build each must report
BUILDS = {"ours": ("0", "pure"), "compiled": ("1", "compiled")}


def run_ours(workload_file: str, config: str, side: str) -> dict:
    value, build = BUILDS[side]
    r = inproc_speed.run_child(REPO, workload_file, ours_cluster(config), {"DISAGG_SIM_COMPILED": value})
    if not r.get("engine_build", "pure").startswith(build):
        raise RuntimeError(f"the {side} side ran the engine build {r.get('engine_build')!r}")
    return r


def our_instructions(workload_file: str, config: str, side: str = "ours") -> int:
    from benchmarks.inproc_instructions import run_counters

    saved = os.environ.get("DISAGG_SIM_COMPILED")
    os.environ["DISAGG_SIM_COMPILED"] = BUILDS[side][0]
    try:
        return run_counters(REPO, workload_file, ours_cluster(config))["I"]
    finally:
        if saved is None:
            del os.environ["DISAGG_SIM_COMPILED"]
        else:
            os.environ["DISAGG_SIM_COMPILED"] = saved


def mocker_instructions(trace: Path, config: str) -> int:
    whole = run_mocker(trace, config, valgrind=True)["instructions"]
    return whole - run_mocker(trace, config, dry=True, valgrind=True)["instructions"]


# ------------------------------------------------------------------------ main
def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=10_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--workloads", default="W1,W2")
    ap.add_argument("--instructions", type=int, default=0, metavar="N", help="callgrind counts at N requests too")
    ap.add_argument("--compiled", action="store_true", help="our runtime on the compiled engine too (make compiled)")
    ap.add_argument("--record", action="store_true")
    ap.add_argument("--mocker-child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.mocker_child is not None:
        mocker_child(args.mocker_child)
        return
    names = [w for w in args.workloads.split(",") if w]
    for w in names:
        if w not in inproc_speed.WORKLOADS:
            raise SystemExit(f"--workloads: {w!r} is unknown; allowed: {', '.join(inproc_speed.WORKLOADS)}")
    if args.repeats < 1 or args.requests < 1:
        raise SystemExit(f"--repeats={args.repeats} / --requests={args.requests}: allowed: >= 1")
    try:
        import dynamo._core  # noqa: F401
    except ImportError:
        raise SystemExit("the mocker is not installed: .venv/bin/pip install ai-dynamo-runtime==1.6.1") from None
    if args.instructions and shutil.which("valgrind") is None:
        raise SystemExit("--instructions needs valgrind (Debian package `valgrind`)")
    if args.compiled:
        from engine.compiled import DEFAULT_DIR

        if not (DEFAULT_DIR / "manifest.json").exists():
            raise SystemExit(f"--compiled: no compiled build in {DEFAULT_DIR}: run `make compiled`")
    inproc_speed.precompile(REPO)
    from benchmarks.tree_state import tree_label

    tree = tree_label()
    runs: dict[tuple[str, str, str], list[dict]] = {}
    counts: dict[tuple[str, str, str], int] = {}
    with tempfile.TemporaryDirectory() as tmp:
        files: dict[str, tuple[str, Path]] = {}
        for w in names:
            rows = inproc_speed.workload_rows(w, args.requests)
            files[w] = (f"{tmp}/{w}.json", Path(f"{tmp}/{w}.jsonl"))
            Path(files[w][0]).write_text(json.dumps(rows))
            export_mooncake(rows, files[w][1])
        for rep in range(args.repeats):
            for w in names:
                for config in CONFIGS:
                    sides = ["ours", "compiled", "mocker"] if args.compiled else ["ours", "mocker"]
                    turn = rep % len(sides)
                    for side in sides[turn:] + sides[:turn]:
                        if side == "mocker":
                            r = run_mocker(files[w][1], config)
                        else:
                            r = run_ours(files[w][0], config, side)
                        runs.setdefault((w, config, side), []).append(r)
                        print(f"rep {rep} {w} {config} {side}: {r['wall_s']:.2f} s", flush=True)
        if args.instructions:
            for w in names:
                rows = inproc_speed.workload_rows(w, args.instructions)
                small = (f"{tmp}/{w}-small.json", Path(f"{tmp}/{w}-small.jsonl"))
                Path(small[0]).write_text(json.dumps(rows))
                export_mooncake(rows, small[1])
                for config in CONFIGS:
                    counts[(w, config, "ours")] = our_instructions(small[0], config)
                    counts[(w, config, "mocker")] = mocker_instructions(small[1], config)
                    if args.compiled:
                        counts[(w, config, "compiled")] = our_instructions(small[0], config, "compiled")
                    print(f"instructions {w} {config}: {counts[(w, config, 'ours')]:,} ours", flush=True)
    text = entry(args, names, runs, counts, tree)
    print(text)
    if args.record:
        from benchmarks.results_md import record_entry

        record_entry("## Against Dynamo's mocker (benchmarks/peer_speed.py)", text)


def _med(rs: list[dict], key: str = "wall_s") -> float:
    return statistics.median(r[key] for r in rs)


def entry(args: argparse.Namespace, names: list[str], runs: dict, counts: dict, tree: str) -> str:
    from benchmarks.tree_state import machine_line

    lines = [
        f"### {datetime.now(UTC):%Y-%m-%d %H:%M} UTC — {'/'.join(names)}, {args.requests} requests, "
        f"median of {args.repeats}, interleaved with the mocker",
        "",
        f"{machine_line()} Tree: {tree}. Mocker: ai-dynamo-runtime {_mocker_version()} "
        "(`run_mocker_trace_replay`, offline, the same trace as Mooncake JSONL). Settings as "
        "benchmarks/inproc_speed.py's, shadow KV off. Command: `.venv/bin/python -m benchmarks.peer_speed "
        f"--requests {args.requests} --repeats {args.repeats}"
        + (f" --workloads {args.workloads}" if args.workloads != "W1,W2" else "")
        + (f" --instructions {args.instructions}" if args.instructions else "")
        + (" --compiled" if args.compiled else "")
        + " --record`.",
        "",
        "| workload | configuration | ours, wall s (runs) | mocker, wall s (runs) | ours / mocker (90 % interval) | "
        "CPU s, ours / mocker (medians) | our steps, µs a step | mocker's steps (estimated), µs a step | "
        "per step, ours / mocker | our peak RSS MB |",
        "|---|---|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for w in names:
        for config in CONFIGS:
            ours, mock = runs[(w, config, "ours")], runs[(w, config, "mocker")]
            o, m = _med(ours), _med(mock)
            lo, hi = inproc_speed.ratio_interval([r["wall_s"] for r in ours], [r["wall_s"] for r in mock])
            steps, m_steps = ours[0]["steps"], mock[0]["steps_estimated"]
            each = lambda rs: ", ".join(f"{r['wall_s']:.2f}" for r in rs)  # noqa: E731
            lines.append(
                f"| {w} | {config} | {o:.2f} ({each(ours)}) | {m:.2f} ({each(mock)}) | **{o / m:.2f}x** "
                f"({lo:.2f}–{hi:.2f}) | {_med(ours, 'cpu_s'):.3f} / {_med(mock, 'cpu_s'):.3f} = "
                f"{_med(ours, 'cpu_s') / _med(mock, 'cpu_s'):.2f}x | {steps:,}, {1e6 * o / steps:.1f} | "
                f"{m_steps:,.0f}, {1e6 * m / m_steps:.1f} | "
                f"{(o / steps) / (m / m_steps):.2f}x | {max(r['max_rss_MB'] for r in ours):.0f} |"
            )
    lines.append("")
    for w in names:
        off, on = runs[(w, "agg off", "ours")], runs[(w, "agg on", "ours")]
        lo, hi = inproc_speed.ratio_interval([r["wall_s"] for r in on], [r["wall_s"] for r in off])
        lines.append(
            f"- {w}: ours, prefix caching on (no hits) / off: {_med(on) / _med(off):.2f}x ({lo:.2f}–{hi:.2f}; "
            f"CPU {_med(on, 'cpu_s') / _med(off, 'cpu_s'):.2f}x; target <= 1.2x)."
        )
        pd = runs[(w, "1P1D off", "ours")]
        per_step = (_med(pd) / pd[0]["steps"]) / (_med(off) / off[0]["steps"])
        per_step_cpu = (_med(pd, "cpu_s") / pd[0]["steps"]) / (_med(off, "cpu_s") / off[0]["steps"])
        lines.append(
            f"- {w}: ours, 1P+1D / aggregated per simulated step: {per_step:.2f}x wall, {per_step_cpu:.2f}x CPU "
            f"(target <= 1.5x; whole runs {_med(pd) / _med(off):.2f}x, {pd[0]['steps']:,} / {off[0]['steps']:,} steps)."
        )
        est = [
            f"{config} {r['simulated_s'] / r['mean_itl_s']:,.0f} / {r['steps']:,}"
            for config in CONFIGS
            for r in runs[(w, config, "ours")][:1]
            if r.get("mean_itl_s")
        ]
        lines.append(
            f"- {w}: the mocker's step estimate (simulated time / token-weighted mean ITL) applied to our runs "
            f"against our real step counts: {'; '.join(est)} (every step counted: prefill-only and empty steps too)."
        )
        m = runs[(w, "agg off", "mocker")][0]
        lines.append(
            f"- {w}: simulated time, ours / the mocker (agg off): {off[0]['simulated_s']:.1f} / "
            f"{m['simulated_s']:.1f} s; "
            f"the mocker's own timer {_med(runs[(w, 'agg off', 'mocker')], 'own_wall_s'):.2f} s of its "
            f"{_med(runs[(w, 'agg off', 'mocker')]):.2f} s call."
        )
    w1 = [r["max_rss_MB"] for (w, _, side), rs in runs.items() if w == "W1" and side == "ours" for r in rs]
    if w1:
        lines.append(f"- W1 peak RSS, ours (any configuration): {max(w1):.0f} MB (target <= 200 MB).")
    if counts:
        lines.append(
            f"- Instructions at {args.instructions} requests (callgrind, the run less the child without it), "
            "ours / the mocker: "
            + "; ".join(
                f"{w} {config} {counts[(w, config, 'ours')] / 1e6:,.0f}M / {counts[(w, config, 'mocker')] / 1e6:,.0f}M "
                f"= {counts[(w, config, 'ours')] / counts[(w, config, 'mocker')]:.2f}x"
                for w in names
                for config in CONFIGS
            )
            + "."
        )
    if args.compiled:
        lines += compiled_lines(args, names, runs, counts)
    lines.append("")
    return "\n".join(lines)


def compiled_lines(args: argparse.Namespace, names: list[str], runs: dict, counts: dict) -> list[str]:
    """The compiled side: against our pure runs (the same process set-up) and the mocker."""
    build = runs[(names[0], "agg off", "compiled")][0]["engine_build"]
    lines = [
        "",
        f"Compiled engine ({build}; docs/compiled.md), in the same rounds:",
        "",
        "| workload | configuration | compiled, wall s (runs) | compiled / pure, wall (90 % interval) | "
        "compiled / pure, CPU | compiled / mocker, wall (90 % interval) | compiled / mocker, CPU | "
        "compiled, µs a step | peak RSS MB |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for w in names:
        for config in CONFIGS:
            comp, ours, mock = (runs[(w, config, side)] for side in ("compiled", "ours", "mocker"))
            c = _med(comp)
            lo, hi = inproc_speed.ratio_interval([r["wall_s"] for r in comp], [r["wall_s"] for r in ours])
            mlo, mhi = inproc_speed.ratio_interval([r["wall_s"] for r in comp], [r["wall_s"] for r in mock])
            if comp[0]["steps"] != ours[0]["steps"] or comp[0]["decode_tokens"] != ours[0]["decode_tokens"]:
                raise RuntimeError(f"{w} {config}: the compiled run simulated something else than the pure one")
            each = ", ".join(f"{r['wall_s']:.2f}" for r in comp)
            lines.append(
                f"| {w} | {config} | {c:.2f} ({each}) | "
                f"**{c / _med(ours):.2f}x** ({lo:.2f}–{hi:.2f}) | {_med(comp, 'cpu_s') / _med(ours, 'cpu_s'):.2f}x | "
                f"**{c / _med(mock):.2f}x** ({mlo:.2f}–{mhi:.2f}) | {_med(comp, 'cpu_s') / _med(mock, 'cpu_s'):.2f}x | "
                f"{1e6 * c / comp[0]['steps']:.1f} | {max(r['max_rss_MB'] for r in comp):.0f} |"
            )
    lines.append("")
    for w in names:
        off, on, pd = (runs[(w, config, "compiled")] for config in CONFIGS)
        per_step = (_med(pd, "cpu_s") / pd[0]["steps"]) / (_med(off, "cpu_s") / off[0]["steps"])
        lines.append(
            f"- {w}, compiled: prefix caching on / off {_med(on) / _med(off):.2f}x wall, "
            f"{_med(on, 'cpu_s') / _med(off, 'cpu_s'):.2f}x CPU; 1P+1D / aggregated per simulated step "
            f"{(_med(pd) / pd[0]['steps']) / (_med(off) / off[0]['steps']):.2f}x wall, {per_step:.2f}x CPU."
        )
    if any(side == "compiled" for (_, _, side) in counts):
        lines.append(
            f"- Instructions at {args.instructions} requests, compiled / pure / the mocker: "
            + "; ".join(
                f"{w} {config} {counts[(w, config, 'compiled')] / 1e6:,.0f}M / "
                f"{counts[(w, config, 'ours')] / 1e6:,.0f}M / {counts[(w, config, 'mocker')] / 1e6:,.0f}M"
                for w in names
                for config in CONFIGS
            )
            + "."
        )
    return lines


def _mocker_version() -> str:
    from importlib.metadata import version

    return version("ai-dynamo-runtime")


if __name__ == "__main__":
    main()
