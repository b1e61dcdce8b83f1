"""A Ray run against the model: its in-process twin and the lines under the table.

The twin is the same scenario variant, workload and seed on the virtual
clock, with the network's wall times expressed in model time (delays and
jitter divided by `time_scale`, bandwidth multiplied by it, KV fault-policy
times divided by it) — what the Ray run would measure, divided by
`time_scale`, if it had no control-plane overhead. Each request's wall
TTFT and E2EL (divided by `time_scale`) are compared with the twin's
(cluster/distortion.py). Runs with faults, chaos or link outages have no
twin: their timing is the point.
"""

from __future__ import annotations

from dataclasses import replace
from statistics import mean

from cluster.distortion import LIMIT, request_distortion
from cluster.run_result import RunResult
from cluster.spec import ClusterSpec

from .scenario import Scenario

SPREAD_LIMIT_PCT = 10.0


def twin_spec(spec: ClusterSpec) -> ClusterSpec:
    ts = spec.time_scale
    doc = spec.model_dump()
    for link in doc["links"].values():
        link["delay_ms"] /= ts
        link["jitter_ms"] /= ts
        if link["bandwidth_MBps"] is not None:
            link["bandwidth_MBps"] *= ts
    for key in ("kv_pull_timeout_s", "kv_pull_deadline_s", "kv_pull_backoff_initial_s", "kv_pull_backoff_max_s"):
        doc[key] /= ts
    if doc["kv_hold_timeout_s"] is not None:
        doc["kv_hold_timeout_s"] /= ts
    doc["time_scale"] = 1.0
    return ClusterSpec.model_validate(doc)


def twin_request_distortion(run: RunResult, scenario: Scenario, variant: str, repeat: int) -> dict:
    from cluster.inproc import InProcCluster

    spec = scenario.cluster(variant)
    if scenario.file.faults or scenario.file.chaos is not None:
        return {"skipped": "faults or chaos: no in-process twin"}
    if any(link.outages for link in (spec.links.proxy, spec.links.kv, spec.links.stage)):
        return {"skipped": "link outages: no in-process twin"}
    seed = scenario.file.seed + repeat
    workload, max_concurrency = scenario.workload(variant, seed)
    twin = InProcCluster(twin_spec(spec), seed=seed)
    twin.submit(workload, max_concurrency)
    modelled = twin.run()

    def latencies(records) -> dict[str, tuple[float, float]]:
        out = {}
        for r in records:
            ttft, e2el = r.ttft, r.e2el
            if ttft is not None and e2el is not None:
                out[r.request_id] = (ttft, e2el)
        return out

    return request_distortion(latencies(run.requests), latencies(modelled.requests), spec.time_scale)


LATENCY_KEYS = ("median_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "median_itl_ms", "median_e2el_ms")
THROUGHPUT_KEYS = ("output_throughput", "request_throughput")
LATENCY_CLOCK = "model (wall / time_scale)"


def _scaled(t: float | None, ts: float) -> float | None:
    return None if t is None else t / ts


def to_model_time(run: RunResult) -> RunResult:
    """A Ray run with every request and step time in model seconds (wall /
    `time_scale`), so its latencies and throughputs read like an in-process
    run's of the same model. A step's `duration` is modelled already; the
    run's `extra` (kill times, distortion) stays on the wall clock."""
    ts = run.extra.get("time_scale") or 1.0
    requests = [
        replace(
            r,
            arrival_time=r.arrival_time / ts,
            first_scheduled_time=_scaled(r.first_scheduled_time, ts),
            remote_kv_wait_start=_scaled(r.remote_kv_wait_start, ts),
            remote_kv_wait_end=_scaled(r.remote_kv_wait_end, ts),
            token_times=[t / ts for t in r.token_times],
            finish_time=_scaled(r.finish_time, ts),
            ttft_breakdown=None if r.ttft_breakdown is None else {k: v / ts for k, v in r.ttft_breakdown.items()},
        )
        for r in run.requests
    ]
    steps = [replace(s, time=s.time / ts) for s in run.steps]
    return replace(run, duration=run.duration / ts, requests=requests, steps=steps)


def wall_clock_metrics(wall: dict, ts: float) -> dict:
    """The headline latencies and throughputs as the wall clock measured
    them, for `result["wall_clock"]` next to the model-time keys."""
    out: dict = {"time_scale": ts}
    for key in (*LATENCY_KEYS, *THROUGHPUT_KEYS, "duration"):
        if isinstance(wall.get(key), (int, float)):
            out[key] = wall[key]
    return out


def _spread_pct(values: list[float]) -> float:
    m = mean(values)
    return 100 * max(abs(v - m) for v in values) / m if m else 0.0


def distortion_lines(results: list[dict]) -> list[str]:
    """Under the table of a Ray run: each run's overhead against the scaled
    model, its requests against the twin, each variant's repeat spread, and a
    warning with a time_scale when the overhead is above the limit."""
    lines = [
        "time on Ray: latencies and throughputs are model time (wall / time_scale); "
        "overhead = wall beyond time_scale x modelled step:"
    ]
    warnings: dict[str, str] = {}
    by_variant: dict[str, list[dict]] = {}
    for r in results:
        by_variant.setdefault(r["variant"], []).append(r)
        d = r.get("extra", {}).get("distortion")
        if not d or "overhead_pct" not in d:
            continue
        req = d.get("requests", {})
        req_text = ""
        if "median_e2el_error_pct" in req and "median_ttft_error_pct" in req:
            req_text = (
                f"; requests vs model: TTFT {req['median_ttft_error_pct']:+.1f} %, "
                f"E2EL {req['median_e2el_error_pct']:+.1f} % (median)"
            )
        worst = d["nodes"][d["worst_node"]]
        lines.append(
            f"  {r['variant']} r{r['repeat']}: step overhead {d['overhead_pct']:.1f} % ({d['worst_node']}: "
            f"{worst['mean_overhead_ms']:.2f} ms on {worst['mean_scaled_ms']:.2f} ms per step){req_text}"
        )
        wall = r.get("wall_clock", {})
        if wall.get("time_scale", 1.0) != 1.0 and {"median_ttft_ms", "mean_tpot_ms", "output_throughput"} <= set(wall):
            lines.append(
                f"    on the wall clock (time_scale {wall['time_scale']:g}): "
                f"median TTFT {wall['median_ttft_ms']:.1f} ms, "
                f"mean TPOT {wall['mean_tpot_ms']:.2f} ms, output throughput {wall['output_throughput']:.1f} tok/s"
            )
        if "warning" in d:
            warnings[r["variant"]] = d["warning"]
    for variant, runs in by_variant.items():
        if len(runs) > 1:
            dur = _spread_pct([r["duration"] for r in runs])
            thr = _spread_pct([r["output_throughput"] for r in runs])
            flag = "" if max(dur, thr) <= SPREAD_LIMIT_PCT else f"  (beyond ±{SPREAD_LIMIT_PCT:g} %)"
            lines.append(f"  {variant}: repeat spread duration ±{dur:.1f} %, output_throughput ±{thr:.1f} %{flag}")
    for variant, text in warnings.items():
        lines.append(f"warning: {variant}: {text}")
    if len(lines) == 1:
        return []
    if not warnings:
        lines.append(f"  overhead under {100 * LIMIT:.0f} % in every run")
    return lines
