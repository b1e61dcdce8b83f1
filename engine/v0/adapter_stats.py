"""The reporting side of `V0SchedulerAdapter` (a mixin, as v1 keeps its output
processing apart from scheduling): vLLM 0.5.3's v0 gauges and counters under
their metric names, the periodic stats line, the starvation counters and
diagnosis, and the scheduler protocol's numbers the engine loop records each
step (`engine.engine_core.EngineScheduler`)."""

from __future__ import annotations

from typing import Any

from engine.v0.block_ops import PreemptionMode
from engine.v0.config import CacheConfig
from engine.v0.gauges import QueueGauges
from engine.v0.loglines import V0StatLogger, V0Stats
from engine.v0.scheduler import Scheduler
from engine.v0.starvation import diagnose


class V0PoolView:
    """The v1 block pool's reporting surface over the v0 GPU pool, for readers
    written against v1 (`cluster/invariants.py`). v1 counts a reserved null
    block in `num_gpu_blocks` and its readers take it off (usable =
    `num_gpu_blocks - 1`); v0 has none, so the view adds it back."""

    def __init__(self, adapter: V0StatsMixin) -> None:
        self._adapter = adapter

    @property
    def num_gpu_blocks(self) -> int:
        return self._adapter.cache_config.num_gpu_blocks + 1

    def get_num_free_blocks(self) -> int:
        return self._adapter.get_num_free_gpu_blocks()


class V0KVCacheView:
    def __init__(self, adapter: V0StatsMixin) -> None:
        self.block_pool = V0PoolView(adapter)


class V0StatsMixin:
    # What the mixin reads of its host; `V0SchedulerAdapter.__init__` sets them.
    scheduler: Scheduler
    cache_config: CacheConfig
    stat_logger: V0StatLogger
    gauges: QueueGauges
    now: float
    last_stat_line: str | None

    # v0 frees blocks at once (no fence): nothing is ever deferred. Kept for
    # readers of v1's `deferred_frees`.
    deferred_frees: tuple[()] = ()

    # -- queue and pool sizes ------------------------------------------------------
    @property
    def num_running(self) -> int:
        return len(self.scheduler.running)

    @property
    def num_waiting(self) -> int:
        return len(self.scheduler.waiting)

    @property
    def num_swapped(self) -> int:
        return len(self.scheduler.swapped)

    def get_num_free_gpu_blocks(self) -> int:
        return len(self.scheduler.block_manager.gpu_allocator.free_blocks)

    def get_num_free_cpu_blocks(self) -> int:
        return len(self.scheduler.block_manager.cpu_allocator.free_blocks)

    @property
    def kv_cache_manager(self) -> V0KVCacheView:
        return V0KVCacheView(self)

    def check_block_conservation(self, node_name: str = "v0") -> None:
        problems = self.scheduler.block_manager.check_conservation()
        if problems:
            raise AssertionError(f"{node_name}: " + "; ".join(problems))

    # -- the engine loop's scheduler protocol --------------------------------------
    def get_request_counts(self) -> tuple[int, int]:
        """(running, waiting) like v1's; swapped requests are in neither."""
        return len(self.scheduler.running), len(self.scheduler.waiting)

    def num_waiting_for_remote_kvs(self) -> int:
        return 0  # no KV connector in v0

    def get_num_total_gpu_blocks(self) -> int:
        return self.cache_config.num_gpu_blocks

    def num_deferred_free_blocks(self) -> int:
        return 0

    def get_preemption_totals(self) -> tuple[int, int]:
        """(preemptions, zero-progress preemptions): v0 has no fence, so a
        preemption always frees its victim's blocks."""
        return self.scheduler.num_cumulative_preemption, 0

    # -- vLLM's gauges -----------------------------------------------------------------
    def get_kv_cache_usage(self) -> float:
        return self.gpu_cache_usage

    @property
    def gpu_cache_usage(self) -> float:
        """`vllm:gpu_cache_usage_perc`: a fraction in [0, 1], as vLLM exports it."""
        return 1.0 - self.get_num_free_gpu_blocks() / self.cache_config.num_gpu_blocks

    @property
    def cpu_cache_usage(self) -> float:
        total = self.cache_config.num_cpu_blocks
        return 1.0 - self.get_num_free_cpu_blocks() / total if total > 0 else 0.0

    @property
    def num_preemptions(self) -> int:
        return self.scheduler.num_cumulative_preemption

    def metrics(self) -> dict[str, float]:
        """The v0 gauges and counter under vLLM's metric names."""
        return {
            "vllm:num_requests_running": self.num_running,
            "vllm:num_requests_waiting": self.num_waiting,
            "vllm:num_requests_swapped": self.num_swapped,
            "vllm:gpu_cache_usage_perc": self.gpu_cache_usage,
            "vllm:cpu_cache_usage_perc": self.cpu_cache_usage,
            "vllm:num_preemptions_total": self.num_preemptions,
        }

    def _sample_gauges(self) -> None:
        """Once per step, after its update, where vLLM reads its gauges."""
        s = self.scheduler
        cc = self.cache_config
        self.gauges.sample(
            self.now,
            len(s.running),
            len(s.waiting),
            len(s.swapped),
            cc.num_gpu_blocks - self.get_num_free_gpu_blocks(),
            cc.num_cpu_blocks - self.get_num_free_cpu_blocks(),
        )

    # -- the periodic stats line -------------------------------------------------------
    def make_stats(
        self,
        now: float,
        num_prompt_tokens_iter: int = 0,
        num_generation_tokens_iter: int = 0,
        num_preemption_iter: int = 0,
    ) -> V0Stats:
        return V0Stats(
            now,
            self.num_running,
            self.num_swapped,
            self.num_waiting,
            self.gpu_cache_usage,
            self.cpu_cache_usage,
            num_prompt_tokens_iter,
            num_generation_tokens_iter,
            num_preemption_iter,
        )

    def log_stats(self, now: float) -> str | None:
        """Log the periodic stats line if more than 5 s passed since the last one
        (counts are recorded by every `update_from_output`); returns the line."""
        line = self.stat_logger.maybe_log(self.make_stats(now))
        if line is not None:
            self.last_stat_line = line
        return line

    # -- counters and diagnosis --------------------------------------------------------
    def counters(self) -> dict[str, Any]:
        s = self.scheduler
        return {
            "num_preemptions": s.num_cumulative_preemption,
            "num_preemptions_recompute": s.num_preemptions_by_mode[PreemptionMode.RECOMPUTE],
            "num_preemptions_swap": s.num_preemptions_by_mode[PreemptionMode.SWAP],
            "num_ignored_prompts": s.num_ignored_seq_groups,
            "starvation": s.starvation.to_dict(),
        }

    def get_counters(self) -> dict[str, int]:
        """Everything a results file sums (or, for `*_peak`, maxes) over nodes, as
        ints: `counters()` with the starvation counters prefixed `starvation_`
        (the per-request blocker map left out), the gauges' final values
        (`v0_num_*_final`), and their run-long peaks and per-step sums."""
        flat = {k: v for k, v in self.counters().items() if k != "starvation"}
        for k, v in self.scheduler.starvation.to_dict().items():
            if isinstance(v, int):
                flat[f"starvation_{k}"] = v
        flat["v0_num_running_final"] = self.num_running
        flat["v0_num_waiting_final"] = self.num_waiting
        flat["v0_num_swapped_final"] = self.num_swapped
        flat.update(self.gauges.counters(self.now))
        return flat

    def diagnose(self) -> tuple[str, str]:
        return diagnose(self.scheduler.starvation)
