"""Synthetic workloads: seeded generators of `WorkloadRequest` lists.

A workload is three independent pieces — how long prompts and outputs are,
when requests arrive, which priority they carry — validated once by pydantic
and drawn from a seed. Each piece draws from its own child seed, so changing
the arrival process does not reshuffle the lengths.
"""

from bench.workloads.arrivals import (
    AllAtOnceArrivals,
    ArrivalSpec,
    ConstantArrivals,
    GammaArrivals,
    PoissonArrivals,
)
from bench.workloads.lengths import (
    EmpiricalLengths,
    FixedLength,
    LengthSpec,
    LognormalLengths,
    NormalLengths,
    ShareGPTLikeLengths,
    UniformLengths,
    load_empirical_cdf,
)
from bench.workloads.priorities import ChoicePriority, FixedPriority, PrioritySpec
from bench.workloads.spec import WorkloadSpec, WorkloadSpecError, generate_workload, parse_workload_spec

__all__ = [
    "AllAtOnceArrivals",
    "ArrivalSpec",
    "ChoicePriority",
    "ConstantArrivals",
    "EmpiricalLengths",
    "FixedLength",
    "FixedPriority",
    "GammaArrivals",
    "LengthSpec",
    "LognormalLengths",
    "NormalLengths",
    "PoissonArrivals",
    "PrioritySpec",
    "ShareGPTLikeLengths",
    "UniformLengths",
    "WorkloadSpec",
    "WorkloadSpecError",
    "generate_workload",
    "load_empirical_cdf",
    "parse_workload_spec",
]
