"""Every metric a result carries: its definition, unit and vLLM equivalent.

`docs/metrics.md` is rendered from this module (`disagg-sim schema
--glossary`) and a test keeps the two equal, and keeps every name the code
produces (bench/metric_names.py) described here: a new counter without a
definition fails the suite, so the glossary cannot fall behind.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Entry:
    group: str
    definition: str
    unit: str
    vllm: str = ""  # vLLM's name for the same figure: a `vllm bench serve` key or a /metrics series


SERVE = "Serving (`vllm bench serve`'s keys)"
LAT = "Latency distributions"
STEPS = "Scheduler steps (per node under `steps_per_node`)"
SCHED = "Scheduler counters (summed over nodes; `*_peak` is the max)"
KV = "KV handoff (P/D connector)"
CHECKS = "Integrity checks (should be 0)"
PREFIX = "Prefix cache"
V0 = "Legacy v0 scheduler (v0 nodes only)"
RUN = "The run itself"

_E = Entry
_KV_USAGE = "vllm:kv_cache_usage_perc"
GLOSSARY: dict[str, Entry] = {
    # -- serving
    "duration": _E(SERVE, "First arrival to the last finish.", "s", "duration"),
    "num_requests": _E(SERVE, "Requests in the workload.", "requests", "num_prompts"),
    "completed": _E(SERVE, "Requests that finished with output (stop or length).", "requests", "completed"),
    "failed": _E(SERVE, "Requests that ended in an error or abort.", "requests", "failed"),
    "num_unfinished": _E(SERVE, "Requests neither finished nor failed when the run ended.", "requests"),
    "total_input_tokens": _E(SERVE, "Prompt tokens over completed requests.", "tokens", "total_input_tokens"),
    "total_output_tokens": _E(SERVE, "Generated tokens over completed requests.", "tokens", "total_output_tokens"),
    "request_throughput": _E(SERVE, "completed / duration.", "req/s", "request_throughput"),
    "output_throughput": _E(SERVE, "total_output_tokens / duration.", "tok/s", "output_throughput"),
    "total_token_throughput": _E(
        SERVE, "(total_input_tokens + total_output_tokens) / duration.", "tok/s", "total_token_throughput"
    ),
    "max_concurrent_requests": _E(SERVE, "Most requests in flight at once.", "requests", "max_concurrent_requests"),
    "max_output_tokens_per_s": _E(
        SERVE, "Most output tokens in one 1-second window.", "tok/s", "max_output_tokens_per_s"
    ),
    "request_goodput": _E(
        SERVE,
        "Completed requests meeting every `report.slo` target (TTFT, TPOT, E2EL; a one-token request's TPOT is 0)"
        " / duration: DistServe's goodput. Only with `report.slo`.",
        "req/s",
        "request_goodput",
    ),
    "slo_attainment_pct": _E(
        SERVE, "Requests meeting every `report.slo` target / all requests x 100. Only with `report.slo`.", "%"
    ),
    # -- steps
    "num_steps": _E(STEPS, "Engine steps (scheduled batches).", "steps"),
    "mean_kv_usage": _E(STEPS, "KV blocks in use / all blocks, mean over steps.", "fraction", _KV_USAGE),
    "max_kv_usage": _E(STEPS, "KV blocks in use / all blocks, max over steps.", "fraction", _KV_USAGE),
    "mean_num_running": _E(STEPS, "RUNNING requests, mean over steps.", "requests", "vllm:num_requests_running"),
    "max_num_running": _E(STEPS, "RUNNING requests, max over steps.", "requests", "vllm:num_requests_running"),
    "mean_num_waiting": _E(STEPS, "WAITING requests, mean over steps.", "requests", "vllm:num_requests_waiting"),
    "max_num_waiting": _E(STEPS, "WAITING requests, max over steps.", "requests", "vllm:num_requests_waiting"),
    "max_num_waiting_for_remote_kvs": _E(STEPS, "Requests in WAITING_FOR_REMOTE_KVS, max over steps.", "requests"),
    "max_num_deferred_blocks": _E(STEPS, "Blocks in `deferred_frees`, max over steps.", "blocks"),
    "max_batches_in_flight": _E(STEPS, "Scheduled batches not yet processed, max over steps.", "batches"),
    "mean_batch_size": _E(STEPS, "Requests per step, mean.", "requests"),
    "total_scheduled_tokens": _E(STEPS, "Sum of `total_num_scheduled_tokens` over steps.", "tokens"),
    "total_prefill_tokens": _E(STEPS, "Prompt tokens computed (recomputation after preemption included).", "tokens"),
    "total_decode_tokens": _E(STEPS, "Decode tokens computed.", "tokens"),
    "total_step_time": _E(STEPS, "Sum of the cost model's step durations.", "s"),
    # -- scheduler counters
    "num_preemptions": _E(SCHED, "Preemptions (a running request sent back to waiting).", "preemptions",
                          "vllm:num_preemptions"),
    "num_zero_progress_preemptions": _E(
        SCHED, "Preemptions whose victim freed no block: its blocks went to `deferred_frees` because an in-flight "
        "step still held them (the cascade of vLLM #49674).", "preemptions"),
    "num_allocate_slots_calls": _E(SCHED, "Calls to `KVCacheManager.allocate_slots()`.", "calls"),
    "deferred_free_blocks": _E(SCHED, "Blocks in `deferred_frees` at the end of the run.", "blocks"),
    "deferred_free_blocks_peak": _E(SCHED, "Largest `deferred_frees` seen.", "blocks"),
    "num_blocks_freed_by_drain": _E(SCHED, "Blocks released from `deferred_frees` when a fenced step finished.",
                                    "blocks"),
    "num_fence_stopped_retries": _E(SCHED, "Preemption retries stopped at a fenced victim (the fix, PR #49675).",
                                    "retries"),
    "requests_aborted": _E(SCHED, "Requests aborted (client gone, or a fault).", "requests"),
    "requests_rejected": _E(SCHED, "Requests a node refused (too long, or no node to take them).", "requests"),
    "stage_token_mismatches": _E(CHECKS, "Pipeline stages that returned tokens other than the last stage's.",
                                 "steps"),
    # -- prefix cache
    "prefix_cache_queries": _E(PREFIX, "Prompt tokens looked up in the prefix cache at first admission.", "tokens",
                               "vllm:prefix_cache_queries"),
    "prefix_cache_hits": _E(PREFIX, "Of those, tokens found cached.", "tokens", "vllm:prefix_cache_hits"),
    "prefix_cache_hit_rate_pct": _E(PREFIX, "100 × prefix_cache_hits / prefix_cache_queries.", "%",
                                    "vllm's logged `Prefix cache hit rate`"),
    "prefix_cache_preempted_queries": _E(PREFIX, "Tokens looked up when a preempted request was re-admitted.",
                                         "tokens"),
    "prefix_cache_preempted_hits": _E(PREFIX, "Of those, tokens found cached (its own blocks, still cached).",
                                      "tokens"),
    # -- KV handoff
    "kv_pulls_started": _E(KV, "KV pulls a decode node started.", "pulls"),
    "kv_pulls_completed": _E(KV, "KV pulls that landed every block.", "pulls"),
    "kv_pulls_failed": _E(KV, "KV pulls that failed (any reason).", "pulls", "vllm:nixl_num_failed_transfers"),
    "kv_pull_attempts": _E(KV, "Pull attempts, retries included.", "attempts"),
    "kv_blocks_pulled": _E(KV, "KV blocks received by decode nodes.", "blocks"),
    "kv_bytes_pulled": _E(KV, "Bytes received by decode nodes.", "bytes"),
    "kv_blocks_served": _E(KV, "KV blocks a prefill node served.", "blocks"),
    "kv_pull_reads_failed": _E(KV, "Block reads a prefill node could not serve.", "reads"),
    "kv_done_reports": _E(KV, "Pull-done reports a prefill node received (`finished_sending`).", "reports"),
    "kv_done_reports_sent": _E(KV, "Pull-done reports decode nodes sent.", "reports"),
    "kv_done_reports_delivered": _E(KV, "Pull-done reports that reached their prefill node.", "reports"),
    "kv_failed_done_reports": _E(KV, "Pull-done reports that could not be delivered.", "reports"),
    "kv_late_done_reports": _E(KV, "Pull-done reports for blocks already released (hold expired).", "reports"),
    "kv_hold_timeouts": _E(KV, "Prompts whose held blocks a prefill node released after the hold expired.",
                           "requests"),
    "kv_released_by_proxy": _E(KV, "Held prompts the proxy released (abort or re-route).", "requests"),
    "kv_access_denied": _E(KV, "Pulls refused: wrong secret, request or peer.", "pulls"),
    "transport_retries": _E(KV, "Transport calls retried after a transient error.", "retries"),
    # -- integrity
    "kv_corruptions_detected": _E(CHECKS, "Writes by an in-flight step onto blocks another request owns (fence off).",
                                  "writes"),
    "kv_checksum_failures": _E(CHECKS, "Pulled blocks whose checksum did not match.", "blocks"),
    "kv_block_content_mismatches": _E(CHECKS, "Pulled blocks whose content differs from what the producer wrote.",
                                      "blocks"),
    "kv_blocks_verified": _E(KV, "Pulled blocks checked against the producer's content.", "blocks"),
    "shadow_corruptions": _E(CHECKS, "Shadow KV store: reads of a slot another request overwrote.", "reads"),
    "shadow_clobbered_slots": _E(CHECKS, "Shadow KV store: slots written by a request that no longer owned them.",
                                 "slots"),
    "shadow_stale_writes": _E(CHECKS, "Shadow KV store: writes by a step scheduled before the block changed owner.",
                              "writes"),
    "shadow_read_foreign": _E(CHECKS, "Shadow KV store: reads that found another request's token.", "reads"),
    "shadow_read_missing": _E(CHECKS, "Shadow KV store: reads of a slot never written.", "reads"),
    "shadow_read_hit_mismatches": _E(CHECKS, "Shadow KV store: prefix-cache hits whose content differs.", "reads"),
    # -- v0
    "num_ignored_prompts": _E(V0, "Prompts v0 ignored (longer than the model or the pool can hold).", "requests"),
    "num_preemptions_recompute": _E(V0, "Preemptions by recomputation.", "preemptions"),
    "num_preemptions_swap": _E(V0, "Preemptions by swapping to CPU blocks.", "preemptions"),
    "v0_num_steps": _E(V0, "v0 scheduler steps.", "steps"),
    "v0_cpu_blocks_used_peak": _E(V0, "CPU (swap) blocks in use, max.", "blocks", "vllm:cpu_cache_usage_perc"),
    "v0_cpu_blocks_used_steps": _E(V0, "Steps with any CPU block in use.", "steps"),
    "v0_gpu_blocks_used_peak": _E(V0, "GPU blocks in use, max.", "blocks", "vllm:gpu_cache_usage_perc"),
    "v0_num_running_final": _E(V0, "RUNNING requests at the end.", "requests"),
    "v0_num_running_peak": _E(V0, "RUNNING requests, max.", "requests", "vllm:num_requests_running"),
    "v0_num_swapped_final": _E(V0, "SWAPPED requests at the end.", "requests"),
    "v0_num_swapped_peak": _E(V0, "SWAPPED requests, max.", "requests", "vllm:num_requests_swapped"),
    "v0_num_waiting_final": _E(V0, "WAITING requests at the end.", "requests"),
    "v0_num_waiting_peak": _E(V0, "WAITING requests, max.", "requests", "vllm:num_requests_waiting"),
    "v0_swapped_request_steps": _E(V0, "Sum over steps of the requests swapped out.", "request-steps"),
    "v0_waiting_drains": _E(V0, "Times the waiting queue emptied.", "events"),
    "v0_waiting_nonempty_ms_peak": _E(V0, "Longest stretch with a non-empty waiting queue.", "ms"),
    "starvation_head_of_line_events": _E(V0, "Steps where the waiting queue's head could not be admitted.", "steps"),
    "starvation_head_of_line_alloc_later": _E(V0, "Of those: no blocks for the head (`AllocStatus.LATER`).",
                                              "steps"),
    "starvation_head_of_line_budget": _E(V0, "Of those: the head did not fit the token budget.", "steps"),
    "starvation_head_of_line_bypassable": _E(V0, "Of those: a request behind the head would have fit.", "steps"),
    "starvation_recompute_reinsertions": _E(V0, "Recompute-preempted requests put back at the queue's front.",
                                            "events"),
    "starvation_recompute_overtaken": _E(V0, "Re-inserted requests overtaken by later arrivals.", "events"),
    "starvation_recompute_overtaken_earlier_arrivals": _E(
        V0, "Of those, overtaken by requests that arrived earlier than the preempted one.", "events"),
    "starvation_swap_priority_events": _E(V0, "Steps where swapped requests blocked the waiting queue.", "steps"),
    "starvation_swap_priority_waiting": _E(V0, "Waiting requests held back in those steps (sum).", "requests"),
    "starvation_swap_priority_bypassable": _E(V0, "Of those, ones that would have fit.", "requests"),
    # -- the run
    "repeat": _E(RUN, "Repeat index (0-based); repeat r uses seed + r.", ""),
    "seed": _E(RUN, "The repeat's seed.", ""),
}  # fmt: skip

_LATENCIES = {
    "ttft": ("Time to first token: arrival to the first output token at the client.", "ttft"),
    "tpot": ("Time per output token after the first: (e2el - ttft) / (output tokens - 1), per request.", "tpot"),
    "itl": ("Inter-token latency: the gap between consecutive output tokens.", "itl"),
    "e2el": ("End-to-end latency: arrival to finish.", "e2el"),
    "queue_time": ("Arrival to the first time a scheduler admitted the request.", ""),
    "remote_kv_wait": ("Time in WAITING_FOR_REMOTE_KVS (the KV pull) on the decode node.", ""),
}
# The TTFT breakdown's parts (proxy/breakdown.py: they add up to each request's TTFT).
_TTFT_PARTS = {
    "front_end": "the API server's parsing, chat template and tokenization, and the IPC to the engine",
    "proxy_prefill_request": "the proxy's prompt-only request to a prefill instance (an HTTP leg)",
    "queue": "waiting at the first node until its scheduler admits the request",
    "prefill": "the prompt's steps at the prefill (or aggregated) node, to its output at the proxy",
    "proxy_decode_request": "the prefill's reply through the proxy and the request to a decode instance",
    "decode_queue": "at the decode node until its KV load starts",
    "transfer": "the KV load: handshake on first contact, metadata, the blocks over the link",
    "decode_admission": "from the load's end to the decode node scheduling the request",
    "first_decode_step": "the decode node's first step, to its token at the proxy",
    "to_client": (
        "from the proxy to the client: the IPC back to the API server, then its detokenization and"
        " streaming, queued behind the node's earlier batches"
    ),
}
for _part, _text in _TTFT_PARTS.items():
    _LATENCIES[f"ttft_{_part}"] = (f"TTFT part `{_part}`: {_text}.", "")
_STAT = re.compile(r"^(mean|median|std|p(\d+(?:\.\d+)?))_(" + "|".join(_LATENCIES) + r")_ms$")
_PULL_FAILED = re.compile(r"^kv_pulls_failed_(\w+)$")


def describe(name: str) -> Entry | None:
    """The entry for a metric name, patterns included (`p95_ttft_ms`, `kv_pulls_failed_<reason>`)."""
    if name in GLOSSARY:
        return GLOSSARY[name]
    m = _STAT.match(name)
    if m:
        stat, pct, what = m.group(1), m.group(2), m.group(3)
        text, key = _LATENCIES[what]
        how = f"the {pct}th percentile" if pct else {"mean": "the mean", "median": "the median", "std": "the std"}[stat]
        vllm = f"{stat}_{key}_ms" if key else ""
        return Entry(LAT, f"{text} ({how} over completed requests)", "ms", vllm)
    m = _PULL_FAILED.match(name)
    if m:
        return Entry(KV, f"KV pulls that failed with reason `{m.group(1)}`.", "pulls")
    return None


_PREAMBLE = """# Metrics

<!-- Generated by `disagg-sim schema --glossary` from bench/metric_glossary.py; a test keeps it equal. -->

Every number a results JSON carries, by name: what it measures, its unit,
and vLLM's name for the same figure where it has one (a `vllm bench serve`
result key, or a `/metrics` series). `disagg-sim schema --metrics SCENARIO`
lists the names one scenario's results will have.

## How the table and thresholds read them

- **mean ± std**: over a variant's repeats (sample std, n − 1).
- **(×r), the ratio**: the variant's mean divided by the baseline's mean —
  exactly what a threshold `metric[variant] / metric[baseline]` computes;
  `inf` when the baseline is 0 and the variant is not, `n/a` for 0 / 0.
- **thresholds**: `metric[variant]` is the mean over repeats; wrap it in an
  aggregate to take another: `mean`, `min`, `max`, `median`, `std`
  (`max(num_zero_progress_preemptions[fixed]) == 0`). Arithmetic `+ - * /`
  and comparisons `== != <= >= < >`; x / 0 is ±inf, 0 / 0 fails the threshold.
- **per node**: `metric[variant@node]` is one node's figure (its counters
  and step aggregates; serving metrics are the client's and have no node),
  and `--by-node` adds a column per node to the table.
- Latency percentiles follow the scenario's `report.percentiles`
  (default 50, 90, 99): `p<P>_<name>_ms`.
"""


def render_markdown(names: Iterable[str]) -> str:
    """docs/metrics.md: every name, grouped, with its definition, unit and vLLM equivalent."""
    by_group: dict[str, list[tuple[str, Entry]]] = {}
    missing = []
    for name in sorted(set(names)):
        entry = describe(name)
        if entry is None:
            missing.append(name)
            continue
        by_group.setdefault(entry.group, []).append((name, entry))
    if missing:
        raise KeyError(f"metrics without a glossary entry (bench/metric_glossary.py): {', '.join(missing)}")
    order = [SERVE, LAT, STEPS, SCHED, PREFIX, KV, CHECKS, V0, RUN]
    out = [_PREAMBLE]
    for group in order:
        rows = by_group.get(group)
        if not rows:
            continue
        out += [f"\n## {group}\n", "| metric | definition | unit | vLLM |", "|---|---|---|---|"]
        for name, e in rows:
            vllm = f"`{e.vllm}`" if e.vllm and not e.vllm.startswith("vllm's") else e.vllm
            out.append(f"| `{name}` | {e.definition} | {e.unit} | {vllm} |")
    return "\n".join(out) + "\n"


def documented_names() -> set[str]:
    """Every metric name of every built-in scenario's results (the default percentiles)."""
    from .scenario import builtin_scenarios, load_scenario

    names: set[str] = set()
    for scenario in builtin_scenarios():
        names |= load_scenario(scenario).known_metrics()
    return names
