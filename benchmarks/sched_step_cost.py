"""Cost of one v1 scheduler step: the median wall time of `schedule()` and of
`update_from_output()` in a steady decode loop with N running requests
(N = 64, 256, 1024), ours in-process and vLLM 0.33.0's in its oracle venv, in
the same run. Target: ours <= 1/3 of vLLM's at N = 256.

    .venv/bin/python -m benchmarks.sched_step_cost [--sizes 64 256 1024] [--steps 300] [--no-vllm] [--record]

`--record` appends the table to benchmarks/RESULTS.md. Not a test: nothing here
asserts a time.

Set-up, identical on both sides: FCFS, synchronous `Scheduler` (depth 1, fence
off: the production default), 32-token prompts, ignore_eos, huge max_tokens,
enough blocks, `max_num_seqs = N`, budget max(8192, N). The N requests are
added and stepped until every one decodes one token per step (plus a short
warm-up); then `steps` steps are timed, each call separately with
`perf_counter_ns`, after `gc.freeze()` as vLLM's EngineCore does once started;
the fake `ModelRunnerOutput` (one token per request) is built outside the timed
region. `steady_decode_cost` is the one loop both sides run:
the oracle driver (`tools/oracle/v1_bench.py`) imports this file by path, so it
must stay free of project imports at module level.
"""

from __future__ import annotations

import argparse
import gc
import math
import os
import platform
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

PROMPT_LEN = 32
TOKEN_ID = 1000
WARMUP_STEPS = 30
SIZES = (64, 256, 1024)
TARGET_RATIO = 1 / 3
RESULTS = Path(__file__).resolve().parent / "RESULTS.md"


def bench_config(n: int, steps: int) -> dict:
    """Scheduler shape for N running requests; enough blocks that nobody is ever preempted."""
    # The oracle's OPT config caps max_model_len at 2048; the sequences must stay below it.
    max_model_len = 2048
    longest = PROMPT_LEN + WARMUP_STEPS + steps + 64  # + prefill steps, with slack
    if longest > max_model_len:
        raise ValueError(f"steps={steps} is too many: sequences would pass max_model_len={max_model_len}")
    blocks_per_request = math.ceil(longest / 16) + 1
    return {
        "max_num_seqs": n,
        "max_num_batched_tokens": max(8192, n),
        "max_model_len": max_model_len,
        "num_blocks": n * blocks_per_request + 16,
        "block_size": 16,
        "max_tokens": 10**6,
    }


def steady_decode_cost(sched, requests, make_model_runner_output, steps: int) -> dict:
    """Adds `requests`, reaches steady decode, times `steps` steps. Returns medians in µs."""
    n = len(requests)
    for request in requests:
        sched.add_request(request)
    for _ in range(10 * n):  # prefill (chunked by the budget) until all N decode
        so = sched.schedule()
        sched.update_from_output(so, make_model_runner_output(so, TOKEN_ID))
        if len(so.num_scheduled_tokens) == n and so.total_num_scheduled_tokens == n:
            break
    else:
        raise RuntimeError(f"never reached steady decode with {n} requests")
    for _ in range(WARMUP_STEPS):
        so = sched.schedule()
        sched.update_from_output(so, make_model_runner_output(so, TOKEN_ID))
    # As vLLM's EngineCore does after start-up (freeze_gc_heap): move everything
    # alive into the permanent generation, so the cyclic GC does not rescan the
    # interpreter's static heap (torch and friends on the vLLM side) while serving.
    gc.collect()
    gc.freeze()
    sched_ns: list[int] = []
    update_ns: list[int] = []
    sched_cpu: list[int] = []
    update_cpu: list[int] = []
    clock, cpu = time.perf_counter_ns, time.thread_time_ns
    for _ in range(steps):
        c0, t0 = cpu(), clock()
        so = sched.schedule()
        t1, c1 = clock(), cpu()
        mro = make_model_runner_output(so, TOKEN_ID)
        c2, t2 = cpu(), clock()
        sched.update_from_output(so, mro)
        t3, c3 = clock(), cpu()
        sched_ns.append(t1 - t0)
        update_ns.append(t3 - t2)
        sched_cpu.append(c1 - c0)
        update_cpu.append(c3 - c2)
        if so.total_num_scheduled_tokens != n:
            gc.unfreeze()
            raise RuntimeError(f"left steady decode: {so.total_num_scheduled_tokens} tokens for {n} requests")
    gc.unfreeze()
    return {
        "n": n,
        "steps": steps,
        "schedule_us": statistics.median(sched_ns) / 1000,
        "update_us": statistics.median(update_ns) / 1000,
        "schedule_p90_us": sorted(sched_ns)[int(0.9 * steps)] / 1000,
        "update_p90_us": sorted(update_ns)[int(0.9 * steps)] / 1000,
        # CPU time of this thread: what the step costs when other processes on
        # this shared machine take the CPU away in the middle of it.
        "schedule_cpu_us": statistics.median(sched_cpu) / 1000,
        "update_cpu_us": statistics.median(update_cpu) / 1000,
    }


def best_of(runs: list[dict]) -> dict:
    """The repeat least disturbed by other processes on this shared machine:
    the lowest schedule + update median (as timeit takes the minimum)."""
    best = min(runs, key=lambda r: r["schedule_us"] + r["update_us"])
    return dict(best, repeats=len(runs))


def _ours_one_run(n: int, steps: int, prefix_caching: bool = False) -> dict:
    from engine.testing import create_requests, create_scheduler, make_model_runner_output

    cfg = bench_config(n, steps)
    sched = create_scheduler(
        max_num_seqs=cfg["max_num_seqs"],
        max_num_batched_tokens=cfg["max_num_batched_tokens"],
        num_blocks=cfg["num_blocks"],
        block_size=cfg["block_size"],
        max_model_len=cfg["max_model_len"],
        enable_prefix_caching=prefix_caching,
    )
    reqs = create_requests(n, num_tokens=PROMPT_LEN, max_tokens=cfg["max_tokens"], ignore_eos=True)
    return steady_decode_cost(sched, reqs, make_model_runner_output, steps)


def measure(sizes, steps: int, repeat: int, with_vllm: bool) -> tuple[list[dict], list[dict] | None, str]:
    """Ours in-process and vLLM's through a long-lived oracle session, interleaved
    run by run (ours N, vLLM N, next N, ..., then the next repeat) so that both
    sides see the same load on this shared machine. Returns the best run of each
    cell for each side, and where vLLM's figures came from."""
    session, source = None, "not requested (--no-vllm)"
    if with_vllm:
        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools" / "oracle"))
        import launch

        reason = launch.oracle_missing_reason("v1")
        if reason:
            source = f"absent ({reason})"
        else:
            session = launch.OracleSession("v1_bench.py")
            source = f"vLLM {session.hello['vllm_version']}"
    ours_runs: dict[int, list[dict]] = {n: [] for n in sizes}
    cached_runs: dict[int, list[dict]] = {n: [] for n in sizes}
    vllm_runs: dict[int, list[dict]] = {n: [] for n in sizes}
    try:
        for _ in range(repeat):
            for n in sizes:
                ours_runs[n].append(_ours_one_run(n, steps))
                cached_runs[n].append(_ours_one_run(n, steps, prefix_caching=True))
                if session is not None:
                    vllm_runs[n].append(session.ask({"n": n, "steps": steps}))
    finally:
        if session is not None:
            session.close()
    ours = [best_of(ours_runs[n]) for n in sizes]
    for row, n in zip(ours, sizes):
        cached = best_of(cached_runs[n])
        row["cached_schedule_us"], row["cached_update_us"] = cached["schedule_us"], cached["update_us"]
    vllm = [best_of(vllm_runs[n]) for n in sizes] if session is not None else None
    return ours, vllm, source


def calibration_seconds() -> float:
    """A fixed pure-Python loop: how fast this machine ran Python during the run
    (figures of runs with different calibrations are not comparable)."""
    t0 = time.perf_counter()
    x = 0
    for i in range(3_000_000):
        x += i * 2
    return time.perf_counter() - t0


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return f"{cpu}, {os.cpu_count()} CPUs, Python {platform.python_version()}, load average {load:.1f}"


def table(ours: list[dict], vllm: list[dict] | None) -> str:
    by_n = {r["n"]: r for r in vllm or []}
    lines = [
        "| N running | ours schedule() µs | ours update() µs | ours total µs | vLLM schedule() µs | vLLM update() µs "
        "| vLLM total µs | ours / vLLM |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in ours:
        total = r["schedule_us"] + r["update_us"]
        v = by_n.get(r["n"])
        if v:
            vtotal = v["schedule_us"] + v["update_us"]
            vcols = f"{v['schedule_us']:,.0f} | {v['update_us']:,.0f} | {vtotal:,.0f} | {total / vtotal:.2f}"
        else:
            vcols = "– | – | – | –"
        lines.append(f"| {r['n']} | {r['schedule_us']:,.0f} | {r['update_us']:,.0f} | {total:,.0f} | {vcols} |")
    return "\n".join(lines)


def caching_table(ours: list[dict]) -> str:
    """Ours with prefix caching on against off (same run, interleaved)."""
    lines = [
        "| N running | APC off total µs | APC on schedule() µs | APC on update() µs | APC on total µs | on / off |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for r in ours:
        off = r["schedule_us"] + r["update_us"]
        on = r["cached_schedule_us"] + r["cached_update_us"]
        lines.append(
            f"| {r['n']} | {off:,.0f} | {r['cached_schedule_us']:,.0f} | {r['cached_update_us']:,.0f} | "
            f"{on:,.0f} | {on / off:.2f} |"
        )
    return "\n".join(lines)


def verdict(ours: list[dict], vllm: list[dict] | None) -> str:
    o = next((r for r in ours if r["n"] == 256), None)
    v = next((r for r in vllm or [] if r["n"] == 256), None)
    if o is None or v is None:
        return "Target (ours <= 1/3 of vLLM at N=256): not evaluated (no N=256 pair in this run)."
    ratio = (o["schedule_us"] + o["update_us"]) / (v["schedule_us"] + v["update_us"])
    ok = "MEETS" if ratio <= TARGET_RATIO else "MISSES"
    return f"Ratio ours / vLLM at N=256: **{ratio:.2f}** ({ok} the <= 0.33 target)."


SECTION = "## v1 scheduler step cost (benchmarks/sched_step_cost.py)"


def record(text: str) -> None:
    """`text` is the section heading, a blank line, then the entry."""
    from benchmarks.results_md import record_entry

    record_entry(SECTION, text.split("\n", 2)[2])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sizes", type=int, nargs="+", default=list(SIZES))
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--repeat", type=int, default=3, help="runs per size and side; the best is kept")
    ap.add_argument("--no-vllm", action="store_true", help="measure ours only")
    ap.add_argument("--record", action="store_true", help="append the table to benchmarks/RESULTS.md")
    args = ap.parse_args(argv)
    if any(n < 1 for n in args.sizes) or not 10 <= args.steps <= 1500:
        ap.error("sizes must be >= 1 and --steps in 10..1500")

    if args.repeat < 1:
        ap.error("--repeat must be >= 1")

    calib_before = calibration_seconds()
    ours, vllm, source = measure(args.sizes, args.steps, args.repeat, not args.no_vllm)
    calib_after = calibration_seconds()
    stamp = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    text = "\n".join(
        [
            "## v1 scheduler step cost (benchmarks/sched_step_cost.py)",
            "",
            f"### {stamp} — median of {args.steps} steady decode steps, FCFS, depth 1, fence off, "
            f"best of {args.repeat} runs per cell",
            "",
            f"Machine: {machine()}; calibration loop {calib_before:.2f} s before / {calib_after:.2f} s after "
            f"(3M-iteration pure-Python loop; larger = slower machine at that moment). vLLM side: {source}, "
            "measured in the same run with the same loop, interleaved with ours run by run.",
            "",
            table(ours, vllm),
            "",
            verdict(ours, vllm),
            "",
            "Prefix caching (APC) on against off, ours, same loop (target: on <= 1.3x off):",
            "",
            caching_table(ours),
        ]
    )
    print(text)
    if args.record:
        record(text)
        print(f"\nappended to {RESULTS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
