"""A Mooncake trace whose prompts share `hash_ids` replays with the prefix
cache hit rate the trace implies. The expectation is computed here from the
trace alone — which 16-token blocks of each prompt an earlier prompt already
holds, under vLLM's rules (full blocks only, the last token recomputed) — not
from the engine. The pool is large and the budget covers a whole prompt, so
nothing is evicted and no prompt is split."""

from __future__ import annotations

import json
from pathlib import Path

from bench.traces import MOONCAKE_BLOCK_TOKENS, load_trace
from cluster.inproc import run_inproc
from cluster.spec import ClusterSpec

TRACE = Path(__file__).resolve().parents[1] / "data" / "mooncake_shared_prefix.jsonl"
BLOCK = 16


def expected_hits(path: Path = TRACE, block: int = BLOCK) -> tuple[int, int]:
    """(queried tokens, hit tokens) over the trace, in arrival order."""
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    rows.sort(key=lambda r: r["timestamp"])
    seen: set[tuple] = set()
    queries = hits = 0
    for i, row in enumerate(rows):
        n, ids = row["input_length"], row["hash_ids"]
        # Engine block j's content: the hash ids up to the trace block it lies
        # in and its place there; past the listed ids, the request's own.
        keys = [
            (tuple(ids[: m + 1]), j) if (m := (j * block) // MOONCAKE_BLOCK_TOKENS) < len(ids) else (i, j)
            for j in range(n // block)
        ]
        max_hit = (n - 1) // block
        hit = 0
        while hit < max_hit and keys[hit] in seen:
            hit += 1
        queries += n
        hits += hit * block
        seen.update(keys)
    return queries, hits


def spec(**overrides) -> ClusterSpec:
    base = {
        "prefill": {"count": 0},
        "decode": {
            "count": 1,
            "engine": {"num_gpu_blocks": 4000, "max_num_batched_tokens": 8192, "enable_prefix_caching": True},
        },
        "time_scale": 0.02,
    }
    base.update(overrides)
    return ClusterSpec.model_validate(base)


def test_expected_hit_rate_is_substantial():
    queries, hits = expected_hits()
    assert queries > 0 and 0.3 < hits / queries < 0.95  # the trace shares a lot, not everything


def test_the_trace_replays_in_process_with_the_hit_rate_it_implies():
    workload = load_trace(TRACE)
    result = run_inproc(spec(), workload, seed=0)
    assert result.invariant_errors == []
    c = result.node_counters["decode-0"]
    assert (c["prefix_cache_queries"], c["prefix_cache_hits"]) == expected_hits()
    assert c["kv_corruptions_detected"] == 0
