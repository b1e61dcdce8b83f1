"""Random v1 conformance scenarios (format: v1_scenario.py).

Each scenario is drawn from its own seed, so scenario N is the same on every
machine and can be regenerated alone (`generate(seed)`). Pools are tight on
purpose: a few blocks more than the largest request needs, so concurrent
requests preempt each other. The actions follow an engine loop at batch-queue
depth 1 or 2 (schedule while fewer than `depth` outputs are pending, then process
the oldest) with arrivals, aborts and injected allocation failures interleaved,
and end with a `drain` that runs the loop to completion or a step cap.

Coverage knobs drawn per scenario: both policies, fence forced on/off, depth 1/2,
AsyncScheduler or not, chunked prefill on/off, long_prefill_token_threshold,
block sizes 8/16/32, stop tokens, EOS with and without ignore_eos, short
max_model_len (length caps), arrival-time ties (PRIORITY tie-breaks).
Stdlib only.
"""

from __future__ import annotations

import math
import random

from v1_scenario import validate

DRAIN_MAX_STEPS = 300


def _config(rng: random.Random) -> dict:
    block_size = rng.choice([16, 16, 16, 8, 32])
    chunked = rng.random() < 0.75
    max_model_len = rng.choice([64, 128, 256, 256, 512])
    max_num_seqs = rng.randint(2, 8) if rng.random() < 0.85 else rng.randint(9, 16)
    if chunked:
        budget = rng.choice([16, 32, 48, 64, 128, 256, 1024])
    else:
        budget = max_model_len * rng.choice([1, 1, 2])  # vLLM: budget >= max_model_len without chunking
    budget = max(budget, max_num_seqs)
    threshold = rng.choice([0, 0, 0, 4, 8, 16, 24, 40]) if rng.random() < 0.5 else 0
    return {
        "num_blocks": 0,  # set by the caller once the requests are known
        "block_size": block_size,
        "max_num_seqs": max_num_seqs,
        "max_num_batched_tokens": budget,
        "max_model_len": max_model_len,
        "enable_chunked_prefill": chunked,
        "long_prefill_token_threshold": min(threshold, max_model_len),
        "policy": rng.choice(["fcfs", "priority"]),
        "async_scheduling": False,
        "force_defer_block_free": rng.random() < 0.65,
        "prefix_guard": False,
    }


def _requests(rng: random.Random, cfg: dict) -> list[dict]:
    # Mostly a handful of requests; sometimes a burst that fills max_num_seqs.
    n = rng.randint(3, 12) if rng.random() < 0.85 else rng.randint(13, 24)
    mml = cfg["max_model_len"]
    reqs = []
    arrival = 0.0
    for i in range(n):
        # Mostly short prompts, some long ones (multi-chunk prefills, many blocks).
        if rng.random() < 0.7:
            prompt = rng.randint(1, min(48, mml - 1))
        else:
            prompt = rng.randint(1, min(160, mml - 1))
        max_tokens = rng.choice([1, 2, 3, rng.randint(1, 12), rng.randint(4, 40)])
        if mml <= 128 and rng.random() < 0.15:
            max_tokens = mml  # runs into the max_model_len length cap
        if rng.random() > 0.2 or i == 0:  # 20% arrival-time ties with the previous request
            arrival += rng.choice([0.5, 1.0, 1.0, 2.0])
        stop = sorted(rng.sample(range(1, 1000), rng.choice([0, 1, 1, 2])))
        reqs.append(
            {
                "id": f"q{i}",
                "prompt_len": prompt,
                "max_tokens": max_tokens,
                "priority": rng.randint(0, 3) if cfg["policy"] == "priority" else 0,
                "arrival_time": arrival,
                "stop_token_ids": stop,
                "ignore_eos": rng.random() < 0.5,
            }
        )
    return reqs


def _num_blocks(rng: random.Random, cfg: dict, reqs: list[dict]) -> int:
    bs = cfg["block_size"]
    # The largest request must fit alone (or it would preempt itself forever):
    # its whole sequence, capped at max_model_len, plus one block of slack.
    need = max(math.ceil(min(r["prompt_len"] + r["max_tokens"], cfg["max_model_len"]) / bs) for r in reqs)
    total = sum(math.ceil(min(r["prompt_len"] + r["max_tokens"], cfg["max_model_len"]) / bs) for r in reqs)
    extra = rng.choice([0, 1, 1, 2, 3, 5, 8])
    usable = max(need + 1, min(total, need + extra))
    return usable + 1  # + vLLM's null block


def _actions(rng: random.Random, reqs: list[dict], depth: int, abort_prob: float = 0.04) -> list[dict]:
    ids = [r["id"] for r in reqs]  # already in arrival order
    actions: list[dict] = []
    first = rng.randint(1, min(4, len(ids)))
    actions.append({"op": "add", "ids": ids[:first]})
    next_add = first
    pending = 0
    body_steps = rng.randint(4, 30)
    steps = 0
    while next_add < len(ids) or steps < body_steps:
        if next_add < len(ids) and rng.random() < 0.3:
            k = rng.randint(1, 3)
            actions.append({"op": "add", "ids": ids[next_add : next_add + k]})
            next_add += k
        if rng.random() < abort_prob:
            # Any added id: running, waiting, preempted or already finished (then a no-op).
            actions.append({"op": "abort", "ids": [rng.choice(ids[:next_add])]})
        if pending < depth:
            if rng.random() < 0.06:
                actions.append({"op": "fail_next_allocation", "call_number": rng.randint(1, 3)})
            actions.append({"op": "schedule"})
            pending += 1
            steps += 1
        else:
            actions.append({"op": "update"})
            pending -= 1
    actions.append({"op": "drain", "depth": depth, "max_steps": DRAIN_MAX_STEPS})
    return actions


def generate(seed: int) -> dict:
    """One random scenario, fully determined by `seed` (prefix_guard False)."""
    rng = random.Random(f"v1-conformance/{seed}")
    cfg = _config(rng)
    depth = rng.choice([1, 2])
    # Async scheduling mostly comes with an overlapping queue; allow it at depth 1 too.
    cfg["async_scheduling"] = rng.random() < (0.7 if depth == 2 else 0.2)
    reqs = _requests(rng, cfg)
    cfg["num_blocks"] = _num_blocks(rng, cfg, reqs)
    scenario = {
        "id": f"rand-{seed:04d}",
        "seed": seed,
        "note": f"depth {depth}",
        "config": cfg,
        "sampler": {
            "stop_prob": rng.choice([0.0, 0.05, 0.1, 0.2]),
            "eos_prob": rng.choice([0.0, 0.0, 0.03]),
        },
        "requests": reqs,
        "actions": _actions(rng, reqs, depth),
    }
    return validate(scenario)


def _shared_prompts(rng: random.Random, cfg: dict, reqs: list[dict]) -> None:
    """Prompt content for prefix caching: a few shared prefixes (whole and
    ragged block counts), unique suffixes, exact repeats of earlier prompts."""
    bs = cfg["block_size"]
    mml = cfg["max_model_len"]
    prefixes = []
    for _ in range(rng.randint(1, 3)):
        blocks = rng.randint(1, 4)
        length = blocks * bs if rng.random() < 0.6 else blocks * bs + rng.randint(1, bs - 1)
        prefixes.append([rng.randrange(1000) for _ in range(min(length, mml - 2))])
    earlier: list[list[int]] = []
    for req in reqs:
        roll = rng.random()
        if earlier and roll < 0.2:
            prompt = list(rng.choice(earlier))  # an exact repeat
        elif roll < 0.8:
            prefix = rng.choice(prefixes)
            suffix = [rng.randrange(1000) for _ in range(rng.randint(0, 2 * bs))]
            prompt = (prefix + suffix)[: mml - 1]
        else:
            prompt = [rng.randrange(1000) for _ in range(rng.randint(1, min(3 * bs, mml - 1)))]
        req["prompt_len"] = len(prompt)
        req["prompt_token_ids"] = prompt
        earlier.append(prompt)


def generate_caching(seed: int) -> dict:
    """One random scenario with prefix caching on and prompts that share
    prefixes; the pool is tight enough that cached blocks are evicted."""
    rng = random.Random(f"v1-conformance-caching/{seed}")
    cfg = _config(rng)
    cfg["enable_prefix_caching"] = True
    depth = rng.choice([1, 2])
    cfg["async_scheduling"] = rng.random() < (0.7 if depth == 2 else 0.2)
    reqs = _requests(rng, cfg)
    _shared_prompts(rng, cfg, reqs)
    cfg["num_blocks"] = _num_blocks(rng, cfg, reqs)
    scenario = {
        "id": f"cache-{seed:04d}",
        "seed": seed,
        "note": f"prefix caching, depth {depth}",
        "config": cfg,
        "sampler": {
            "stop_prob": rng.choice([0.0, 0.05, 0.1]),
            "eos_prob": rng.choice([0.0, 0.0, 0.03]),
        },
        "requests": reqs,
        "actions": _actions(rng, reqs, depth),
    }
    return validate(scenario)


def with_prefix_guard(scenario: dict) -> dict:
    """The same scenario replayed with the pre-#49675 preemption loop."""
    twin = dict(scenario)
    twin["config"] = dict(scenario["config"], prefix_guard=True)
    twin["id"] = scenario["id"] + "-prefix"
    return twin


def generate_suite(count: int, first_seed: int = 0, prefix_twins: bool = True, caching_count: int = 0) -> list[dict]:
    scenarios = [generate(seed) for seed in range(first_seed, first_seed + count)]
    scenarios += [generate_caching(seed) for seed in range(first_seed, first_seed + caching_count)]
    if prefix_twins:
        # The guard only matters when the fence is on; skip twins that would be identical.
        scenarios += [with_prefix_guard(s) for s in scenarios if s["config"]["force_defer_block_free"]]
    return scenarios
