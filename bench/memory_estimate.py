"""How much memory a `disagg-sim run` will take, known before it starts,
and `--max-memory`: above the limit the run is refused (exit 2, one line),
above half of it a warning is printed. So 10^6 requests are a choice, not
a crash part way (issue 34, finding 5: a million requests ran without a
word until 3.9 GB and a kill).

What a run keeps until it ends grows with its requests and the tokens they
generate: each request's record (arrival, token times and ids), its
scheduler state and step records (a step per decode iteration, so per
output token over the batch). The estimate is a line fitted to peak RSS
of real `disagg-sim run`s (benchmarks/memory_estimate.py, RESULTS.md):

    MiB = BASE_MIB + requests x (PER_REQUEST_KIB + output_tokens x PER_OUTPUT_TOKEN_KIB) / 1024

for the largest single run (variants and repeats run one after another and
free what they kept), times `--jobs` runs at once. It covers the
in-process runtime; on Ray it is the driver's share (the records), each
node actor holding its own part besides.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .errors import InputError

# Least squares through the peak RSS of 9 runs of the `serve` scenario (1P+1D;
# 500-16,000 requests, 32-256 output tokens; benchmarks/memory_estimate.py,
# RESULTS.md): 153.5 MiB, 1.64 KiB, 0.053 KiB, rounded up. The estimate was
# 0.96-1.09 x each run's peak; past 16,000 requests the line is extrapolated.
BASE_MIB = 155.0
PER_REQUEST_KIB = 1.7
PER_OUTPUT_TOKEN_KIB = 0.055
SAMPLE = 2_000  # requests drawn to learn a workload's mean output length
WARN_FRACTION = 0.5

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]i?B?|B)?\s*$", re.IGNORECASE)
_UNITS = {"": 1 << 20, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_size(text: str) -> int:
    """'4G', '512M', '1.5GiB', '2000000000' (bytes) -> bytes; a bare number under 10^6 is MiB."""
    m = _SIZE.match(text)
    if not m:
        raise InputError(f"--max-memory {text[:40]!r}: not a size; allowed: e.g. 4G, 512M, 1.5GiB")
    value = float(m.group(1))
    unit = (m.group(2) or "").upper()[:1]
    if unit == "" and value >= 1e6:
        unit = "B"
    size = int(value * _UNITS[unit])
    if size < 1 << 20:
        raise InputError(f"--max-memory {text[:40]!r}: under 1 MiB; allowed: e.g. 4G, 512M")
    return size


@dataclass(frozen=True)
class RunSize:
    requests: int
    mean_output_tokens: float

    @property
    def mib(self) -> float:
        kib = self.requests * (PER_REQUEST_KIB + self.mean_output_tokens * PER_OUTPUT_TOKEN_KIB)
        return BASE_MIB + kib / 1024


def estimate_mib(sizes: list[RunSize], jobs: int = 1) -> float:
    """The peak of the largest run, `jobs` of them at once."""
    largest = max((s.mib for s in sizes), default=BASE_MIB)
    return largest * max(1, jobs)


def scenario_sizes(scenario, variants: list[str]) -> list[RunSize]:
    """Each variant's requests and mean output length, from a sample of its workload (or its trace)."""
    from .workloads.spec import generate_workload

    sizes = []
    for variant in variants:
        spec = scenario.workload_spec(variant)
        if spec is not None:
            sample = generate_workload(spec.model_copy(update={"num_requests": min(spec.num_requests, SAMPLE)}))
            n = spec.num_requests
        else:
            sample, _ = scenario.workload(variant, scenario.file.seed)
            n = len(sample)
        mean_out = sum(w.output_len for w in sample) / len(sample) if sample else 0.0
        sizes.append(RunSize(n, mean_out))
    return sizes


def check_memory(estimate_mib_: float, limit_bytes: int | None, say) -> None:
    """Refuse a run estimated over `limit_bytes`; warn over half of it."""
    if limit_bytes is None:
        return
    limit_mib = limit_bytes / (1 << 20)
    if estimate_mib_ > limit_mib:
        raise InputError(
            f"--max-memory {limit_mib:,.0f} MiB: this run is estimated at {estimate_mib_:,.0f} MiB "
            "(docs/usage.md, memory estimate); allowed: fewer requests or shorter outputs, or a larger --max-memory"
        )
    if estimate_mib_ > WARN_FRACTION * limit_mib:
        say(
            f"warning: this run is estimated at {estimate_mib_:,.0f} MiB, over half of "
            f"--max-memory ({limit_mib:,.0f} MiB)"
        )


def machine_memory_bytes() -> int | None:
    """MemTotal from /proc/meminfo (None where there is none)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def check_run_memory(max_memory: str | None, scenario, only: list[str] | None, jobs: int, say) -> float:
    """`disagg-sim run`'s check, before anything starts: the limit is
    `--max-memory`, or this machine's memory; `--max-memory off` skips it.
    Returns the estimate (MiB)."""
    if max_memory is not None and max_memory.strip().lower() == "off":
        return 0.0
    limit = parse_size(max_memory) if max_memory is not None else machine_memory_bytes()
    estimate = estimate_mib(scenario_sizes(scenario, only or scenario.variant_names), jobs)
    check_memory(estimate, limit, say)
    return estimate
