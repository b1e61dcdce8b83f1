"""Where an in-process run's wall time goes (issue 15), by event handler and
node: what a run of 1 prefill + 1 decode node spends beyond the aggregated
run, and on which side of the hand-over.

    .venv/bin/python -m benchmarks.inproc_breakdown [--workload W1] [--requests 4000]
        [--repeats 3] [--shadow] [--prefix-caching] [--record]

The workloads and cluster settings are benchmarks/inproc_speed.py's (prefix
caching off; `--prefix-caching`: on, the engine's default). Each run times every event the loop dispatches, by the
handler it calls and the node it concerns (a handler that starts more work,
such as a step's end that schedules the next step or fast-forward, is
charged with all of it), and counts per request what the run did: events,
steps scheduled one by one and forwarded, forwards, empty steps. Timing adds
~5-10 % to a run's wall time (against plain runs alongside, 4,000 requests);
the counts are exact and do not move between runs. Runs
alternate aggregated and 1P+1D in one process; times are medians over the
repeats.

The handler of an event is wrapped where it is scheduled (`EventLoop.at`,
`at_each`, a timer's function) by an object that answers `__func__` and
`__self__` like the bound method it wraps, so the fast-forward's look at the
queue (cluster/inproc/fast_forward.py) sees the same events and the run is
the one inproc_speed times.

`--record` adds the figures to benchmarks/RESULTS.md (newest first).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from benchmarks.inproc_speed import cluster_dict, workload_rows
from benchmarks.tree_state import machine_line, tree_label

TOPOLOGIES = ("agg", "1P1D")


class TimedHandler:
    """An event's handler, timed when it runs; answers `__func__`, `__self__`
    and `__name__` as the bound method it wraps does (the fast-forward reads
    them; `__name__` on the compiled build, docs/compiled.md)."""

    __slots__ = ("fn", "key", "times", "__func__", "__self__", "__name__")

    def __init__(self, fn: Callable, key: str, times: defaultdict[str, float]) -> None:
        self.fn = fn
        self.key = key
        self.times = times
        self.__func__ = getattr(fn, "__func__", None)
        self.__self__ = getattr(fn, "__self__", None)
        self.__name__ = getattr(fn, "__name__", None)

    def __call__(self, *args: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return self.fn(*args)
        finally:
            self.times[self.key] += time.perf_counter() - t0


def _node_of(fn: Callable, args: tuple, executors: dict[int, str]) -> str:
    """The node an event concerns: its handler's owner (a node, its engine
    loop, its executor, its forwarder), or the node its first argument or its
    closure names (the cluster's handlers take the node first; a node's
    callbacks are closures over it); the KV transport's own events (a pull
    served, a done report delivered) concern the hand-over; else the proxy."""
    from cluster.inproc.kv_transport import InProcKVTransport

    owner = getattr(fn, "__self__", None)
    if id(owner) in executors:
        return executors[id(owner)]
    if isinstance(owner, InProcKVTransport):
        return "KV hand-over"
    candidates = [owner, getattr(owner, "node", None), getattr(owner, "core", None), *args[:1]]
    for cell in getattr(fn, "__closure__", None) or ():
        try:
            candidates.append(cell.cell_contents)
        except ValueError:  # an empty cell
            pass
    for obj in candidates:
        name = obj if isinstance(obj, str) else getattr(obj, "name", None)  # the proxy links take node names
        if isinstance(name, str) and name.split("-")[0] in ("prefill", "decode"):
            return name
    return "proxy"


def _key(fn: Callable, args: tuple, executors: dict[int, str]) -> str:
    name = getattr(fn, "__qualname__", type(fn).__name__)
    return f"{name} [{_node_of(fn, args, executors)}]"


class HandlerKeys:
    """`_key` of an event, remembered by what decides it (the handler's
    function or code, its owner, its first argument when that is a node, and
    a closure's first cell): working it out for every event would cost more
    than the handler it times."""

    def __init__(self, executors: dict[int, str]) -> None:
        self.executors = executors
        self._known: dict[tuple, str] = {}

    def __call__(self, fn: Callable, args: tuple) -> str:
        first = args[0] if args else None
        closure = getattr(fn, "__closure__", None)
        sig = (
            getattr(fn, "__func__", None) or getattr(fn, "__code__", None) or fn,
            id(getattr(fn, "__self__", None)),
            id(first) if isinstance(getattr(first, "name", None), str) else None,
            _cell(closure[0]) if closure else None,
        )
        key = self._known.get(sig)
        if key is None:
            key = self._known[sig] = _key(fn, args, self.executors)
        return key


def _cell(cell: Any) -> int | None:
    try:
        return id(cell.cell_contents)
    except ValueError:  # an empty cell
        return None


def instrument(loop: Any, executors: dict[int, str], times: defaultdict[str, float], counts: Counter) -> None:
    """Wrap every handler the loop is given from now on (see the module's
    docstring); `executors`: each node's executor (by id) and its node's name."""
    at, at_each, fire = loop.at, loop.at_each, loop._fire
    key_of = HandlerKeys(executors)

    def timed_at(t: float, fn: Callable, *args: Any) -> None:
        if fn is fire:  # a timer: keep `_fire` (the loop knows it) and time what it calls
            timer, inner, inner_args = args
            key = key_of(inner, inner_args) + " (timer)"
            counts[key] += 1
            at(t, fn, timer, TimedHandler(inner, key, times), inner_args)
            return
        key = key_of(fn, args)
        counts[key] += 1
        at(t, TimedHandler(fn, key, times), *args)

    def timed_at_each(ts: list[float], fn: Callable, args: list[tuple]) -> None:
        key = key_of(fn, args[0] if args else ())
        counts[key] += len(ts)
        at_each(ts, TimedHandler(fn, key, times), args)

    loop.at, loop.at_each = timed_at, timed_at_each


def one_run(workload: str, n: int, topology: str, shadow: bool, caching: bool = False) -> dict:
    from cluster.inproc.cluster import InProcCluster
    from cluster.inproc.collector import collect_earlier_runs, collector_paused
    from cluster.spec import ClusterSpec
    from engine.records import WorkloadRequest

    wl = [WorkloadRequest(r[0], r[1], r[2], r[3]) for r in workload_rows(workload, n)]
    spec = ClusterSpec.model_validate(cluster_dict(topology, shadow, old=False, caching=caching))
    times: defaultdict[str, float] = defaultdict(float)
    counts: Counter = Counter()
    with collector_paused():
        cluster = InProcCluster(spec, seed=0)
        executors = {id(e): name for name, e in cluster._executors.items()}
        instrument(cluster.loop, executors, times, counts)
        cluster.submit(wl, None)
    collect_earlier_runs()  # not inside the timed run (cluster/inproc/collector.py)
    t0 = time.perf_counter()
    result = cluster.run()
    wall = time.perf_counter() - t0
    forwarders = {f.node.name: f for f in cluster._forwarders}
    steps = Counter(s.node for s in result.steps)
    empty = Counter(s.node for s in result.steps if s.num_scheduled_tokens == 0)
    forwarded = {name: f.steps_forwarded for name, f in forwarders.items()}
    return {
        "result": result,
        "wall": wall,
        "times": times,
        "counts": counts,
        "events": result.extra["num_events"],
        "steps": {
            node: {
                "plain": steps[node] - forwarded.get(node, 0),
                "forwarded": forwarded.get(node, 0),
                "empty": empty[node],
                "forwards": forwarders[node].jumps if node in forwarders else 0,
                "admission": forwarders[node].admission_steps if node in forwarders else 0,
            }
            for node in sorted(steps)
        },
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workload", choices=("W1", "W2"), default="W1")
    ap.add_argument("--requests", type=int, default=4000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--shadow", action="store_true", help="shadow KV on")
    ap.add_argument("--prefix-caching", action="store_true", help="prefix caching on (the engine's default)")
    ap.add_argument("--record", action="store_true")
    args = ap.parse_args()
    if args.requests < 1 or args.repeats < 1:
        ap.error("--requests and --repeats must be at least 1")
    runs: dict[str, list[dict]] = {t: [] for t in TOPOLOGIES}
    for i in range(args.repeats):
        for topology in TOPOLOGIES:
            r = one_run(args.workload, args.requests, topology, args.shadow, args.prefix_caching)
            runs[topology].append(r)
            print(f"repeat {i + 1}: {topology} {r['wall']:.2f} s", flush=True)
    text = _entry(args, runs)
    print(text)
    if args.record:
        from benchmarks.results_md import record_entry

        record_entry("## In-process runtime, time by event handler (benchmarks/inproc_breakdown.py)", text)


def _medians(rs: list[dict]) -> tuple[float, dict[str, float]]:
    keys = set().union(*(r["times"] for r in rs))
    return statistics.median(r["wall"] for r in rs), {k: statistics.median(r["times"][k] for r in rs) for k in keys}


def _handler_rows(topology: str, rs: list[dict], n: int) -> tuple[list[str], dict[str, float], float]:
    """The table rows of one topology's handlers, its time by node, and its median wall time."""
    wall, med = _medians(rs)
    counts = rs[0]["counts"]
    rows: list[str] = []
    by_node: dict[str, float] = defaultdict(float)
    for key, t in sorted(med.items(), key=lambda kv: -kv[1]):
        by_node[key.rsplit("[", 1)[1].rstrip("]")] += t
        events = counts[key]
        rows.append(
            f"| {topology} | `{key}` | {events / n:.2f} | {1e6 * t / max(events, 1):.1f} | {1e6 * t / n:.1f} "
            f"| {100 * t / wall:.1f} % |"
        )
    own = wall - sum(med.values())
    rows.append(
        f"| {topology} | the loop itself (dispatch, timing) | | | {1e6 * own / n:.1f} | {100 * own / wall:.1f} % |"
    )
    return rows, by_node, wall


def _per_request(by_node: dict[str, float], n: int, against: float | None = None) -> str:
    parts = []
    for node, t in sorted(by_node.items(), key=lambda kv: -kv[1]):
        parts.append(f"{node} {1e6 * t / n:.0f}" + ("" if against is None else f" ({t / against:.2f}x)"))
    return ", ".join(parts)


def _entry(args: argparse.Namespace, runs: dict[str, list[dict]]) -> str:
    n = args.requests
    stamp = datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC")
    flags = (" --shadow" if args.shadow else "") + (" --prefix-caching" if args.prefix_caching else "")
    lines = [
        f"### {stamp} — {args.workload}, {n} requests, shadow KV {'on' if args.shadow else 'off'}, "
        f"prefix caching {'on' if args.prefix_caching else 'off'}, median of {args.repeats}",
        "",
        f"{machine_line()} Tree: {tree_label()}. Settings of inproc_speed.py. Command: `.venv/bin/python -m "
        f"benchmarks.inproc_breakdown --workload {args.workload} --requests {n} --repeats {args.repeats}{flags}"
        f"{' --record' if args.record else ''}`.",
        "",
        "| nodes | handler [node] | events / request | µs / event | µs / request | share of run |",
        "|---|---|---:|---:|---:|---:|",
    ]
    walls: dict[str, float] = {}
    by_node: dict[str, dict[str, float]] = {}
    for topology in TOPOLOGIES:
        rows, by_node[topology], walls[topology] = _handler_rows(topology, runs[topology], n)
        lines += rows
    lines += [
        "",
        "| nodes | node | steps one by one / request | of them admission steps | forwarded steps / request "
        "| forwards / request | empty steps / request |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for topology in TOPOLOGIES:
        for node, c in runs[topology][0]["steps"].items():
            lines.append(
                f"| {topology} | {node} | {c['plain'] / n:.2f} | {c['admission'] / n:.2f} | {c['forwarded'] / n:.2f} "
                f"| {c['forwards'] / n:.2f} | {c['empty'] / n:.2f} |"
            )
    agg, pd = walls["agg"], walls["1P1D"]
    events = [runs[t][0]["events"] / n for t in TOPOLOGIES]
    lines += [
        "",
        f"- Run wall time (median, timed): aggregated {agg:.2f} s, 1P+1D {pd:.2f} s: **{pd / agg:.2f}x**; events "
        f"per request {events[0]:.1f} and {events[1]:.1f}.",
        "- 1P+1D by node, µs per request (and against the whole aggregated run): "
        f"{_per_request(by_node['1P1D'], n, agg)}; aggregated: {_per_request(by_node['agg'], n)}.",
    ]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
