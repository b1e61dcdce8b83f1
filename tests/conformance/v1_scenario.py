"""The v1 conformance scenario: a JSON document that both vLLM 0.33.0 (in its own
interpreter) and our engine replay action by action.

Stdlib only and free of package-relative imports: the oracle driver loads this
file inside vLLM's venv, the harness loads it inside ours.

Format (all keys required unless marked optional)::

    {
      "id": "rand-0007",                 # unique name, used in reports and repro files
      "seed": 7,                         # feeds the fake sampler (see fake_token)
      "note": "...",                     # optional, free text
      "config": {
        "num_blocks": 12, "block_size": 16,          # KV pool (one block is vLLM's null block)
        "max_num_seqs": 4, "max_num_batched_tokens": 64, "max_model_len": 256,
        "enable_chunked_prefill": true, "long_prefill_token_threshold": 0,
        "policy": "fcfs" | "priority",
        "async_scheduling": false,                   # AsyncScheduler (output placeholders)
        "force_defer_block_free": false,             # true: fence forced on, as vLLM's tests do;
                                                     # false: production gate (off: no connector)
        "prefix_guard": false,                       # true: pre-#49675 preemption loop
        "enable_prefix_caching": false,              # optional; true: automatic prefix caching
        "kv": {"role": "kv_consumer",                # optional: a KV connector in this role
               "load_failure_policy": "recompute"}   #   ("fail" or "recompute"); see pd_worker.py
      },
      "worker": {...},                   # optional (with config.kv): the fake connector worker's
                                         # seeded script, see pd_worker.py
      "sampler": {"stop_prob": 0.1, "eos_prob": 0.0},  # optional, these defaults
      "requests": [
        {"id": "r0", "prompt_len": 40, "max_tokens": 8, "priority": 0,
         "arrival_time": 0.0, "stop_token_ids": [7], "ignore_eos": false,
         "prompt_token_ids": [5, 5, ...],         # optional: the prompt's content (prompt_len ids);
                                                  # default [0] * prompt_len, the same for every request
         "kv_transfer_params": {"do_remote_prefill": true}}   # optional (with config.kv): a remote
                                                  # prefill (consumer) or {"do_remote_decode": true}
      ],
      "actions": [
        {"op": "add", "ids": ["r0"]},
        {"op": "schedule"},
        {"op": "update"},                  # processes the OLDEST unprocessed SchedulerOutput
        {"op": "abort", "ids": ["r0"]},    # finish_requests(ids, FINISHED_ABORTED)
        {"op": "fail_next_allocation", "call_number": 2},   # the 2nd allocate_slots call from
                                           # now returns None, once; every other call is real
        {"op": "set_priority", "priorities": {"r0": 9}},    # rewrites Request.priority
        {"op": "drain", "depth": 2, "max_steps": 400}       # engine loop at batch-queue depth
                                           # `depth` until every added request is finished and no
                                           # output is pending, or max_steps schedules
      ]
    }
"""

from __future__ import annotations

import hashlib

from pd_worker import validate_worker

# vLLM's EOS for the OPT config the oracle kit uses; our engine's test helpers use the same.
EOS_TOKEN_ID = 50256
# Normal (non-stop) fake tokens are drawn from this range; stop tokens should sit outside it.
NORMAL_TOKEN_RANGE = (1000, 41000)

POLICIES = ("fcfs", "priority")
OPS = ("add", "schedule", "update", "abort", "fail_next_allocation", "set_priority", "drain")

CONFIG_KEYS = {
    "num_blocks": int,
    "block_size": int,
    "max_num_seqs": int,
    "max_num_batched_tokens": int,
    "max_model_len": int,
    "enable_chunked_prefill": bool,
    "long_prefill_token_threshold": int,
    "policy": str,
    "async_scheduling": bool,
    "force_defer_block_free": bool,
    "prefix_guard": bool,
}
OPTIONAL_CONFIG_KEYS = {"enable_prefix_caching": bool, "kv": dict}
OPTIONAL_REQUEST_KEYS = {"prompt_token_ids": list, "kv_transfer_params": dict}
KV_ROLES = ("kv_producer", "kv_consumer", "kv_both")
KV_LOAD_FAILURE_POLICIES = ("fail", "recompute")
KV_PARAM_KEYS = ("do_remote_prefill", "do_remote_decode")
REQUEST_KEYS = {
    "id": str,
    "prompt_len": int,
    "max_tokens": int,
    "priority": int,
    "arrival_time": (int, float),
    "stop_token_ids": list,
    "ignore_eos": bool,
}


class ScenarioError(ValueError):
    """A scenario document is malformed; the message names the field and what is allowed."""


def _check_type(where: str, key: str, value: object, expected) -> None:
    # bool is an int subclass: reject True where a count is expected.
    if expected is int and isinstance(value, bool) or not isinstance(value, expected):
        names = expected.__name__ if isinstance(expected, type) else "/".join(t.__name__ for t in expected)
        raise ScenarioError(f"{where}.{key} must be {names}, got {value!r}")


def validate(scenario: dict) -> dict:
    """Checks a scenario document; returns it unchanged or raises ScenarioError."""
    sid = scenario.get("id")
    if not isinstance(sid, str) or not sid:
        raise ScenarioError(f"scenario.id must be a non-empty string, got {sid!r}")
    where = f"scenario {sid!r}"
    _check_type(where, "seed", scenario.get("seed"), int)
    config = scenario.get("config")
    if not isinstance(config, dict):
        raise ScenarioError(f"{where}: config must be an object")
    for key, typ in CONFIG_KEYS.items():
        if key not in config:
            raise ScenarioError(f"{where}: config.{key} is missing (required keys: {sorted(CONFIG_KEYS)})")
        _check_type(f"{where}: config", key, config[key], typ)
    for key, typ in OPTIONAL_CONFIG_KEYS.items():
        if key in config:
            _check_type(f"{where}: config", key, config[key], typ)
    allowed = set(CONFIG_KEYS) | set(OPTIONAL_CONFIG_KEYS)
    unknown = set(config) - allowed
    if unknown:
        raise ScenarioError(f"{where}: unknown config keys {sorted(unknown)}; allowed: {sorted(allowed)}")
    if config["policy"] not in POLICIES:
        raise ScenarioError(f"{where}: config.policy must be one of {POLICIES}, got {config['policy']!r}")
    for key in ("num_blocks", "block_size", "max_num_seqs", "max_num_batched_tokens", "max_model_len"):
        if config[key] < 1:
            raise ScenarioError(f"{where}: config.{key} must be >= 1, got {config[key]}")
    if config["num_blocks"] < 2:
        raise ScenarioError(f"{where}: config.num_blocks must be >= 2 (one is the null block)")
    if config["long_prefill_token_threshold"] < 0:
        raise ScenarioError(f"{where}: config.long_prefill_token_threshold must be >= 0")
    kv = config.get("kv")
    if kv is not None:
        if kv.get("role") not in KV_ROLES or kv.get("load_failure_policy") not in KV_LOAD_FAILURE_POLICIES:
            raise ScenarioError(
                f"{where}: config.kv needs role in {KV_ROLES} and load_failure_policy in "
                f"{KV_LOAD_FAILURE_POLICIES}, got {kv!r}"
            )
        if set(kv) - {"role", "load_failure_policy"}:
            raise ScenarioError(f"{where}: unknown config.kv keys {sorted(set(kv) - {'role', 'load_failure_policy'})}")
    if "worker" in scenario:
        if kv is None:
            raise ScenarioError(f"{where}: a worker script needs config.kv")
        try:
            validate_worker(where, scenario["worker"])
        except ValueError as exc:
            raise ScenarioError(str(exc)) from None

    sampler = scenario.get("sampler", {})
    for key in ("stop_prob", "eos_prob"):
        p = sampler.get(key, 0.0)
        if not isinstance(p, (int, float)) or not 0.0 <= p <= 1.0:
            raise ScenarioError(f"{where}: sampler.{key} must be a probability in [0, 1], got {p!r}")

    requests = scenario.get("requests")
    if not isinstance(requests, list):
        raise ScenarioError(f"{where}: requests must be a list")
    ids: set[str] = set()
    for i, req in enumerate(requests):
        rwhere = f"{where}: requests[{i}]"
        for key, typ in REQUEST_KEYS.items():
            if key not in req:
                raise ScenarioError(f"{rwhere}.{key} is missing (required keys: {sorted(REQUEST_KEYS)})")
            _check_type(rwhere, key, req[key], typ)
        if req["id"] in ids:
            raise ScenarioError(f"{rwhere}.id {req['id']!r} is duplicated")
        ids.add(req["id"])
        if "prompt_token_ids" in req:
            prompt = req["prompt_token_ids"]
            if len(prompt) != req["prompt_len"] or not all(
                isinstance(t, int) and not isinstance(t, bool) and 0 <= t < NORMAL_TOKEN_RANGE[0] for t in prompt
            ):
                raise ScenarioError(
                    f"{rwhere}.prompt_token_ids must hold prompt_len ({req['prompt_len']}) ints in "
                    f"[0, {NORMAL_TOKEN_RANGE[0]})"
                )
        params = req.get("kv_transfer_params")
        if params is not None:
            if kv is None:
                raise ScenarioError(f"{rwhere}.kv_transfer_params needs config.kv")
            if set(params) - set(KV_PARAM_KEYS) or not all(isinstance(v, bool) for v in params.values()):
                raise ScenarioError(f"{rwhere}.kv_transfer_params may hold booleans {KV_PARAM_KEYS}, got {params!r}")
        unknown_keys = set(req) - set(REQUEST_KEYS) - set(OPTIONAL_REQUEST_KEYS)
        if unknown_keys:
            raise ScenarioError(f"{rwhere}: unknown keys {sorted(unknown_keys)}")
        if req["prompt_len"] < 1 or req["max_tokens"] < 1:
            raise ScenarioError(f"{rwhere}: prompt_len and max_tokens must be >= 1")
        if req["prompt_len"] >= config["max_model_len"]:
            raise ScenarioError(
                f"{rwhere}.prompt_len {req['prompt_len']} must be < config.max_model_len "
                f"{config['max_model_len']} (vLLM's front end rejects longer prompts)"
            )

    actions = scenario.get("actions")
    if not isinstance(actions, list):
        raise ScenarioError(f"{where}: actions must be a list")
    for i, act in enumerate(actions):
        awhere = f"{where}: actions[{i}]"
        op = act.get("op") if isinstance(act, dict) else None
        if op not in OPS:
            raise ScenarioError(f"{awhere}.op must be one of {OPS}, got {op!r}")
        if op in ("add", "abort"):
            bad = [x for x in act.get("ids", [None]) if x not in ids]
            if not isinstance(act.get("ids"), list) or bad:
                raise ScenarioError(f"{awhere}.ids must list known request ids; unknown: {bad}")
        elif op == "fail_next_allocation":
            n = act.get("call_number")
            if not isinstance(n, int) or isinstance(n, bool) or n < 1:
                raise ScenarioError(f"{awhere}.call_number must be an int >= 1, got {n!r}")
        elif op == "set_priority":
            pr = act.get("priorities")
            if not isinstance(pr, dict) or any(k not in ids or not isinstance(v, int) for k, v in pr.items()):
                raise ScenarioError(f"{awhere}.priorities must map known request ids to ints, got {pr!r}")
        elif op == "drain":
            depth, steps = act.get("depth"), act.get("max_steps")
            if depth not in (1, 2, 3, 4) or not isinstance(steps, int) or steps < 1:
                raise ScenarioError(f"{awhere}: drain needs depth in 1..4 and max_steps >= 1, got {depth!r}, {steps!r}")
    return scenario


def fake_token(scenario: dict, step: int, req_id: str, stop_token_ids: list[int]) -> int:
    """The token 'sampled' for `req_id` in schedule step `step` (0-based count of
    schedule() calls). Deterministic across interpreters (no hash()): with
    probability stop_prob one of the request's stop tokens, then eos_prob EOS,
    else a normal token id outside the stop set."""
    sampler = scenario.get("sampler", {})
    stop_prob = sampler.get("stop_prob", 0.1)
    eos_prob = sampler.get("eos_prob", 0.0)
    digest = hashlib.blake2b(f"{scenario['seed']}/{step}/{req_id}".encode(), digest_size=8).digest()
    h = int.from_bytes(digest, "little")
    u = (h & 0xFFFFFFFF) / 2**32
    pick = h >> 32
    if stop_token_ids and u < stop_prob:
        return stop_token_ids[pick % len(stop_token_ids)]
    if stop_prob <= u < stop_prob + eos_prob:
        return EOS_TOKEN_ID
    lo, hi = NORMAL_TOKEN_RANGE
    token = lo + pick % (hi - lo)
    while token in stop_token_ids or token == EOS_TOKEN_ID:
        token += 1
    return token


def request_by_id(scenario: dict) -> dict[str, dict]:
    return {r["id"]: r for r in scenario["requests"]}
