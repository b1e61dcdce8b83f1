"""Random P/D conformance scenarios: a scheduler with a KV connector
(format: v1_scenario.py, `config.kv`, `worker`, `kv_transfer_params`).

Scenario N is drawn from its own seed. The role, the load-failure policy and
the preemption guard rotate with the seed, so any 12 consecutive seeds cover
every combination: role = seed % 3, policy = (seed // 3) % 2, guard =
(seed // 6) % 2. Per scenario: remote prefills (consumer) and remote decodes
(producer, mostly max_tokens 1) mixed with plain requests; prefix caching on
half the time, with shared prompts (full and partial local hits before a
load); loads that finish at once or late, that fail wholly or partly
(invalid blocks) or per request (failed_recving); sends that end late; aborts
at any time (while loading, while the producer holds blocks); tight pools;
depth 1, depth 2 with AsyncScheduler, or depth 2 synchronous (two pipeline
stages). The fence is what vLLM's production gate gives: on for a
consumer-capable role with more than one batch in flight. Stdlib only.
"""

from __future__ import annotations

import random

from v1_generate import DRAIN_MAX_STEPS, _actions, _config, _num_blocks, _requests, _shared_prompts
from v1_scenario import validate

ROLES = ("kv_consumer", "kv_producer", "kv_both")
POLICIES = ("recompute", "fail")
# (batch-queue depth, AsyncScheduler): one step at a time, async scheduling, two pipeline stages.
MODES = ((1, False), (2, True), (2, False))


def role_policy_guard(seed: int) -> tuple[str, str, bool]:
    return ROLES[seed % 3], POLICIES[(seed // 3) % 2], bool((seed // 6) % 2)


def _kv_params(rng: random.Random, role: str, req: dict) -> None:
    consume = role in ("kv_consumer", "kv_both")
    produce = role in ("kv_producer", "kv_both")
    roll = rng.random()
    if consume and (roll < 0.7 if role == "kv_consumer" else roll < 0.4):
        req["kv_transfer_params"] = {"do_remote_prefill": True}
    elif produce and (roll < 0.75 if role == "kv_producer" else roll < 0.8):
        req["kv_transfer_params"] = {"do_remote_decode": True}
        if rng.random() < 0.85:
            req["max_tokens"] = 1  # what a P/D proxy sends a prefill node


def generate_pd(seed: int) -> dict:
    rng = random.Random(f"v1-conformance-pd/{seed}")
    role, policy, guard = role_policy_guard(seed)
    cfg = _config(rng)
    depth, async_scheduling = rng.choice(MODES)
    cfg["async_scheduling"] = async_scheduling
    cfg["force_defer_block_free"] = depth > 1 and role != "kv_producer"
    cfg["prefix_guard"] = guard
    cfg["kv"] = {"role": role, "load_failure_policy": policy}
    reqs = _requests(rng, cfg)
    if rng.random() < 0.5:
        cfg["enable_prefix_caching"] = True
        _shared_prompts(rng, cfg, reqs)
    for req in reqs:
        _kv_params(rng, role, req)
    cfg["num_blocks"] = _num_blocks(rng, cfg, reqs)
    worker = {
        "load_delay": [0, rng.choice([0, 1, 2, 4, 6])],
        "send_delay": [0, rng.choice([0, 1, 3, 6])],
        "fail_prob": rng.choice([0.0, 0.0, 0.2, 0.5]),
        "failure_mode": rng.choice(["invalid_blocks", "failed_recving", "mixed", "mixed"]),
    }
    scenario = {
        "id": f"pd-{seed:04d}",
        "seed": seed,
        "note": f"{role}, {policy}, {'prefix' if guard else 'fixed'} guard, depth {depth}"
        + (" async" if async_scheduling else ""),
        "config": cfg,
        "worker": worker,
        "sampler": {"stop_prob": rng.choice([0.0, 0.05, 0.1]), "eos_prob": rng.choice([0.0, 0.0, 0.03])},
        "requests": reqs,
        "actions": _actions(rng, reqs, depth, abort_prob=rng.choice([0.02, 0.06, 0.12])),
    }
    return validate(scenario)


def generate_pd_suite(count: int, first_seed: int = 0) -> list[dict]:
    return [generate_pd(seed) for seed in range(first_seed, first_seed + count)]


__all__ = ["DRAIN_MAX_STEPS", "generate_pd", "generate_pd_suite", "role_policy_guard"]
