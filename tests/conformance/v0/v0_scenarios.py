"""Scenarios for the v0 differential harness: random ones from a seed, plus a
few hand-written ones from the starvation reference.

A scenario is plain JSON, read by both sides (tools/oracle/v0_driver.py in the
oracle venv, v0_harness.run_ours here):

    {"name": str, "seed": int, "max_steps": int, "token_id": int,
     "config": {"num_gpu_blocks", "num_cpu_blocks", "block_size", "max_num_seqs",
                "max_num_batched_tokens" (null = vLLM's default), "max_model_len",
                "enable_chunked_prefill", "preemption_mode" (null | "swap" | "recompute")},
     "requests": [{"id", "prompt_len", "max_tokens", "arrival_step", "arrival_time"}, ...]}

Requests are added before step `arrival_step`, in list order; `arrival_time`
grows with the list (1 ms apart, well above float resolution at vLLM's
`time.time()`), with occasional exact ties that a stable sort keeps in order.
Every request ignores EOS and the fake model always emits `token_id`, so a
request ends by `max_tokens`, by exceeding `max_model_len`, or by being ignored.
"""

from __future__ import annotations

import random

MAX_STEPS = 400


def _requests(rng: random.Random, n: int, block_size: int, max_model_len: int, max_arrival_step: int) -> list[dict]:
    reqs = []
    steps = sorted(rng.randint(0, max_arrival_step) for _ in range(n))
    for i, step in enumerate(steps):
        kind = rng.random()
        if kind < 0.55:  # short
            prompt_len = rng.randint(1, 3 * block_size)
        elif kind < 0.80:  # long, near the limit
            prompt_len = rng.randint(max_model_len // 2, max_model_len)
        elif kind < 0.90:  # over-long: ignored (or chunk-admitted, see the reference)
            prompt_len = rng.randint(max_model_len + 1, max_model_len + 64)
        else:  # exact block multiples: appends that need a new block right away
            prompt_len = block_size * rng.randint(1, max(1, max_model_len // block_size))
        max_tokens = rng.randint(1, 12) if rng.random() < 0.7 else rng.randint(13, max_model_len)
        arrival_time = round(step + 0.001 * (i + 1), 6)
        if reqs and reqs[-1]["arrival_step"] == step and rng.random() < 0.15:
            arrival_time = reqs[-1]["arrival_time"]  # a tie: both sides must keep add order (stable sort)
        reqs.append(
            {
                "id": f"r{i}",
                "prompt_len": prompt_len,
                "max_tokens": max_tokens,
                "arrival_step": step,
                "arrival_time": arrival_time,
            }
        )
    return reqs


def random_scenario(seed: int, chunked: bool, swap: bool) -> dict:
    rng = random.Random(seed)
    block_size = rng.choice([4, 8, 16])
    max_model_len = rng.choice([32, 64, 128, 256])
    if rng.random() < 0.2:
        # Big enough for a watermark (int(0.01 * blocks) >= 1) with small blocks.
        block_size = 4
        num_gpu_blocks = rng.randint(100, 220)
    else:
        num_gpu_blocks = rng.randint(3, 48)  # tight: preemption and NEVER happen
    if chunked:
        max_num_batched_tokens = None if rng.random() < 0.25 else rng.randint(8, 2 * max_model_len)
    else:
        max_num_batched_tokens = None if rng.random() < 0.25 else rng.randint(max_model_len, 2 * max_model_len)
    budget = max_num_batched_tokens or (512 if chunked else max(max_model_len, 2048))
    max_num_seqs = min(rng.choice([1, 2, 3, 4, 6, 8, 256]), budget)
    if swap:
        preemption_mode = "swap"
        # Sometimes too small on purpose: vLLM aborts when swap space runs out.
        num_cpu_blocks = (
            rng.randint(1, 12) if rng.random() < 0.25 else rng.randint(num_gpu_blocks, 3 * num_gpu_blocks + 8)
        )
    else:
        preemption_mode = rng.choice([None, "recompute"])
        num_cpu_blocks = rng.choice([0, rng.randint(1, 64)])
    n = rng.randint(2, 18)
    return {
        "name": f"random-{seed}-{'chunked' if chunked else 'default'}-{'swap' if swap else 'recompute'}",
        "seed": seed,
        "max_steps": MAX_STEPS,
        "token_id": 7,
        "config": {
            "num_gpu_blocks": num_gpu_blocks,
            "num_cpu_blocks": num_cpu_blocks,
            "block_size": block_size,
            "max_num_seqs": max_num_seqs,
            "max_num_batched_tokens": max_num_batched_tokens,
            "max_model_len": max_model_len,
            "enable_chunked_prefill": chunked,
            "preemption_mode": preemption_mode,
        },
        "requests": _requests(rng, n, block_size, max_model_len, max_arrival_step=rng.choice([0, 5, 20])),
    }


def random_scenarios(count: int, base_seed: int = 0) -> list[dict]:
    """`count` scenarios cycling through the four (chunked, swap) settings."""
    combos = [(False, False), (False, True), (True, False), (True, True)]
    return [random_scenario(base_seed + i, *combos[i % 4]) for i in range(count)]


def _fixed(name: str, config: dict, requests: list[tuple]) -> dict:
    base = {
        "num_cpu_blocks": 0,
        "block_size": 16,
        "max_num_seqs": 256,
        "max_num_batched_tokens": None,
        "max_model_len": 256,
        "enable_chunked_prefill": False,
        "preemption_mode": None,
    }
    base.update(config)
    reqs = [
        {"id": rid, "prompt_len": p, "max_tokens": m, "arrival_step": s, "arrival_time": round(s + 0.001 * (i + 1), 6)}
        for i, (rid, p, m, s) in enumerate(requests)
    ]
    return {"name": name, "seed": 0, "max_steps": MAX_STEPS, "token_id": 7, "config": base, "requests": reqs}


def hand_written_scenarios() -> list[dict]:
    return [
        # A long head that does not fit blocks the short ones behind it.
        _fixed(
            "hol-long-head",
            {"num_gpu_blocks": 10},
            [("long0", 100, 30, 0), ("long1", 150, 5, 1), ("s0", 8, 3, 1), ("s1", 8, 3, 1)],
        ),
        # Decode growth preempts the latest arrival, which goes back to the waiting head.
        _fixed(
            "recompute-thrash",
            {"num_gpu_blocks": 6, "block_size": 4, "max_model_len": 64},
            [(f"q{i}", 6, 20, 0) for i in range(4)] + [("late", 4, 2, 3)],
        ),
        # Swapped groups keep the prefill phase shut.
        _fixed(
            "swap-priority",
            {
                "num_gpu_blocks": 6,
                "block_size": 4,
                "max_model_len": 64,
                "num_cpu_blocks": 32,
                "preemption_mode": "swap",
            },
            [(f"q{i}", 6, 16, 0) for i in range(4)] + [("late", 2, 2, 2)],
        ),
        # Over-long prompts are dropped without blocking; with chunking the limit is max_model_len.
        _fixed(
            "ignored-prompts",
            {"num_gpu_blocks": 40, "max_model_len": 64},
            [("big", 65, 2, 0), ("ok", 64, 2, 0), ("tiny", 1, 2, 0)],
        ),
        _fixed(
            "ignored-prompts-chunked",
            {
                "num_gpu_blocks": 40,
                "max_model_len": 64,
                "enable_chunked_prefill": True,
                "max_num_batched_tokens": 16,
                "max_num_seqs": 8,
            },
            [("big", 65, 2, 0), ("ok", 64, 2, 0), ("tiny", 1, 2, 0)],
        ),
        # A watermark of one block (100 blocks): admission stops one block early.
        _fixed(
            "watermark",
            {"num_gpu_blocks": 100, "block_size": 4, "max_model_len": 400},
            [("a", 396, 1, 0), ("b", 400, 1, 0), ("c", 4, 1, 0)],
        ),
        # Swap space too small: vLLM aborts the engine.
        _fixed(
            "swap-space-exhausted",
            {"num_gpu_blocks": 6, "block_size": 4, "max_model_len": 64, "num_cpu_blocks": 1, "preemption_mode": "swap"},
            [(f"q{i}", 6, 16, 0) for i in range(4)],
        ),
    ]
