"""Calibration points from what a vLLM server logs (`disagg-sim calibrate
--format vllm-log`), for fitting the cost model to real hardware without
any instrumentation.

Supported format: a vLLM v1 server log (stdout/stderr as written), with

- the start-up line `GPU KV cache size: 1,234,560 tokens` (the KV pool);
- the periodic stats lines, every `--log-stats` interval (10 s by default):
  `Engine 000: Avg prompt throughput: 0.0 tokens/s, Avg generation
  throughput: 1234.5 tokens/s, Running: 32 reqs, Waiting: 0 reqs, GPU KV
  cache usage: 12.3%, ...` (older releases: `Avg prompt throughput: ...` in
  the same order without the `Engine` prefix; both are read).

Each interval that only decoded (prompt throughput 0, generation > 0, some
requests running) gives one decode step: `Running` sequences, each one
token per step, so its time is Running / generation throughput, and their
context together is the KV cache usage times the pool. Intervals that also
prefilled mix two kinds of step in unknown proportion and are skipped.
The figures are averages over the interval: a fit on them needs intervals
of different batch sizes (a load ramp, or several runs at different
concurrency), which `calibrate`'s identifiability warnings check.
"""

from __future__ import annotations

import re
from pathlib import Path

from engine.cost_model import StepShape

from .errors import InputError

_KV_SIZE = re.compile(r"GPU KV cache size:\s*([\d,]+)\s*tokens")
_STATS = re.compile(
    r"Avg prompt throughput:\s*(?P<prompt>[\d.]+)\s*tokens/s,\s*"
    r"Avg generation throughput:\s*(?P<gen>[\d.]+)\s*tokens/s,\s*"
    r"Running:\s*(?P<running>\d+)\s*reqs.*?"
    r"(?:GPU )?KV cache usage:\s*(?P<usage>[\d.]+)%"
)

Point = tuple[StepShape, float]


def load_vllm_log(path: Path) -> list[Point]:
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError as err:
        raise InputError(f"{path}: cannot read ({err.strerror or err}); allowed: a vLLM server log") from None
    sizes = _KV_SIZE.findall(text)
    if not sizes:
        raise InputError(
            f"{path}: no 'GPU KV cache size: N tokens' line; allowed: a vLLM server log from its start "
            "(the KV pool size turns KV cache usage into context tokens)"
        )
    kv_tokens = int(sizes[-1].replace(",", ""))
    points: list[Point] = []
    stats_lines = 0
    for m in _STATS.finditer(text):
        stats_lines += 1
        prompt, gen = float(m["prompt"]), float(m["gen"])
        running, usage = int(m["running"]), float(m["usage"]) / 100.0
        if prompt > 0 or gen <= 0 or running <= 0:
            continue
        context = int(round(usage * kv_tokens))
        points.append((StepShape(0, running, context, running, context, 0), running / gen))
    if not points:
        raise InputError(
            f"{path}: {stats_lines} stats line(s), none of a decode-only interval (prompt throughput 0, "
            "generation > 0, requests running); allowed: a log of a run that decoded for at least one interval"
        )
    return points
