"""The v1 scheduler's state: its settings, queues, fence and counters, and
the few predicates every pass reads.

`Scheduler` (scheduler.py) is this state plus vLLM's methods. Its passes —
the waiting pass (waiting_pass.py), a step's output (step_output.py), output
processing (output_processor.py), the free path and its fence
(free_path.py), the bulk and steady steps — are functions over this type,
so none of them imports the scheduler it serves. The scheduler inherits the
state rather than holding it so that `self.running` and friends stay one
attribute lookup in its hot loops (the passes read them the same way).
"""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

from .config import VllmConfig
from .counters import SchedulerCounters
from .kv_cache_manager import KVCacheManager
from .kv_connector.base import KVConnectorBase
from .request import Request, RequestStatus
from .request_queue import create_request_queue
from .sampler import DeterministicSampler

if TYPE_CHECKING:
    from .kv_cache_block import KVCacheBlock
    from .steady_cohort import SteadyCohort


class SchedulerState:
    # Whether a scheduled decode adds an output placeholder (AsyncScheduler).
    adds_output_placeholders = False

    def __init__(self, vllm_config: VllmConfig, connector: KVConnectorBase | None = None) -> None:
        self.vllm_config = vllm_config
        sc = self.scheduler_config = vllm_config.scheduler_config
        cc = vllm_config.cache_config
        self.policy = sc.policy
        self.max_model_len = sc.max_model_len
        self.max_num_running_reqs = sc.max_num_seqs
        self.max_num_active_reqs = sc.max_num_seqs
        self.max_num_scheduled_tokens = sc.max_num_batched_tokens
        self.block_size = cc.block_size
        self.scheduler_reserve_full_isl = sc.scheduler_reserve_full_isl
        self.prefix_guard = sc.preemption_guard == "prefix"
        self.num_lookahead_tokens = 0

        self.kv_cache_manager = KVCacheManager(
            cc.num_gpu_blocks, cc.block_size, sc.max_model_len, sc.watermark, cc.enable_prefix_caching
        )
        self.connector = connector
        ktc = vllm_config.kv_transfer_config
        if connector is not None and ktc is None:
            raise ValueError("a KV connector needs a kv_transfer_config (its kv_role decides the fence gate)")

        # The fence gate (sched.py:189-195): a consumer-capable connector and
        # overlapping batches. A config value other than None forces it.
        gate = ktc is not None and ktc.is_kv_consumer and vllm_config.max_concurrent_batches > 1
        self.defer_block_free = gate if sc.defer_block_free is None else sc.defer_block_free
        self.requires_kv_delivery = connector.requires_kv_delivery if connector is not None else False
        self.recompute_kv_load_failures = ktc is None or ktc.kv_load_failure_policy == "recompute"

        self.requests: dict[str, Request] = {}
        self.running: list[Request] = []
        self.waiting = create_request_queue(self.policy)
        self.kv_holding_waiting = create_request_queue(self.policy)
        self.deferred_waiting: set[Request] = set()
        self._inflight_prefills: set[Request] = set()
        self.finished_req_ids: set[str] = set()
        self.reset_preempted_req_ids: set[str] = set()
        self.finished_recving_kv_req_ids: set[str] = set()
        self.failed_recving_kv_req_ids: set[str] = set()

        # The fence (sched.py:466-476).
        self.sched_step_seq = 0
        self.processed_step_seq = 0
        self.deferred_frees: deque[tuple[int, list[KVCacheBlock]]] = deque()

        self.prefill_capacity_bound = False
        self.current_step = 0
        # Bumped by every plain `schedule()`: the steady-decode cohort of an
        # older epoch is stale (engine/steady_cohort.py). Only a plain step
        # can undo the cohort's checks of a running request.
        self.steady_epoch = 0
        self.steady_cohort: SteadyCohort | None = None
        # Set by the in-process runtime while it runs a batch (its proxy
        # reads `SteadyTokens`): `update_from_output` then gives a step's
        # one-token outputs that finish nothing as one object.
        self.bulk_token_outputs = False
        # The node's sampler, for those runs' bulk steps (engine/bulk_step.py).
        self.sampler: DeterministicSampler | None = None
        self.counters = SchedulerCounters()

    @staticmethod
    def _holds_kv_blocks(request: Request) -> bool:
        return request.num_computed_tokens > 0 or request.status == RequestStatus.WAITING_FOR_REMOTE_KVS

    def get_request_counts(self) -> tuple[int, int]:
        return len(self.running), len(self.waiting) + len(self.kv_holding_waiting)

    # ------------------------------------------------------------------ fence
    def _request_blocks_can_be_freed(self, request: Request) -> bool:
        """The one predicate shared by the free path and the preemption retry."""
        return not self.defer_block_free or request.last_sched_seq <= self.processed_step_seq

    def settle_steady(self) -> None:
        """Write the steady cohort's lazily kept counters (engine/steady_cohort.py)
        before a path other than the steady ones reads or changes requests."""
        cohort = self.steady_cohort
        if cohort is not None and cohort.owed:
            cohort.settle(self)
