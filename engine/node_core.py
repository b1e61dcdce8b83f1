"""One serving node as a plain object: scheduler + connector (scheduler side)
+ engine loop + model runner + the worker side's KV completion sets. Both
runtimes drive this same class; only time and transport differ.

`engine: "v0"` runs vLLM 0.5.3's legacy scheduler (`engine.v0`) instead of the
v1 one: no connector (aggregated topologies only), one step in flight, and
swap space (`num_cpu_blocks`) that the model runner copies shadow KV through."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from .block_hash import update_block_hashes
from .config import CacheConfig, KVTransferConfig, ParallelConfig, SchedulerConfig, VllmConfig
from .engine_core import EngineCore
from .kv_cache_manager import KVCacheManager
from .kv_connector.pd_connector import PDConnector
from .model_runner import SimModelRunner, StepPlan, SwapMappings
from .outputs import EngineCoreOutput, KVConnectorOutput, ModelRunnerOutput, SchedulerOutput, SteadyTokens
from .records import StepRecord
from .request import Request
from .sampler import DeterministicSampler
from .scheduler import Scheduler, create_scheduler_for
from .setting import MAX_BLOCKS, MAX_PP, setting
from .shadow_kv import ShadowKVStore
from .v0.engine_adapter import V0SchedulerAdapter
from .v0.node_setup import create_v0_scheduler


@dataclass(frozen=True)
class NodeSpec:
    """Everything that defines a node. The settings among these are declared
    here (engine/setting.py) and validated by the scenario schema; a spec is
    built from already-valid values and checks nothing again."""

    name: str
    kv_role: str | None  # "kv_producer" | "kv_consumer" | "kv_both" | None
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    cache: CacheConfig = field(default_factory=CacheConfig)
    pipeline_parallel_size: int = setting(
        1, doc="Pipeline stages per node (vLLM --pipeline-parallel-size)", ge=1, le=MAX_PP
    )
    kv_load_failure_policy: Literal["recompute", "fail"] = setting(
        "recompute", doc="A failed KV load: recompute the prompt locally, or fail the request (vLLM's default)"
    )
    # The sampler's seed + the run's (ClusterSpec.node_specs).
    sampler_seed: int = 0
    stop_probability: float = setting(
        0.0, doc="Chance that a sampled token is EOS; requests stop there unless ignore_eos.", ge=0.0, le=1.0
    )
    shadow_kv: bool = setting(True, doc="Track every KV block's content, to catch corruption (engine/shadow_kv.py)")
    address: str = ""
    engine: Literal["v1", "v0"] = setting("v1", doc="The scheduler: v1 (vLLM 0.33.0) or v0 (vLLM 0.5.3's legacy one)")
    num_cpu_blocks: int = setting(0, doc="v0 only: CPU swap space, in blocks.", ge=0, le=MAX_BLOCKS)
    preemption_mode: Literal["auto", "recompute", "swap"] = setting(
        "auto",
        doc='v0 only: "auto" is vLLM 0.5.3\'s (recompute for one-sequence requests, which all of ours are).',
    )

    def vllm_config(self) -> VllmConfig:
        return VllmConfig(
            scheduler_config=self.scheduler,
            cache_config=self.cache,
            parallel_config=ParallelConfig(self.pipeline_parallel_size),
            kv_transfer_config=(
                KVTransferConfig(self.kv_role, self.kv_load_failure_policy, engine_id=self.name)  # type: ignore[arg-type]
                if self.kv_role
                else None
            ),
        )


class NodeCore:
    """The public surface the node roles and runtimes use; nothing above
    `engine/` reaches into the scheduler, the block pool or the runner."""

    def __init__(
        self,
        spec: NodeSpec,
        on_step: Callable[[StepRecord], None] | None = None,
        sampler: DeterministicSampler | None = None,
    ) -> None:
        self.spec = spec
        self.name = spec.name
        self.vllm_config = spec.vllm_config()
        ktc = self.vllm_config.kv_transfer_config
        self.is_v0 = spec.engine == "v0"
        # The v1 Scheduler, or the v0 adapter that mirrors the v1 names the
        # node needs (counts, counters, `requests`, `deferred_frees`).
        self.scheduler: Scheduler | V0SchedulerAdapter
        swaps: Callable[[SchedulerOutput], SwapMappings] | None = None
        if self.is_v0:
            self.connector = None
            self.scheduler = v0 = create_v0_scheduler(
                spec.name,
                spec.kv_role,
                spec.scheduler,
                spec.cache,
                spec.pipeline_parallel_size,
                spec.num_cpu_blocks,
                None if spec.preemption_mode == "auto" else spec.preemption_mode,
            )
            depth = 1  # v0 has no batch queue
            if spec.num_cpu_blocks:
                swaps = v0.get_swap_mappings
        else:
            self.connector = PDConnector(ktc, engine_address=spec.address) if ktc else None
            self.scheduler = create_scheduler_for(self.vllm_config, self.connector)
            depth = self.vllm_config.max_concurrent_batches
        if sampler is None:
            sampler = DeterministicSampler(spec.sampler_seed, spec.stop_probability)
        elif (sampler.seed, sampler.stop_probability) != (spec.sampler_seed, spec.stop_probability):
            raise ValueError(
                f"{spec.name}: the shared sampler has seed {sampler.seed} and stop probability "
                f"{sampler.stop_probability}; the node's spec says {spec.sampler_seed} and {spec.stop_probability}"
            )
        self.sampler = sampler
        # Without prefix caching no block has a hash to check hits against:
        # the store then keeps no content (`_expected_hash` would say None).
        hashes = self._expected_hash if spec.cache.enable_prefix_caching and not self.is_v0 else None
        self.shadow = (
            ShadowKVStore(spec.cache.num_gpu_blocks, spec.cache.block_size, expected_hash=hashes)
            if spec.shadow_kv
            else None
        )
        self.runner = SimModelRunner(
            self.sampler,
            self.shadow,
            swaps,
            prefix_caching=not self.is_v0 and spec.cache.enable_prefix_caching,
            retire_finished=spec.kv_role in (None, "kv_consumer"),
        )
        self.engine = EngineCore(
            spec.name,
            self.scheduler,
            self.runner,
            depth,
            worker_has_output=self.has_worker_output,
            on_step=on_step,
        )
        # Worker-side completion sets, reported with the next finished step.
        self._finished_sending: set[str] = set()
        self._finished_recving: set[str] = set()
        self._failed_recving: set[str] = set()

    def _expected_hash(self, request_id: str, block_index: int) -> int | None:
        """The prefix-cache hash of a request's block (None: not full, or not
        known here), for the shadow store's check of cache hits. Given to
        the store only with prefix caching on a v1 node."""
        request = self.scheduler.requests.get(request_id)
        if request is None:
            return None
        hashes = update_block_hashes(request, self.spec.cache.block_size)
        return hashes[block_index] if block_index < len(hashes) else None

    # -- the engine loop ---------------------------------------------------------
    @property
    def eos_token_id(self) -> int:
        return self.sampler.eos_token_id

    def set_kv_address(self, address: str) -> None:
        """Where consumers pull this producer's blocks (goes into `kv_transfer_params`)."""
        if self.connector is not None:
            self.connector.engine_address = address

    def add_request(self, request: Request) -> None:
        self.engine.add_request(request)

    def abort_requests(self, request_ids: list[str]) -> None:
        self.engine.abort_requests(request_ids)

    def schedule_step(self, now: float) -> StepPlan | None:
        return self.engine.schedule_step(now)

    def queue_step(self, now: float, scheduler_output: SchedulerOutput) -> StepPlan | None:
        """Queue a step scheduled outside `schedule_step` (the v1 steady-decode
        paths' admission step, engine/steady_step.py) as `schedule_step` does."""
        return self.engine.queue_step(now, scheduler_output)

    @property
    def current_step(self) -> int:
        """The index of the last step the v1 scheduler scheduled (the steady
        paths run on v1 nodes only)."""
        assert isinstance(self.scheduler, Scheduler)
        return self.scheduler.current_step

    def oldest(self) -> StepPlan | None:
        return self.engine.oldest()

    def finish_step(self, plan: StepPlan, now: float, tokens: list[list[int]] | None = None) -> ModelRunnerOutput:
        """The worker side's end of a step: shadow KV reads and writes (the
        in-flight write lands here), sampled tokens, the KV completions since
        the last step. `tokens` are what a stage worker sampled, if one did."""
        mro = self.runner.finish_step(plan, now, self.take_connector_output())
        if tokens is not None:
            mro.sampled_token_ids = tokens
        return mro

    def process_oldest(self, model_runner_output: ModelRunnerOutput) -> list[EngineCoreOutput | SteadyTokens]:
        return self.engine.process_oldest(model_runner_output)

    def register_load(self, request_id: str, block_ids: list[int]) -> None:
        """A KV load's target blocks belong to `request_id` from now on (shadow store)."""
        self.runner.register_load(request_id, block_ids)

    def has_work(self) -> bool:
        return self.engine.has_work()

    @property
    def batches_in_flight(self) -> int:
        return len(self.engine.batch_queue)

    @property
    def step_records(self) -> list[StepRecord]:
        return self.engine.step_records

    def trim_history(self, keep_steps: int) -> None:
        """A long-running server's node (`disagg-sim serve`): keep the last
        `keep_steps` step records, and forget what finished requests left
        behind (first scheduled times, the shadow store's bookkeeping). A run
        that reports at its end never calls this: it reports every step."""
        engine = self.engine
        del engine.step_records[:-keep_steps]
        keep = set(self.scheduler.requests) | set(self.runner.requests) | engine.ids_in_flight()
        for request_id in [r for r in engine.first_scheduled if r not in keep]:
            del engine.first_scheduled[request_id]
        shadow = self.runner.shadow
        if shadow is not None:
            shadow.prune(keep)

    def first_scheduled_time(self, request_id: str) -> float | None:
        return self.engine.first_scheduled.get(request_id)

    def holds(self, request_id: str) -> bool:
        """The scheduler still knows the request (running, waiting, or finished with blocks held)."""
        return request_id in self.scheduler.requests

    def request_ids(self) -> list[str]:
        return list(self.scheduler.requests)

    def request_counts(self) -> tuple[int, int]:
        return self.scheduler.get_request_counts()

    def held_prompt_blocks(self, request_id: str) -> tuple[list[int], int] | None:
        """(block ids holding the prompt's KV, prompt length) of a finished
        request whose blocks are held for a pull; None if it is not held."""
        request = self.scheduler.requests.get(request_id)
        if request is None or not request.is_finished():
            return None
        prompt_len = request.num_prompt_tokens
        n_blocks = -(-prompt_len // self.block_size)
        kvm = self.scheduler.kv_cache_manager
        assert isinstance(kvm, KVCacheManager)  # v0 holds no finished request's blocks
        return kvm.get_block_ids(request_id)[:n_blocks], prompt_len

    @property
    def block_size(self) -> int:
        return self.spec.cache.block_size

    def live_gauges(self) -> dict[str, float]:
        """The node's gauges now (vLLM's stats names, without the prefix)."""
        s = self.scheduler
        num_running, num_waiting = s.get_request_counts()
        total = s.get_num_total_gpu_blocks()
        return {
            "num_running": num_running,
            "num_waiting": num_waiting,
            "kv_cache_usage": 0.0 if total == 0 else 1.0 - s.get_num_free_gpu_blocks() / total,
            "num_waiting_for_remote_kvs": s.num_waiting_for_remote_kvs(),
            "num_deferred_blocks": s.num_deferred_free_blocks(),
            "batches_in_flight": self.batches_in_flight,
        }

    def shadow_violations(self) -> list[dict[str, Any]]:
        return [{"node": self.name, **v.to_dict()} for v in self.shadow.violations] if self.shadow else []

    # -- worker-side KV completions ------------------------------------------
    def has_worker_output(self) -> bool:
        return bool(self._finished_sending or self._finished_recving or self._failed_recving)

    def mark_finished_sending(self, request_id: str) -> None:
        self._finished_sending.add(request_id)

    def mark_finished_recving(self, request_id: str, ok: bool = True) -> None:
        self._finished_recving.add(request_id)
        if not ok:
            self._failed_recving.add(request_id)

    def take_connector_output(self) -> KVConnectorOutput | None:
        if not self.has_worker_output():
            return None
        out = KVConnectorOutput(
            finished_sending=self._finished_sending or None,
            finished_recving=self._finished_recving or None,
            failed_recving=self._failed_recving or None,
        )
        self._finished_sending, self._finished_recving, self._failed_recving = set(), set(), set()
        return out

    # -- producer side: what a pull reads -------------------------------------
    def blocks_for_pull(self, request_id: str, block_ids: list[int], num_tokens: int, now: float) -> bool:
        """The producer reads the blocks it serves; False if they no longer
        hold this request's KV (they were reused before the pull)."""
        if self.shadow is None:
            return True
        return self.shadow.read(request_id, block_ids, num_tokens, now)

    # -- consumer side: a pull landed ----------------------------------------
    def write_pulled_blocks(
        self, request_id: str, block_ids: list[int], num_tokens: int, now: float, first_block_index: int = 0
    ) -> None:
        """A KV load landed: `block_ids` hold the prompt's blocks from
        `first_block_index` on (the ones before came from a local cache hit)."""
        if self.shadow is not None:
            bs = self.spec.cache.block_size
            table = [0] * first_block_index + list(block_ids)  # indexed by prompt block position
            self.shadow.write(request_id, table, first_block_index * bs, num_tokens, now)

    # -- reporting -------------------------------------------------------------
    def counters(self) -> dict[str, Any]:
        c = dict(self.scheduler.get_counters())
        c["kv_corruptions_detected"] = self.shadow.num_corruptions if self.shadow else 0
        if self.shadow is not None:
            c.update({f"shadow_{k}": v for k, v in self.shadow.summary().items()})
        return c

    def end_of_run_errors(self) -> list[str]:
        """A node at the end of a run: blocks conserved, no double free,
        nothing held, nothing deferred, the pool fully free."""
        errors: list[str] = []
        if isinstance(self.scheduler, Scheduler):  # (not v0)
            self.scheduler.settle_steady()
        try:
            self.check_block_conservation()
        except AssertionError as e:
            errors.append(str(e))
        s = self.scheduler
        name = self.name
        if s.requests:
            errors.append(f"{name}: {len(s.requests)} request(s) still held at the end: {sorted(s.requests)[:5]}")
        if s.deferred_frees:
            errors.append(f"{name}: {sum(len(b) for _, b in s.deferred_frees)} block(s) still deferred at the end")
        pool = s.kv_cache_manager.block_pool
        if not s.requests and pool.get_num_free_blocks() != pool.num_gpu_blocks - 1:
            errors.append(
                f"{name}: block pool not fully free at the end "
                f"({pool.get_num_free_blocks()} of {pool.num_gpu_blocks - 1})"
            )
        return errors

    def check_block_conservation(self) -> None:
        if isinstance(self.scheduler, V0SchedulerAdapter):  # (self.is_v0)
            self.scheduler.check_block_conservation(self.name)
            return
        pool = self.scheduler.kv_cache_manager.block_pool
        kvm = self.scheduler.kv_cache_manager
        free = pool.get_num_free_blocks()
        used = sum(len(b) for b in kvm.req_to_blocks.values())
        deferred = sum(len(b) for _, b in self.scheduler.deferred_frees)
        total = pool.num_gpu_blocks - 1
        if free + used + deferred != total:
            raise AssertionError(
                f"{self.name}: block conservation broken: free {free} + used {used} + deferred {deferred} != {total}"
            )
        ids = [b.block_id for b in pool.free_block_queue]
        if len(ids) != len(set(ids)):
            raise AssertionError(f"{self.name}: a block is in the free queue twice (double free)")
