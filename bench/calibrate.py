"""`disagg-sim calibrate`: fit a cost model to measured step times and write
a preset file a scenario names (`cluster.cost_model: my-preset.json`).

Two kinds of measurement in their own format:
- **per-step timings** — JSONL, one step per line, with the step's shape
  and its time: the simulator's own `*.steps.jsonl` (`num_prefill_tokens`,
  `num_decode_tokens`, `batch_size`, `context_tokens`,
  `decode_context_tokens`, `prefill_attention_pairs`, `duration` in
  seconds) or the same fields under StepShape's names with `duration_ms`;
- **a `vllm bench serve` results JSON** saved with per-request details
  (`input_lens`, `output_lens`, `ttfts`, `itls`, and `max_concurrency`):
  each request gives a prefill point (its TTFT as one step that prefills its
  prompt) and a decode point (its median ITL as one decode step of
  `max_concurrency` sequences at the mean context). This is an
  approximation — TTFT also holds queueing and HTTP time, and a batch is
  not always full — stated in docs/cost-model.md.

Two more readers turn what a vLLM server writes into such points: its log's
stats lines (bench/vllm_log_stats.py, `--format vllm-log`) and its torch
profiler trace (bench/vllm_profiler_trace.py, `--format torch-trace`).

Two kinds of model: `linear` (least squares on the four coefficients of
engine/cost_model.py) and `roofline` (the host overhead and the three
efficiency factors of a given model and GPU, engine/roofline.py, by a
multiplicative coordinate search; the data must hold both compute-bound and
memory-bound steps for the efficiencies to be identifiable).

From a bench JSON, `--front-end-out` also fits the API server's terms
(engine/front_end.py): what each request's TTFT holds beyond the preset's
prefill step (least squares on the prompt length: request_ms + 2 x ipc_ms
as the intercept, prompt_token_us the slope) and what its median ITL holds
beyond the preset's decode step (output_token_us); the roofline fit then
runs on the TTFTs less that front-end time. Exact where nothing queues
(concurrency 1); under load queueing lands in these terms too.
"""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path
from statistics import median

import numpy as np

from engine.cost_model import CostModel, StepShape, get_cost_model
from engine.roofline import RooflineCostModel

from .errors import InputError

Point = tuple[StepShape, float]  # (shape, seconds)

_STEP_KEYS = {
    "prefill_tokens": ("prefill_tokens", "num_prefill_tokens"),
    "decode_tokens": ("decode_tokens", "num_decode_tokens"),
    "batch_size": ("batch_size",),
    "context_tokens": ("context_tokens",),
    "decode_context_tokens": ("decode_context_tokens",),
    "prefill_attention_pairs": ("prefill_attention_pairs",),
}


def _shape_from_row(row: dict, where: str) -> StepShape:
    values = {}
    for field_name, keys in _STEP_KEYS.items():
        key = next((k for k in keys if k in row), None)
        if key is None:
            raise InputError(f"{where}: {keys[-1]} is missing; allowed: a step with {sorted(_STEP_KEYS)}")
        v = row[key]
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            raise InputError(f"{where}: {key}={v!r} is invalid; allowed: an int >= 0")
        values[field_name] = v
    return StepShape(**values)


def load_step_timings(path: Path, node: str | None = None) -> list[Point]:
    points: list[Point] = []
    with open(path, encoding="utf-8") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                row = json.loads(line)
            except ValueError as err:
                raise InputError(f"{where}: not JSON ({err}); allowed: one JSON object per line") from None
            if node is not None and row.get("node") != node:
                continue
            shape = _shape_from_row(row, where)
            if "duration_ms" in row:
                seconds = row["duration_ms"] / 1000.0
            elif "duration" in row:
                seconds = row["duration"]
            else:
                raise InputError(f"{where}: duration (s) or duration_ms is missing")
            if shape.total_tokens and seconds > 0:
                points.append((shape, float(seconds)))
    if not points:
        raise InputError(f"{path}: no step with tokens and a duration > 0" + (f" on node {node!r}" if node else ""))
    return points


def load_bench_serve(path: Path, front_end_s=None) -> list[Point]:
    """Points from a `vllm bench serve --save-result --save-detailed` JSON;
    `front_end_s(prompt_len)`, if given, is taken off each TTFT first."""
    data = load_bench_json(path)
    conc = data.get("max_concurrency") or 1
    ins, outs = data["input_lens"], data["output_lens"]
    mean_ctx = int(sum(i + o / 2 for i, o in zip(ins, outs)) / max(len(ins), 1))
    points: list[Point] = []
    for n_in, ttft, itls in zip(ins, data["ttfts"], data["itls"]):
        if front_end_s is not None and ttft:
            ttft = ttft - front_end_s(n_in)
        if ttft and ttft > 0 and n_in > 0:
            pairs = n_in * (n_in + 1) // 2
            points.append((StepShape(n_in, 0, n_in, 1, 0, pairs), float(ttft)))
        if itls:
            ctx = conc * mean_ctx
            points.append((StepShape(0, conc, ctx, conc, ctx, 0), float(median(itls))))
    if not points:
        raise InputError(f"{path}: no request with a TTFT or ITLs")
    return points


def load_bench_json(path: Path) -> dict:
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise InputError(f"{path}: cannot read ({err}); allowed: a vllm bench serve results JSON") from None
    for key in ("input_lens", "output_lens", "ttfts", "itls"):
        if not isinstance(data.get(key), list):
            raise InputError(f"{path}: {key} is missing; allowed: a results JSON saved with --save-detailed")
    return data


def fit_front_end(data: dict, model) -> dict[str, float]:
    """The API server's terms from per-request TTFTs and ITLs (module docstring):
    {request_ms, prompt_token_us, output_token_us, ipc_ms}; ipc_ms is folded
    into request_ms (one intercept cannot tell them apart)."""
    conc = data.get("max_concurrency") or 1
    ins, outs = data["input_lens"], data["output_lens"]
    rows, resid = [], []
    itl_resid = []
    mean_ctx = int(sum(i + o / 2 for i, o in zip(ins, outs)) / max(len(ins), 1))
    decode = model.step_time(StepShape(0, conc, conc * mean_ctx, conc, conc * mean_ctx, 0))
    for n_in, ttft, itls in zip(ins, data["ttfts"], data["itls"]):
        if ttft and ttft > 0 and n_in > 0:
            prefill = model.step_time(StepShape(n_in, 0, n_in, 1, 0, n_in * (n_in + 1) // 2))
            rows.append([1.0, float(n_in)])
            resid.append(ttft - prefill)
        if itls:
            itl_resid.append(median(itls) - decode)
    if not rows:
        raise InputError("--front-end-out: no request with a TTFT")
    coef, *_ = np.linalg.lstsq(np.array(rows), np.array(resid), rcond=None)
    intercept, slope = float(coef[0]), float(coef[1])
    if slope < 0:  # not identifiable from these lengths: all of it per request
        intercept, slope = float(np.mean(resid)), 0.0
    out_s = max(0.0, float(median(itl_resid))) if itl_resid else 0.0
    return {
        "request_ms": round(max(0.0, intercept) * 1e3, 4),
        "prompt_token_us": round(slope * 1e6, 4),
        "output_token_us": round(out_s * 1e6, 4),
        "ipc_ms": 0.0,
    }


def _rel_errors(model, points: list[Point]) -> np.ndarray:
    return np.array([(model.step_time(s) - t) / t for s, t in points])


def fit_linear(points: list[Point], name: str = "calibrated") -> CostModel:
    """Least squares on relative error (each step weighs the same whatever its length)."""
    a = np.array([[1.0, s.prefill_tokens, s.decode_tokens, s.context_tokens / 1000.0] for s, _ in points], dtype=float)
    y = np.array([t * 1000.0 for _, t in points])
    w = 1.0 / y
    coef, *_ = np.linalg.lstsq(a * w[:, None], y * w, rcond=None)
    coef = np.clip(coef, 0.0, None)
    return CostModel(name, *(float(c) for c in coef))


def _best_host_ms(model: RooflineCostModel, points: list[Point]) -> float:
    """The host overhead enters every step additively: for given efficiencies
    its least-squares value (on relative error) is closed-form."""
    bare = model.with_params(host_overhead_ms=0.0)
    t = np.array([tt for _, tt in points])
    g = np.array([bare.step_time(s) for s, _ in points])
    w = 1.0 / t**2
    return max(0.0, float(np.sum((t - g) * w) / np.sum(w)) * 1000.0)


def fit_roofline(
    points: list[Point], base: RooflineCostModel, name: str = "calibrated", rounds: int = 200
) -> RooflineCostModel:
    """Coordinate search on the four efficiencies (dense GEMMs, attention,
    weight reads, K/V reads; multiplicative steps that halve when no move
    helps), the host overhead solved exactly at each candidate; minimises
    the mean squared relative error."""
    names = ("compute_efficiency", "attention_efficiency", "memory_efficiency", "kv_memory_efficiency")

    def settle(m: RooflineCostModel) -> tuple[RooflineCostModel, float]:
        m = m.with_params(host_overhead_ms=_best_host_ms(m, points))
        return m, float(np.mean(_rel_errors(m, points) ** 2))

    model, best = settle(base)
    step = {n: 0.5 for n in names}
    for _ in range(rounds):
        for n in names:
            cur = getattr(model.params, n)
            for factor in (1 + step[n], 1 / (1 + step[n])):
                cand, c = settle(model.with_params(**{n: min(cur * factor, 1.0)}))
                if c < best:
                    model, best = cand, c
                    break
            else:
                step[n] /= 2
        if max(step.values()) < 1e-7:
            break
    return replace(model, name=name)


def calibrate(
    source: Path,
    kind: str,
    out: Path,
    fmt: str = "auto",
    preset: str | None = None,
    node: str | None = None,
    name: str | None = None,
    front_end_out: Path | None = None,
) -> dict:
    from .vllm_profiler_trace import load_torch_trace, looks_like_trace

    if fmt == "auto":
        by_suffix = {".jsonl": "steps", ".ndjson": "steps", ".log": "vllm-log", ".txt": "vllm-log"}
        fmt = by_suffix.get(source.suffix) or ("torch-trace" if looks_like_trace(source) else "bench")
    front_end = None
    if front_end_out is not None:
        if fmt != "bench" or kind != "roofline" or preset is None:
            raise InputError("--front-end-out: allowed only with a bench JSON, --kind roofline and --preset")
        try:
            base_model = get_cost_model(preset)
        except ValueError as err:
            raise InputError(f"--preset: {err}") from None
        front_end = fit_front_end(load_bench_json(source), base_model)
        front_end_out.write_text(json.dumps({"preset": "off", **front_end}, indent=2) + "\n")
    input_warnings: list[str] = []
    if fmt == "vllm-log":
        from .vllm_log_stats import load_vllm_log

        points = load_vllm_log(source)
    elif fmt == "torch-trace":
        points, input_warnings = load_torch_trace(source)
    elif fmt == "steps":
        points = load_step_timings(source, node)
    elif front_end is None:
        points = load_bench_serve(source)
    else:
        per_request = front_end["request_ms"] / 1e3
        per_token = front_end["prompt_token_us"] / 1e6
        points = load_bench_serve(source, lambda n: per_request + per_token * n)
    name = name or out.stem
    model: CostModel | RooflineCostModel
    if kind == "linear":
        model = fit_linear(points, name)
        doc = model.to_dict()
    else:
        if preset is None:
            raise InputError("--preset: required with --kind roofline (the model and GPU whose factors to fit)")
        try:
            base = get_cost_model(preset)
        except ValueError as err:
            raise InputError(f"--preset: {err}") from None
        if not isinstance(base, RooflineCostModel):
            raise InputError(f"--preset {preset!r} is a linear set; allowed: a roofline preset")
        model = fit_roofline(points, base, name)
        doc = model.to_dict()
    from .fit_warnings import fit_warnings

    errs = np.abs(_rel_errors(model, points)) * 100
    out.write_text(json.dumps(doc, indent=2) + "\n")
    return {
        "warnings": input_warnings + fit_warnings(model, points),
        "points": len(points),
        "median_abs_error_pct": round(float(np.median(errs)), 3),
        "max_abs_error_pct": round(float(np.max(errs)), 3),
        "preset": doc,
        "out": str(out),
        "front_end": front_end,
        "front_end_out": str(front_end_out) if front_end_out else None,
    }


def add_calibrate_parser(sub) -> None:
    c = sub.add_parser(
        "calibrate",
        help="fit a cost model to measured step times (per-step JSONL, a vllm bench serve JSON, a vLLM log or "
        "profiler trace); write a preset file",
    )
    c.add_argument(
        "source",
        type=Path,
        help="a *.steps.jsonl (per-step timings), a vllm bench serve results JSON, a vLLM server log or a vLLM "
        "torch profiler trace",
    )
    c.add_argument("--kind", choices=["linear", "roofline"], default="linear", help="the cost model to fit")
    c.add_argument(
        "--preset", help="with --kind roofline: the preset whose model and GPU to fit (e.g. llama-3.1-8b-h100)"
    )
    c.add_argument(
        "--format",
        dest="fmt",
        choices=["auto", "steps", "bench", "vllm-log", "torch-trace"],
        default="auto",
        help="steps: per-step JSONL; bench: vllm bench serve --save-detailed JSON; vllm-log: a vLLM server log "
        "(its stats lines); torch-trace: a vLLM torch profiler trace (VLLM_TORCH_PROFILER_DIR; docs/cost-model.md). "
        "auto: by suffix (.jsonl steps, .log/.txt vllm-log, .pt.trace.json[.gz] torch-trace), else a JSON that "
        "starts with a trace's keys is torch-trace and any other bench",
    )
    c.add_argument("--node", help="per-step timings: only this node's steps (e.g. decode-0)")
    c.add_argument(
        "--out", type=Path, required=True, help="the preset file to write (*.json); name it in cluster.cost_model"
    )
    c.add_argument(
        "--front-end-out",
        type=Path,
        help="bench JSON + --kind roofline: also fit the API server's terms and write them here "
        "(a cluster.front_end mapping)",
    )
    c.set_defaults(func=cmd_calibrate)


def cmd_calibrate(args) -> int:
    if args.out.suffix != ".json":
        raise InputError(
            f"--out {args.out}: allowed: a path ending in .json (a scenario names it as cluster.cost_model)"
        )
    if not args.source.exists():
        raise InputError(
            f"{args.source}: no such file; allowed: a *.steps.jsonl, a vllm bench serve results JSON, a vLLM "
            "server log or a torch profiler trace"
        )
    report = calibrate(
        args.source, args.kind, args.out, args.fmt, args.preset, args.node, front_end_out=args.front_end_out
    )
    print(
        f"fitted {args.kind} cost model on {report['points']} points: median |error| "
        f"{report['median_abs_error_pct']:.2f} %, max {report['max_abs_error_pct']:.2f} %"
    )
    for warning in report["warnings"]:
        print(f"warning: {warning}", file=sys.stderr)
    print(json.dumps(report["preset"], indent=2))
    print(f"wrote {report['out']} (use it as cluster.cost_model: {report['out']})")
    if report["front_end"] is not None:
        print(f"front end: {report['front_end']}; wrote {report['front_end_out']} (use it as cluster.front_end)")
    return 0
