"""Speed of the in-process runtime (issue 15): wall time, simulated decode
tokens and requests per wall second, and peak memory, on two workloads:

- W1: 10,000 requests, ShareGPT-like prompt and output lengths, Poisson
  arrivals at 10 requests/s, seed 0;
- W2: 10,000 requests, 512-token prompts and 256-token outputs, Poisson
  at 6 requests/s;

each on one aggregated node (`prefill.count: 0`) and on 1 prefill + 1 decode
node, `max_num_seqs` 128, `max_num_batched_tokens` 4096, 7,424 blocks of 16
tokens, the `synthetic-8b` cost model, prefix caching off, shadow KV off and
on. `--prefix-caching` runs both sides with prefix caching on instead (vLLM's
default and the simulator's; the old commit must know the setting).

    .venv/bin/python -m benchmarks.inproc_speed [--requests 10000] [--repeats 3]
        [--old-commit fbeab57] [--record]
    .venv/bin/python -m benchmarks.inproc_speed --profile 2000   # cProfile of W1, shadow off, in-process

Every measurement runs in a fresh process (`python benchmarks/inproc_speed.py
--child ...` with `PYTHONPATH` at the tree to time), so its peak RSS is its
own. `--old-commit C` checks C out in a temporary `git worktree` under /tmp
and times it interleaved with the current tree (old, new, old, new, ...),
with shadow KV off, aggregated (the speed-up targets) and 1P+1D (the old
tree's own 1P+1D / aggregated ratio, and 1P+1D's speed-up), on the same
workload (generated once, here, and handed to both as plain numbers);
each child reports which tree its modules came from, and the benchmark
refuses a child that imported the wrong one. The old side gets only
settings it understands (no `enable_prefix_caching`: before prefix caching
existed it was off).

`--record` adds the figures to benchmarks/RESULTS.md (newest first).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path

HERE = Path(__file__).resolve()
REPO = HERE.parent.parent

WORKLOADS = {
    "W1": {
        "prompt_len": {"kind": "sharegpt_like", "part": "prompt"},
        "output_len": {"kind": "sharegpt_like", "part": "output"},
        "arrival": {"kind": "poisson", "rate": 10.0},
    },
    "W2": {"prompt_len": 512, "output_len": 256, "arrival": {"kind": "poisson", "rate": 6.0}},
}
TOPOLOGIES = {"agg": 0, "1P1D": 1}  # prefill.count


def knows_prefix_caching(tree: Path) -> bool:
    """Whether the tree's engine has the `enable_prefix_caching` setting
    (fbeab57 predates it: caching was off; later commits default it on, so
    they must be told to turn it off)."""
    config = tree / "engine" / "config.py"
    return config.exists() and "enable_prefix_caching" in config.read_text()


def cluster_dict(topology: str, shadow: bool, old: bool, caching: bool = False, async_decode: bool = False) -> dict:
    engine: dict = {"num_gpu_blocks": 7424, "block_size": 16, "max_num_seqs": 128, "max_num_batched_tokens": 4096}
    if caching:
        engine["enable_prefix_caching"] = True
    elif not old:
        engine["enable_prefix_caching"] = False  # fbeab57 has no such setting (nor the feature)
    decode_engine = dict(engine)
    if async_decode:
        decode_engine["async_scheduling"] = True  # (the shipped scenarios' decode nodes)
    n_prefill = TOPOLOGIES[topology]
    return {
        "prefill": {"count": n_prefill, "engine": dict(engine)},
        "decode": {"count": 1, "engine": decode_engine},
        "cost_model": "synthetic-8b",
        "shadow_kv": shadow,
    }


def workload_rows(name: str, n: int) -> list[list]:
    """The workload as plain numbers (id, arrival, prompt length, output length)."""
    from bench.workloads import generate_workload, parse_workload_spec

    wl = generate_workload(parse_workload_spec({"num_requests": n, **WORKLOADS[name]}), seed=0)
    return [[w.request_id, w.arrival_time, w.prompt_len, w.output_len] for w in wl]


# -------------------------------------------------------------------- the child
def child(args_json: str) -> None:
    """Runs inside the tree being timed: imports only what both old and new trees have."""
    import resource

    a = json.loads(args_json)
    from cluster.spec import ClusterSpec
    from engine.records import WorkloadRequest

    try:
        from cluster.inproc import run_inproc  # current layout
    except ImportError:
        from cluster.inproc_cluster import run_inproc  # type: ignore[no-redef]  # fbeab57's layout
    import engine

    rows = json.loads(Path(a["workload_file"]).read_text())
    wl = [WorkloadRequest(r[0], r[1], r[2], r[3]) for r in rows]
    spec = ClusterSpec.model_validate(a["cluster"])
    if a.get("dry"):
        # Everything but the run (benchmarks/inproc_instructions.py subtracts this).
        print("RESULT " + json.dumps({"engine_file": engine.__file__}))
        return
    t0, c0 = time.perf_counter(), time.process_time()
    result = run_inproc(spec, wl, seed=0)
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    try:
        from engine.compiled import build_label  # (docs/compiled.md; older trees have none: pure)
    except ImportError:
        build_label = lambda: "pure"  # noqa: E731
    out = {
        "engine_file": engine.__file__,
        "engine_build": build_label(),
        "wall_s": wall,
        "cpu_s": cpu,
        "simulated_s": result.duration,
        "decode_tokens": sum(len(r.output_token_ids) for r in result.requests),
        "completed": sum(1 for r in result.requests if r.finish_reason in ("stop", "length")),
        "steps": len(result.steps),
        "events": result.extra.get("num_events"),
        "invariant_errors": len(result.invariant_errors),
        # Token-weighted mean inter-token latency (benchmarks/peer_speed.py
        # checks its step-count estimate for the mocker against our runs).
        "mean_itl_s": _mean_itl(result.requests),
        "max_rss_MB": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }
    print("RESULT " + json.dumps(out))


def _mean_itl(records: list) -> float | None:
    """Sum of (last token - first token) over sum of (tokens - 1), or None
    on a tree whose records keep no token times."""
    span = gaps = 0.0
    for r in records:
        times = getattr(r, "token_times", None)
        if times is None:
            return None
        if len(times) > 1:
            span += times[-1] - times[0]
            gaps += len(times) - 1
    return span / gaps if gaps else None


def run_child(tree: Path, workload_file: str, cluster: dict, env_extra: dict | None = None) -> dict:
    env = dict(os.environ, PYTHONPATH=str(tree), **(env_extra or {}))
    payload = json.dumps({"workload_file": workload_file, "cluster": cluster})
    proc = subprocess.run(
        [sys.executable, str(HERE), "--child", payload], cwd=tree, env=env, capture_output=True, text=True
    )
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"child in {tree} failed (exit {proc.returncode}): {proc.stderr[-2000:]}")
    out = json.loads(lines[-1][len("RESULT ") :])
    check_child_tree(out, tree)
    return out


def check_child_tree(result: dict, tree: Path) -> None:
    """A child's `RESULT` must name an engine imported from the tree it was meant to measure."""
    if not Path(result["engine_file"]).resolve().is_relative_to(tree.resolve()):
        raise RuntimeError(f"child meant to measure {tree} imported {result['engine_file']}")


# --------------------------------------------------------------------- profile
def profile(n: int) -> None:
    import cProfile
    import pstats

    from cluster.inproc import run_inproc
    from cluster.spec import ClusterSpec
    from engine.records import WorkloadRequest

    wl = [WorkloadRequest(r[0], r[1], r[2], r[3]) for r in workload_rows("W1", n)]
    spec = ClusterSpec.model_validate(cluster_dict("agg", shadow=os.environ.get("SHADOW") == "1", old=False))
    prof = cProfile.Profile()
    t0 = time.perf_counter()
    prof.enable()
    run_inproc(spec, wl, seed=0)
    prof.disable()
    print(f"wall {time.perf_counter() - t0:.2f} s (under cProfile)")
    pstats.Stats(prof).sort_stats("cumulative").print_stats(40)
    pstats.Stats(prof).sort_stats("tottime").print_stats(30)


# ------------------------------------------------------------------------ main
def _worktree(commit: str) -> Path:
    path = Path(tempfile.mkdtemp(prefix="inproc-speed-old-", dir="/tmp"))
    subprocess.run(
        ["git", "-C", str(REPO), "worktree", "add", "--detach", str(path), commit], check=True, capture_output=True
    )
    precompile(path)
    return path


def precompile(tree: Path) -> None:
    """Byte-compile the tree's modules now, so no measured child pays for
    it: a fresh worktree has no `__pycache__`, and where
    PYTHONDONTWRITEBYTECODE is set (as on these machines) every child would
    compile every module it imports, ~590M instructions each, some of them
    inside the timed run (modules imported on first use: ~35M of W1's at
    2,000 requests). Hidden folders (.git, .venv) are left out."""
    subprocess.run(
        [sys.executable, "-m", "compileall", "-q", "-x", r"/\.", str(tree)], check=False, capture_output=True
    )


def _drop_worktree(path: Path) -> None:
    subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", str(path)], capture_output=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=10_000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--old-commit", default=None, help="time this commit interleaved with the current tree")
    ap.add_argument("--workloads", default="W1,W2")
    ap.add_argument("--prefix-caching", action="store_true", help="both sides with prefix caching on")
    ap.add_argument(
        "--async-scheduling",
        action="store_true",
        help="decode nodes with async scheduling (the shipped scenarios' setting: every step taken one by one)",
    )
    ap.add_argument("--record", action="store_true")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--profile", type=int, default=None, metavar="N", help="cProfile W1 with N requests")
    args = ap.parse_args()
    if args.child is not None:
        child(args.child)
        return
    if args.profile is not None:
        profile(args.profile)
        return
    names = [w for w in args.workloads.split(",") if w]
    for w in names:
        if w not in WORKLOADS:
            raise SystemExit(f"--workloads: {w!r} is unknown; allowed: {', '.join(WORKLOADS)}")
    if args.repeats < 1:
        raise SystemExit(f"--repeats={args.repeats} is invalid; allowed: >= 1")

    precompile(REPO)  # as the old side's worktree is (`precompile`)
    old_tree = _worktree(args.old_commit) if args.old_commit else None
    old_knows_caching = old_tree is not None and knows_prefix_caching(old_tree)
    from benchmarks.tree_state import tree_label  # the parent only: a child imports nothing but what both trees have

    measured = tree_label()  # (`tree` below is each side's checkout)
    # (workload, topology, shadow, side) -> list of child results
    runs: dict[tuple, list[dict]] = {}
    configs = [(w, topo, shadow) for w in names for topo in TOPOLOGIES for shadow in (False, True)]
    try:
        with tempfile.TemporaryDirectory() as tmp:
            files = {}
            for w in names:
                files[w] = f"{tmp}/{w}.json"
                Path(files[w]).write_text(json.dumps(workload_rows(w, args.requests)))
            for rep in range(args.repeats):
                for w, topo, shadow in configs:
                    sides = [("new", REPO)]
                    # The old commit is timed with shadow off: aggregated for the
                    # speed-up targets, 1P+1D for its own 1P+1D / aggregated ratio.
                    if old_tree is not None and not shadow:
                        sides = [("old", old_tree), ("new", REPO)]
                    for side, tree in sides:
                        old = side == "old" and not old_knows_caching
                        cluster = cluster_dict(
                            topo, shadow, old=old, caching=args.prefix_caching, async_decode=args.async_scheduling
                        )
                        r = run_child(tree, files[w], cluster)
                        runs.setdefault((w, topo, shadow, side), []).append(r)
                        print(
                            f"rep {rep} {w} {topo} shadow={'on' if shadow else 'off'} {side}: "
                            f"{r['wall_s']:.2f} s, {r['max_rss_MB']:.0f} MB, {r['decode_tokens']} tokens, "
                            f"{r['simulated_s']:.1f} simulated s",
                            flush=True,
                        )
    finally:
        if old_tree is not None:
            _drop_worktree(old_tree)

    text = _entry(args, runs, names, measured, old_knows_caching)
    print(text)
    if args.record:
        from benchmarks.results_md import record_entry

        record_entry("## In-process runtime speed (benchmarks/inproc_speed.py)", text)


def _med(rs: list[dict], key: str) -> float:
    return statistics.median(r[key] for r in rs)


def _paired(over: list[dict], under: list[dict], fmt: str) -> str:
    """The ratio repeat by repeat (runs of one repeat ran back to back, so a
    slow spell of the shared machine hits both sides of a pair alike)."""
    ratios = [a["wall_s"] / b["wall_s"] for a, b in zip(over, under)]
    each = ", ".join(format(r, fmt) for r in ratios)
    lo, hi = ratio_interval([a["wall_s"] for a in over], [b["wall_s"] for b in under])
    return (
        f"repeat by repeat {each} (median {format(statistics.median(ratios), fmt)}x); "
        f"90 % bootstrap interval of the ratio of medians {format(lo, fmt)}–{format(hi, fmt)}x"
    )


def ratio_interval(over: list[float], under: list[float], draws: int = 4000) -> tuple[float, float]:
    """A 90 % bootstrap interval of median(over) / median(under): the
    repeats (pairs run back to back) resampled with replacement, seeded, so
    an entry says how far this shared machine's noise leaves the ratio
    uncertain (with few repeats the interval is coarse, not exact)."""
    rng = random.Random(0)
    pairs = list(zip(over, under))
    ratios = sorted(
        statistics.median(a for a, _ in sample) / statistics.median(b for _, b in sample)
        for sample in (rng.choices(pairs, k=len(pairs)) for _ in range(draws))
    )
    return ratios[int(0.05 * draws)], ratios[int(0.95 * draws) - 1]


def _entry(args, runs: dict, names: list[str], tree: str, old_knows_caching: bool = False) -> str:
    from benchmarks.tree_state import machine_line

    lines = [
        f"### {datetime.now(UTC):%Y-%m-%d %H:%M} UTC — W1/W2, {args.requests} requests, "
        f"median of {args.repeats}" + (f", against {args.old_commit}" if args.old_commit else ""),
        "",
        f"{machine_line()} Tree: {tree}. "
        "`max_num_seqs` 128, `max_num_batched_tokens` 4096, 7,424 blocks of 16, `synthetic-8b`, prefix caching "
        f"{'**on**' if args.prefix_caching else 'off'}"
        + ("; decode nodes with **async scheduling**" if args.async_scheduling else "")
        + "; W1 ShareGPT-like lengths, Poisson 10 req/s; W2 512 -> 256 "
        "tokens, Poisson 6 req/s; seed 0. "
        f"Command: `.venv/bin/python -m benchmarks.inproc_speed --requests {args.requests} --repeats {args.repeats}"
        + (f" --old-commit {args.old_commit}" if args.old_commit else "")
        + (f" --workloads {args.workloads}" if args.workloads != "W1,W2" else "")
        + (" --prefix-caching" if args.prefix_caching else "")
        + (" --async-scheduling" if args.async_scheduling else "")
        + " --record`.",
        "",
        "| workload | nodes | shadow KV | tree | wall s (median) | runs | CPU s (median) | simulated s | "
        "decode tokens | decode tok / wall s | req / wall s | peak RSS MB |",
        "|---|---|---|---|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for (w, topo, shadow, side), rs in runs.items():
        wall = _med(rs, "wall_s")
        each = ", ".join(f"{r['wall_s']:.2f}" for r in rs)
        rss = max(r["max_rss_MB"] for r in rs)
        lines.append(
            f"| {w} | {topo} | {'on' if shadow else 'off'} | {side} | {wall:.2f} | "
            f"{each} | {_med(rs, 'cpu_s'):.2f} | {rs[0]['simulated_s']:.1f} | {rs[0]['decode_tokens']} | "
            f"{rs[0]['decode_tokens'] / wall:,.0f} | {args.requests / wall:,.0f} | {rss:.0f} |"
        )
    lines.append("")
    for w in names:
        new_off = _med(runs[(w, "agg", False, "new")], "wall_s")
        if (w, "agg", False, "old") in runs:
            old_off = _med(runs[(w, "agg", False, "old")], "wall_s")
            # (The targets are for prefix caching off, against fbeab57.)
            target = "" if args.prefix_caching or args.async_scheduling else f" (target >= {10 if w == 'W1' else 5}x)"
            cpu = _med(runs[(w, "agg", False, "old")], "cpu_s") / _med(runs[(w, "agg", False, "new")], "cpu_s")
            o, n = runs[(w, "agg", False, "old")][0], runs[(w, "agg", False, "new")][0]
            same = (o["simulated_s"], o["decode_tokens"], o["steps"]) == (
                n["simulated_s"],
                n["decode_tokens"],
                n["steps"],
            )
            lines.append(
                f"- {w}: the same work on both sides: {'yes' if same else 'NO'} (simulated {o['simulated_s']:.3f} / "
                f"{n['simulated_s']:.3f} s, {o['decode_tokens']} / {n['decode_tokens']} decode tokens, "
                f"{o['steps']} / {n['steps']} steps; the old tree validated the same cluster spec"
                + ("" if args.prefix_caching or old_knows_caching else " less `enable_prefix_caching`")
                + ", and imported its own code: {o_file})".replace("{o_file}", o["engine_file"])
            )
            lines.append(
                f"- {w}: {args.old_commit} / current (aggregated, shadow off): **{old_off / new_off:.1f}x** "
                f"wall, {cpu:.1f}x CPU{target}; "
                + _paired(runs[(w, "agg", False, "old")], runs[(w, "agg", False, "new")], ".1f")
            )
        # (The targets are for the engine defaults: synchronous decode nodes.)
        sync_target = (lambda t: "") if args.async_scheduling else (lambda t: f" (target <= {t})")
        new_on = _med(runs[(w, "agg", True, "new")], "wall_s")
        lines.append(
            f"- {w}: shadow on / off (aggregated): {new_on / new_off:.2f}x{sync_target('1.3x')}; "
            + _paired(runs[(w, "agg", True, "new")], runs[(w, "agg", False, "new")], ".2f")
        )
        pd_off = _med(runs[(w, "1P1D", False, "new")], "wall_s")
        lines.append(
            f"- {w}: 1P+1D / aggregated (shadow off): {pd_off / new_off:.2f}x{sync_target('1.2x')}; "
            + _paired(runs[(w, "1P1D", False, "new")], runs[(w, "agg", False, "new")], ".2f")
        )
        if (w, "1P1D", False, "old") in runs:
            # The old tree's own ratio, and how much faster 1P+1D got: the
            # fast paths take out per-token work, which both runs share, so
            # the per-step work 1P+1D has more of weighs more (docs/fast-paths.md).
            o, n = runs[(w, "1P1D", False, "old")][0], runs[(w, "1P1D", False, "new")][0]
            same = all(o[k] == n[k] for k in ("simulated_s", "decode_tokens", "steps"))
            lines.append(
                f"- {w}: 1P+1D, the same work on both sides: {'yes' if same else 'NO'} (simulated "
                f"{o['simulated_s']:.3f} / {n['simulated_s']:.3f} s, {o['steps']} / {n['steps']} steps)"
            )
            old_pd = _med(runs[(w, "1P1D", False, "old")], "wall_s")
            old_agg = _med(runs[(w, "agg", False, "old")], "wall_s")
            lines.append(
                f"- {w}: 1P+1D / aggregated on {args.old_commit}: {old_pd / old_agg:.2f}x; "
                + _paired(runs[(w, "1P1D", False, "old")], runs[(w, "agg", False, "old")], ".2f")
            )
            lines.append(
                f"- {w}: {args.old_commit} / current (1P+1D, shadow off): {old_pd / pd_off:.1f}x; "
                + _paired(runs[(w, "1P1D", False, "old")], runs[(w, "1P1D", False, "new")], ".1f")
            )
        # The same ratio per step simulated: 1P+1D simulates more steps (its
        # decode steps carry no prefill, and a prefill node steps too), each
        # with its step record (docs/fast-paths.md).
        pd_steps, agg_steps = runs[(w, "1P1D", False, "new")][0]["steps"], runs[(w, "agg", False, "new")][0]["steps"]
        lines.append(
            f"- {w}: per step simulated, 1P+1D / aggregated: {(pd_off / pd_steps) / (new_off / agg_steps):.2f}x "
            f"({pd_steps} / {agg_steps} steps, {1e6 * pd_off / pd_steps:.1f} / {1e6 * new_off / agg_steps:.1f} "
            "wall µs a step)"
        )
    w1_rss = [r["max_rss_MB"] for (w, *_, side), rs in runs.items() if w == "W1" and side == "new" for r in rs]
    if w1_rss:  # (not with --workloads W2)
        lines.append(f"- W1 peak RSS (any configuration): {max(w1_rss):.0f} MB (target <= 200 MB).")
    lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
