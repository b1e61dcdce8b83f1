"""Calibration points from a vLLM torch profiler trace (`disagg-sim calibrate
--format torch-trace`): one step per model execution the trace annotates.

Supported format: the Chrome trace JSON that PyTorch's profiler writes for a
vLLM worker (`VLLM_TORCH_PROFILER_DIR`, or `--profiler-config` with
`profiler: torch` on newer releases; one file per worker,
`<worker>.<time>.pt.trace.json`, gzip-compressed by default, `.gz`). Its
`traceEvents` list holds complete events (`"ph": "X"`) with a start `ts`
and a duration `dur`, both in microseconds. While profiling, vLLM's v1 GPU
worker wraps each `execute_model` call in an annotation naming the batch:

- by default `execute_context_<n>(<t>)_generation_<m>(<g>)`: n requests
  still in their prompt (t tokens scheduled for them) and m generating
  (g tokens);
- with `detailed_trace_annotation` on,
  `execute_<total>_context_<n>(sq<t>sk<s>sqsq<qq>sqsk<qk>)_generation_<m>(sq<g>sk<s'>sqsq<qq'>sqsk<qk'>)`:
  per phase also the sum of the rows' sequence lengths (sk: cached plus
  scheduled), of query_len² (sqsq) and of query_len × seq_len (sqsk).

The annotation appears twice: on the CPU thread (`"cat": "user_annotation"`)
and, when CUDA activity is recorded, on the GPU stream
(`"cat": "gpu_user_annotation"`: the device time of the kernels the step
launched). The GPU span is taken when the trace has one (it is what the
roofline's efficiencies model; the CPU span of an asynchronous launch ends
before the GPU work does), else the CPU span; steps whose GPU span is
missing from such a trace are left out, with a warning. Either way the scheduler,
sampling and output processing between steps are outside it, so a fitted
host overhead is lower than what a server's ITL holds (`vllm-log` and
`bench` inputs include that time).

A detailed annotation gives the whole StepShape: prefill tokens t, decode
tokens g, batch n + m, context s + s', decode context s', and the prefill
rows' causal attention pairs Σ(q·start + q(q+1)/2) = qk − (qq − t)/2. A
default annotation has no sequence lengths: each prefill row is taken as a
fresh prompt of t/n tokens and the decode context as 0, and `calibrate`
warns that the context terms cannot be fitted from it.
"""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

from engine.cost_model import StepShape

from .errors import InputError

Point = tuple[StepShape, float]

_SIMPLE = re.compile(r"execute_context_(\d+)\((\d+)\)_generation_(\d+)\((\d+)\)")
_PHASE = r"(\d+)\(sq(\d+)sk(\d+)sqsq(\d+)sqsk(\d+)\)"
_DETAILED = re.compile(rf"execute_(\d+)_context_{_PHASE}_generation_{_PHASE}")
# Where the annotation's span is measured, best first (module docstring).
_CATEGORIES = ("gpu_user_annotation", "user_annotation")
NO_LENGTHS_WARNING = (
    "the trace's step annotations carry no sequence lengths (vLLM's profiler config "
    "detailed_trace_annotation is off): decode context taken as 0 and each prefill as a fresh prompt, so "
    "the context terms are not fitted from it; profile with detailed_trace_annotation on for them"
)


def looks_like_trace(path: Path) -> bool:
    """A torch profiler trace by its name or, for a plain `.json`, its first bytes."""
    name = path.name
    if name.endswith((".pt.trace.json", ".pt.trace.json.gz", ".json.gz")):
        return True
    try:
        with open(path, "rb") as f:
            head = f.read(4096)
    except OSError:
        return False
    return b'"traceEvents"' in head or b'"schemaVersion"' in head


def _read_trace(path: Path) -> dict:
    allowed = "allowed: a torch profiler trace file (*.pt.trace.json or .json.gz) from VLLM_TORCH_PROFILER_DIR"
    if path.is_dir():
        raise InputError(f"{path}: is a directory; {allowed}, one worker's file (e.g. rank 0's)")
    try:
        raw = path.read_bytes()
        if raw[:2] == b"\x1f\x8b":
            raw = gzip.decompress(raw)
        data = json.loads(raw)
    except OSError as err:
        raise InputError(f"{path}: cannot read ({err.strerror or err}); {allowed}") from None
    except (ValueError, EOFError) as err:
        raise InputError(f"{path}: not JSON ({err}); {allowed}") from None
    if not isinstance(data, dict) or not isinstance(data.get("traceEvents"), list):
        raise InputError(f"{path}: has no traceEvents list; {allowed}")
    return data


def _shape(name: str) -> tuple[StepShape, bool] | None:
    """The step's shape from its annotation, and whether it held sequence lengths."""
    m = _DETAILED.fullmatch(name)
    if m:
        _, n, t, s, qq, qk, n2, g, s2, _qq2, _qk2 = (int(x) for x in m.groups())
        pairs = qk - (qq - t) // 2
        return StepShape(t, g, s + s2, n + n2, s2, pairs), True
    m = _SIMPLE.fullmatch(name)
    if m:
        n, t, n2, g = (int(x) for x in m.groups())
        pairs = 0
        if n:
            q = t / n
            pairs = round(n * q * (q + 1) / 2)
        return StepShape(t, g, t, n + n2, 0, pairs), False
    return None


def load_torch_trace(path: Path) -> tuple[list[Point], list[str]]:
    """(points, warnings): a point per annotated step with tokens and a duration > 0."""
    events = _read_trace(Path(path))["traceEvents"]
    # category -> [(shape, whether the annotation held sequence lengths, dur)]
    steps: dict[str, list[tuple[StepShape, bool, object]]] = {c: [] for c in _CATEGORIES}
    for event in events:
        if not isinstance(event, dict) or event.get("ph") != "X" or event.get("cat") not in steps:
            continue
        name = event.get("name")
        parsed = _shape(name) if isinstance(name, str) else None
        if parsed is not None:  # other annotations (a capture, a user's own) are not steps
            steps[event["cat"]].append((*parsed, event.get("dur")))
    category = next((c for c in _CATEGORIES if steps[c]), None)
    if category is None:
        raise InputError(
            f"{path}: {len(events)} trace events, none an `execute_context_…_generation_…` step annotation; "
            "allowed: a trace of a vLLM v1 worker profiled while it served requests"
        )
    points: list[Point] = []
    without_lengths = 0
    for shape, has_lengths, dur in steps[category]:
        if isinstance(dur, bool) or not isinstance(dur, (int, float)) or dur < 0:
            raise InputError(f"{path}: a step annotation has dur={dur!r}; allowed: microseconds >= 0")
        if shape.total_tokens and dur > 0:
            points.append((shape, dur / 1e6))
            without_lengths += not has_lengths
    if not points:
        raise InputError(f"{path}: no annotated step with tokens and a duration > 0")
    warnings = [NO_LENGTHS_WARNING] if without_lengths else []
    on_cpu_only = len(steps["user_annotation"]) - len(steps["gpu_user_annotation"])
    if category == "gpu_user_annotation" and on_cpu_only > 0:
        warnings.append(
            f"{on_cpu_only} of {len(steps['user_annotation'])} annotated steps have no GPU span in the trace; "
            "fitted on the GPU spans only (CPU spans of the others would not be comparable)"
        )
    return points, warnings
