"""The legacy v0 scheduler of vLLM 0.5.3.post1 (FCFS, `waiting`/`running`/`swapped`),
modelled faithfully, plus a v1-shaped adapter so a node can run `engine: v0`.

n=1 sequences only; default (v1) block manager; no prefix caching, LoRA or
`delay_factor`. See docs/deviations.md ("## v0") for what differs from vLLM.
"""

from engine.v0.block_manager import AllocStatus, BlockSpaceManagerV1
from engine.v0.block_ops import PreemptionMode
from engine.v0.config import CacheConfig, SchedulerConfig
from engine.v0.engine_adapter import V0SchedulerAdapter
from engine.v0.scheduler import Scheduler
from engine.v0.scheduler_outputs import SchedulerOutputs, SequenceGroupMetadata
from engine.v0.sequence import Sequence, SequenceGroup, SequenceStatus
from engine.v0.starvation import StarvationCounters, diagnose

__all__ = [
    "AllocStatus",
    "BlockSpaceManagerV1",
    "CacheConfig",
    "PreemptionMode",
    "Scheduler",
    "SchedulerConfig",
    "SchedulerOutputs",
    "Sequence",
    "SequenceGroup",
    "SequenceGroupMetadata",
    "SequenceStatus",
    "StarvationCounters",
    "V0SchedulerAdapter",
    "diagnose",
]
