"""A per-node Prometheus exporter speaking vLLM's metric names.

Each node gets its own CollectorRegistry (so several nodes can live in one
process) and, when started, its own HTTP server on 127.0.0.1. Every series is
labelled `model_name` and `engine` (the node name by default), as vLLM v1
labels them. Names and histogram buckets follow vLLM 0.33's
`vllm/v1/metrics/loggers.py` and `buckets.py`; v0's `num_requests_swapped`,
`gpu_cache_usage_perc` and `cpu_cache_usage_perc` gauges are kept for
dashboards built against v0. The simulator's own series use `disagg_sim:`.

The exporter knows nothing about the engine: a node feeds it numbers,
RequestRecords and StepRecords.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest, start_http_server

from engine.records import RequestRecord, StepRecord
from proxy.breakdown import PARTS as TTFT_PARTS

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer

# vLLM 0.33 vllm/v1/metrics/buckets.py
REQUEST_LATENCY_BUCKETS = (
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
)
TIME_TO_FIRST_TOKEN_BUCKETS = (
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
)
INTER_TOKEN_LATENCY_BUCKETS = (
    0.01,
    0.025,
    0.05,
    0.075,
    0.1,
    0.15,
    0.2,
    0.3,
    0.4,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
)

# vLLM's build_1_2_5_buckets, up to a length no request here exceeds.
TOKEN_COUNT_BUCKETS = tuple(m * 10**e for e in range(6) for m in (1, 2, 5))
# vLLM sizes these from cudagraph capture sizes and max_num_batched_tokens; powers of two here.
ITERATION_TOKENS_BUCKETS = tuple(2**k for k in range(15))
# KV transfer times (vLLM's NIXL connector's `nixl_xfer_time_seconds` buckets).
KV_TRANSFER_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 5.0)
FINISHED_REASONS = ("stop", "length", "abort", "error")

# Counter keys a node reports (see engine counters) -> our counter attribute.
_COUNTER_FOR_KEY = {
    "kv_pulls_started": "kv_pulls_started",
    "kv_pulls_completed": "kv_pulls_completed",
    "kv_pulls_failed": "kv_pulls_failed",
    "kv_blocks_pulled": "kv_blocks_pulled",
    "num_preemptions": "preemptions",
    "num_zero_progress_preemptions": "zero_progress_preemptions",
    "num_allocate_slots_calls": "allocate_slots_calls",
    "num_blocks_freed_by_drain": "blocks_freed_by_drain",
    "kv_corruptions_detected": "kv_corruptions",
    "prefix_cache_queries": "prefix_cache_queries",
    "prefix_cache_hits": "prefix_cache_hits",
}


class NodeMetricsExporter:
    """`extra_labels` adds label names to every series (e.g. `variant`), all
    empty until `relabel` gives them values; one exporter (and one HTTP
    server) then serves run after run, each under its own labels."""

    def __init__(
        self,
        node_name: str,
        model_name: str = "disagg-sim",
        engine: str | None = None,
        extra_labels: tuple[str, ...] = (),
    ):
        self.node_name = node_name
        self.registry = CollectorRegistry()
        self.labels = {"model_name": model_name, "engine": engine if engine is not None else node_name}
        self.labels.update({name: "" for name in extra_labels})
        self._server: WSGIServer | None = None
        self._thread: threading.Thread | None = None
        self._totals = {attr: 0 for attr in _COUNTER_FOR_KEY.values()}
        self._deferred_peak = 0
        self._families: dict[str, Gauge | Counter | Histogram] = {}

        names = list(self.labels)

        def family(metric):
            self._families[metric._name] = metric
            return metric.labels(**self.labels)

        def gauge(name: str, doc: str) -> Gauge:
            return family(Gauge(name, doc, names, registry=self.registry))

        def counter(name: str, doc: str) -> Counter:
            return family(Counter(name, doc, names, registry=self.registry))

        def histogram(name: str, doc: str, buckets) -> Histogram:
            return family(Histogram(name, doc, names, buckets=buckets, registry=self.registry))

        self.num_requests_running = gauge("vllm:num_requests_running", "Number of requests in model execution batches.")
        self.num_requests_waiting = gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed.")
        self.kv_cache_usage_perc = gauge("vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage.")
        self.num_requests_swapped = gauge("vllm:num_requests_swapped", "Number of requests swapped to CPU (v0).")
        self.gpu_cache_usage_perc = gauge("vllm:gpu_cache_usage_perc", "GPU KV-cache usage (v0). 1 means 100 percent.")
        self.cpu_cache_usage_perc = gauge("vllm:cpu_cache_usage_perc", "CPU KV-cache usage (v0). 1 means 100 percent.")
        # prometheus_client appends _total: exposed as vllm:num_preemptions_total, as in vLLM.
        self.preemptions = counter("vllm:num_preemptions", "Cumulative number of preemption from the engine.")
        # Exposed as vllm:prefix_cache_queries_total / _hits_total, as in vLLM.
        self.prefix_cache_queries = counter(
            "vllm:prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.",
        )
        self.prefix_cache_hits = counter(
            "vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens."
        )
        self.ttft = histogram(
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            TIME_TO_FIRST_TOKEN_BUCKETS,
        )
        self.itl = histogram(
            "vllm:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            INTER_TOKEN_LATENCY_BUCKETS,
        )
        self.tpot = histogram(
            "vllm:request_time_per_output_token_seconds",
            "Histogram of time_per_output_token_seconds per request.",
            INTER_TOKEN_LATENCY_BUCKETS,
        )
        self.e2e = histogram(
            "vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", REQUEST_LATENCY_BUCKETS
        )
        self.queue_time = histogram(
            "vllm:request_queue_time_seconds",
            "Histogram of time spent in WAITING phase for request.",
            REQUEST_LATENCY_BUCKETS,
        )
        # The TTFT in parts (proxy/breakdown.py): disagg_sim:ttft_<part>_seconds,
        # TTFT's buckets; the parts of a request add up to its TTFT. One
        # attribute each (`ttft_<part>`), so `relabel` finds them like the rest.
        for part in TTFT_PARTS:
            setattr(
                self,
                f"ttft_{part}",
                histogram(
                    f"disagg_sim:ttft_{part}_seconds",
                    f"Histogram of the {part.replace('_', ' ')} part of time to first token in seconds.",
                    TIME_TO_FIRST_TOKEN_BUCKETS,
                ),
            )

        # Tokens, finish reasons and request shapes: vLLM's names, observed when a
        # request finishes (vLLM counts prompt and generation tokens per step;
        # the totals agree once the requests are done).
        self.prompt_tokens = counter("vllm:prompt_tokens", "Number of prefill tokens processed.")
        self.generation_tokens = counter("vllm:generation_tokens", "Number of generation tokens processed.")
        # One series per finish reason: a family of its own (the reason is a label of the sample).
        self._request_success = Counter(
            "vllm:request_success",
            "Count of successfully processed requests.",
            names + ["finished_reason"],
            registry=self.registry,
        )
        self.request_prompt_tokens = histogram(
            "vllm:request_prompt_tokens", "Number of prefill tokens processed.", TOKEN_COUNT_BUCKETS
        )
        self.request_generation_tokens = histogram(
            "vllm:request_generation_tokens", "Number of generation tokens processed.", TOKEN_COUNT_BUCKETS
        )
        self.iteration_tokens = histogram(
            "vllm:iteration_tokens_total", "Histogram of number of tokens per engine_step.", ITERATION_TOKENS_BUCKETS
        )
        self.prefill_time = histogram(
            "vllm:request_prefill_time_seconds",
            "Histogram of time spent in PREFILL phase for request.",
            REQUEST_LATENCY_BUCKETS,
        )
        self.decode_time = histogram(
            "vllm:request_decode_time_seconds",
            "Histogram of time spent in DECODE phase for request.",
            REQUEST_LATENCY_BUCKETS,
        )
        # The KV handoff (a decode node's pulls), under vLLM's NIXL connector names where it has one.
        self.kv_transfer_time = histogram(
            "vllm:nixl_xfer_time_seconds", "Histogram of transfer duration for KV cache transfers.", KV_TRANSFER_BUCKETS
        )
        self.kv_pulls_failed = counter("vllm:nixl_num_failed_transfers", "Number of failed NIXL KV Cache transfers.")
        self.kv_pulls_started = counter("disagg_sim:kv_pulls_started", "KV pulls a decode node started.")
        self.kv_pulls_completed = counter("disagg_sim:kv_pulls_completed", "KV pulls that landed every block.")
        self.kv_blocks_pulled = counter("disagg_sim:kv_blocks_pulled", "KV blocks received over the handoff.")

        self.zero_progress_preemptions = counter(
            "disagg_sim:num_zero_progress_preemptions",
            "Preemptions whose victim freed no blocks because a fenced step still held them.",
        )
        self.allocate_slots_calls = counter(
            "disagg_sim:num_allocate_slots_calls", "Calls to KVCacheManager.allocate_slots()."
        )
        self.blocks_freed_by_drain = counter(
            "disagg_sim:num_blocks_freed_by_drain", "Blocks released from deferred_frees when a fenced step finished."
        )
        self.kv_corruptions = counter(
            "disagg_sim:kv_corruptions_detected", "Writes by an in-flight step onto blocks owned by another request."
        )
        self.deferred_free_blocks = gauge(
            "disagg_sim:deferred_free_blocks", "Blocks waiting in deferred_frees for an in-flight step."
        )
        self.deferred_free_blocks_peak = gauge(
            "disagg_sim:deferred_free_blocks_peak", "Largest deferred_frees size seen."
        )
        self.num_requests_waiting_for_remote_kvs = gauge(
            "disagg_sim:num_requests_waiting_for_remote_kvs", "Requests in WAITING_FOR_REMOTE_KVS."
        )
        self.batches_in_flight = gauge("disagg_sim:batches_in_flight", "Scheduled batches not yet processed.")

    def relabel(self, **values: str) -> None:
        """Point every series at new label values (a new run). Counters are
        tracked from zero again: a run reports its own totals, and a series
        seen before (the same variant, another repeat) keeps counting up."""
        unknown = set(values) - set(self.labels) | ({"model_name", "engine"} & set(values))
        if unknown:
            raise ValueError(f"relabel: {sorted(unknown)} are not extra labels of this exporter")
        old = dict(self.labels)
        self.labels.update(values)
        placeholder = all(old[k] == "" for k in old if k not in ("model_name", "engine"))
        for attr, child in list(vars(self).items()):
            fam = self._families.get(getattr(child, "_name", None) or "")
            if fam is not None and attr != "_families":
                if placeholder:  # the unlabelled series from before the first run: not a run's data
                    fam.remove(*old.values())
                setattr(self, attr, fam.labels(**self.labels))
        self._totals = {attr: 0 for attr in _COUNTER_FOR_KEY.values()}
        self._deferred_peak = 0

    # ---- feeding -----------------------------------------------------------------------------

    def update_gauges(
        self,
        *,
        num_running: int,
        num_waiting: int,
        kv_cache_usage: float,
        num_swapped: int = 0,
        cpu_cache_usage: float = 0.0,
        num_waiting_for_remote_kvs: int | None = None,
        num_deferred_blocks: int | None = None,
        batches_in_flight: int | None = None,
    ) -> None:
        self.num_requests_running.set(num_running)
        self.num_requests_waiting.set(num_waiting)
        self.kv_cache_usage_perc.set(kv_cache_usage)
        self.gpu_cache_usage_perc.set(kv_cache_usage)
        self.num_requests_swapped.set(num_swapped)
        self.cpu_cache_usage_perc.set(cpu_cache_usage)
        if num_waiting_for_remote_kvs is not None:
            self.num_requests_waiting_for_remote_kvs.set(num_waiting_for_remote_kvs)
        if num_deferred_blocks is not None:
            self.set_deferred_free_blocks(num_deferred_blocks)
        if batches_in_flight is not None:
            self.batches_in_flight.set(batches_in_flight)

    def observe_step(self, step: StepRecord) -> None:
        """Gauges from one step, and the preemption counters brought up to the step's totals."""
        self.update_gauges(
            num_running=step.num_running,
            num_waiting=step.num_waiting,
            kv_cache_usage=step.kv_usage,
            num_waiting_for_remote_kvs=step.num_waiting_for_remote_kvs,
            num_deferred_blocks=step.num_deferred_blocks,
            batches_in_flight=step.batches_in_flight,
        )
        if step.num_scheduled_tokens:
            self.iteration_tokens.observe(step.num_scheduled_tokens)
        self.sync_counters(
            {
                "num_preemptions": step.num_preemptions_total,
                "num_zero_progress_preemptions": step.num_zero_progress_preemptions_total,
            }
        )

    def observe_request(self, rec: RequestRecord) -> None:
        """Histograms for a finished request (vLLM observes latencies at finish, too)."""
        if rec.token_times:
            self.ttft.observe(rec.token_times[0] - rec.arrival_time)
            for a, b in zip(rec.token_times, rec.token_times[1:]):
                self.itl.observe(b - a)
        if rec.e2el is not None:
            self.e2e.observe(rec.e2el)
            if len(rec.token_times) > 1:
                ttft = rec.token_times[0] - rec.arrival_time
                self.tpot.observe((rec.e2el - ttft) / (len(rec.token_times) - 1))
        if rec.queue_time is not None:
            self.queue_time.observe(rec.queue_time)
        if rec.ttft_breakdown is not None:
            for part, seconds in rec.ttft_breakdown.items():
                getattr(self, f"ttft_{part}").observe(seconds)
        generated = len(rec.output_token_ids)
        self.prompt_tokens.inc(rec.prompt_len)
        self.generation_tokens.inc(generated)
        self.request_prompt_tokens.observe(rec.prompt_len)
        self.request_generation_tokens.observe(generated)
        if rec.finish_reason is not None:
            self._request_success.labels(**self.labels, finished_reason=rec.finish_reason).inc()
        if rec.token_times and rec.first_scheduled_time is not None:
            self.prefill_time.observe(max(0.0, rec.token_times[0] - rec.first_scheduled_time))
            if rec.finish_time is not None:
                self.decode_time.observe(max(0.0, rec.finish_time - rec.token_times[0]))
        if rec.remote_kv_wait is not None:
            self.kv_transfer_time.observe(rec.remote_kv_wait)

    def _inc(self, attr: str, n: int) -> None:
        if n:
            getattr(self, attr).inc(n)
            self._totals[attr] += n

    def set_deferred_free_blocks(self, n: int) -> None:
        self.deferred_free_blocks.set(n)
        self._deferred_peak = max(self._deferred_peak, n)
        self.deferred_free_blocks_peak.set(self._deferred_peak)

    def sync_counters(self, counters: Mapping[str, int]) -> None:
        """Raise counters to a node's absolute totals (the dict the runtimes report).

        Prometheus counters only go up, so we add the difference from what was
        counted so far; a total that went backwards is a bug upstream.
        """
        for key, value in counters.items():
            if key == "deferred_free_blocks_peak":
                self._deferred_peak = max(self._deferred_peak, value)
                self.deferred_free_blocks_peak.set(self._deferred_peak)
                continue
            attr = _COUNTER_FOR_KEY.get(key)
            if attr is None:
                continue
            delta = value - self._totals[attr]
            if delta < 0:
                raise ValueError(f"counter {key} went backwards: {self._totals[attr]} -> {value}")
            self._inc(attr, delta)

    # ---- serving -----------------------------------------------------------------------------

    def render(self) -> bytes:
        """The text exposition, as /metrics would serve it."""
        return generate_latest(self.registry)

    def start(self, port: int = 0, host: str = "127.0.0.1") -> int:
        """Serve /metrics on host:port (0 = an ephemeral port); returns the bound port."""
        if self._server is not None:
            raise RuntimeError(f"exporter for {self.node_name} already serving on port {self.port}")
        self._server, self._thread = start_http_server(port, addr=host, registry=self.registry)
        return self._server.server_port  # (`self.port` now)

    @property
    def port(self) -> int | None:
        return None if self._server is None else self._server.server_port

    @property
    def url(self) -> str | None:
        if self._server is None:
            return None
        return f"http://{self._server.server_address[0]!s}:{self.port}/metrics"

    def stop(self) -> None:
        if self._server is None:
            return
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._server = self._thread = None
