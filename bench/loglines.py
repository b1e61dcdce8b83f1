"""vLLM-style periodic stats lines, one per node.

`format_v1_line` reproduces the wording and order of vLLM 0.33's
`LoggingStatLogger.log()` (vllm/v1/metrics/loggers.py): optional parts
("Deferred", "Preemptions", "Prefix cache hit rate") appear only when vLLM
would print them. (A v0 node's lines are vLLM 0.5.3's, written by the v0
engine itself: `engine/v0/loglines.py`.)

`PeriodicStatLogger` accumulates per-step token counts and emits a line every
`interval` seconds of the caller's clock (virtual or wall; the logger never
reads a clock itself). Like vLLM it averages throughput over the elapsed
interval and logs an idle engine at DEBUG instead of INFO.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from engine.records import StepRecord

logger = logging.getLogger("disagg_sim.stats")


def format_v1_line(
    *,
    engine_index: int,
    prompt_throughput: float,
    generation_throughput: float,
    num_running: int,
    num_waiting: int,
    kv_cache_usage: float,
    num_deferred: int = 0,
    num_preemptions: int = 0,
    prefix_cache_hit_rate: float | None = None,
    kv_cache_device: str = "GPU",
) -> str:
    """kv_cache_usage and prefix_cache_hit_rate are fractions in [0, 1], printed as percent."""
    parts = [
        "Avg prompt throughput: %.1f tokens/s" % prompt_throughput,
        "Avg generation throughput: %.1f tokens/s" % generation_throughput,
        "Running: %d reqs" % num_running,
        "Waiting: %d reqs" % num_waiting,
    ]
    if num_deferred > 0:
        parts.append("Deferred: %d reqs" % num_deferred)
    if num_preemptions > 0:
        parts.append("Preemptions: %d" % num_preemptions)
    parts.append("%s KV cache usage: %.1f%%" % (kv_cache_device, kv_cache_usage * 100))
    if prefix_cache_hit_rate is not None:
        parts.append("Prefix cache hit rate: %.1f%%" % (prefix_cache_hit_rate * 100))
    return f"Engine {engine_index:03d}: " + ", ".join(parts)


@dataclass
class _Snapshot:
    num_running: int = 0
    num_waiting: int = 0
    num_swapped: int = 0
    kv_cache_usage: float = 0.0


class PeriodicStatLogger:
    """Call `record(now, ...)` once per step; it returns the line when one is due (else None)."""

    def __init__(
        self,
        engine_index: int = 0,
        interval: float = 5.0,
        start_time: float = 0.0,
        log: logging.Logger | None = logger,
        node_name: str | None = None,
    ):
        if interval <= 0:
            raise ValueError(f"interval must be > 0 seconds, got {interval}")
        self.engine_index = engine_index
        self.interval = interval
        self.log = log
        self.node_name = node_name
        self.lines: list[str] = []
        self._last_log_time = start_time
        self._prompt_tokens = 0
        self._generation_tokens = 0
        self._preemptions = 0
        self._last_prompt_tp = 0.0
        self._last_gen_tp = 0.0
        self._state = _Snapshot()
        self._last_preemptions_total: int | None = None

    def record(
        self,
        now: float,
        *,
        num_prompt_tokens: int = 0,
        num_generation_tokens: int = 0,
        num_preemptions: int = 0,
        num_running: int,
        num_waiting: int,
        kv_cache_usage: float,
        num_swapped: int = 0,
    ) -> str | None:
        self._prompt_tokens += num_prompt_tokens
        self._generation_tokens += num_generation_tokens
        self._preemptions += num_preemptions
        self._state = _Snapshot(num_running, num_waiting, num_swapped, kv_cache_usage)
        if now - self._last_log_time < self.interval:
            return None
        return self.flush(now)

    def record_step(self, step: StepRecord) -> str | None:
        """Convenience for runtimes that already build StepRecords.

        Prompt tokens = the step's prefill tokens; generation tokens = its
        decode tokens (the first token a finishing prefill samples is not
        counted, a small undercount against vLLM). Preemptions come from the
        difference of the step's running total.
        """
        total = step.num_preemptions_total
        new_preemptions = total - (self._last_preemptions_total or 0)
        self._last_preemptions_total = total
        return self.record(
            step.time,
            num_prompt_tokens=step.num_prefill_tokens,
            num_generation_tokens=step.num_decode_tokens,
            num_preemptions=max(new_preemptions, 0),
            num_running=step.num_running,
            num_waiting=step.num_waiting + step.num_waiting_for_remote_kvs,
            kv_cache_usage=step.kv_usage,
        )

    def flush(self, now: float) -> str:
        """Emit a line for the interval ending at `now`, regardless of the period."""
        elapsed = now - self._last_log_time
        prompt_tp = self._prompt_tokens / elapsed if elapsed > 0 else 0.0
        gen_tp = self._generation_tokens / elapsed if elapsed > 0 else 0.0
        idle = not any((prompt_tp, gen_tp, self._last_prompt_tp, self._last_gen_tp))
        s = self._state
        line = format_v1_line(
            engine_index=self.engine_index,
            prompt_throughput=prompt_tp,
            generation_throughput=gen_tp,
            num_running=s.num_running,
            num_waiting=s.num_waiting,
            kv_cache_usage=s.kv_cache_usage,
            num_preemptions=self._preemptions,
        )
        self._last_prompt_tp, self._last_gen_tp = prompt_tp, gen_tp
        self._last_log_time = now
        self._prompt_tokens = self._generation_tokens = self._preemptions = 0
        self.lines.append(line)
        if self.log is not None:
            prefix = f"[{self.node_name}] " if self.node_name else ""
            self.log.log(logging.DEBUG if idle else logging.INFO, "%s%s", prefix, line)
        return line
