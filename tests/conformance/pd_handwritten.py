"""Hand-written P/D conformance scenarios: a scheduler with a KV connector,
each with the facts vLLM 0.33.0 shows on it, after vLLM's connector unit tests
(`tests/v1/kv_connector/unit/test_remote_prefill_lifecycle.py`,
`test_remote_decode_lifecycle.py`, `test_invalid_blocks_correctness.py`).

The facts are checked on the oracle's trace (proof that the harness connector
and fake worker drive vLLM the way its own tests do) and on ours; the
differential comparison then checks every other step. Stdlib only.
"""

from __future__ import annotations

from v1_handwritten import Expectation, S, U, _check, _schedules, config, prompt, req, with_prompt

BLOCK = 16


def pd_config(role: str, policy: str = "recompute", **overrides) -> dict:
    base = dict(async_scheduling=False, force_defer_block_free=False, num_blocks=20)
    base.update(overrides)
    cfg = config(**base)
    cfg["kv"] = {"role": role, "load_failure_policy": policy}
    return cfg


def remote_prefill(request: dict) -> dict:
    return dict(request, kv_transfer_params={"do_remote_prefill": True})


def remote_decode(request: dict) -> dict:
    return dict(request, kv_transfer_params={"do_remote_decode": True})


def _record(trace: dict, op: str, step: int) -> dict:
    return next(r for r in trace["records"] if r["op"] == op and r["step"] == step)


# -- test_remote_prefill_lifecycle: test_basic_lifecycle ----------------------------


def remote_prefill_lifecycle() -> tuple[dict, Expectation]:
    """A 40-token remote prefill: the first step allocates its 3 blocks and
    schedules nothing (WAITING_FOR_REMOTE_KVS); the load is reported in the next
    output; the step after that schedules only the last prompt token
    (num_computed_tokens = num_tokens - 1) to sample the first output."""
    scenario = {
        "id": "hand-pd-remote-prefill-lifecycle",
        "seed": 3,
        "note": "vLLM test_remote_prefill_lifecycle.py::test_basic_lifecycle",
        "config": pd_config("kv_consumer"),
        "worker": {"requests": {"r0": {"delay": 1}}},
        "sampler": {"stop_prob": 0.0, "eos_prob": 0.0},
        "requests": [remote_prefill(req("r0", 40, 3, 0))],
        "actions": [{"op": "add", "ids": ["r0"]}, S, U, S, U, S, U, S, U, S, U],
    }

    def expect(trace: dict) -> list[str]:
        p: list[str] = []
        s0, s1, s2 = _schedules(trace)[:3]
        _check(p, s0["scheduled"] == {} and s0["status"]["r0"] == "WAITING_FOR_REMOTE_KVS", f"step 0: {s0}")
        _check(p, len(s0["kv_recv"].get("r0", [])) == 3 and s0["free_blocks"] == 19 - 3, f"3 blocks to load: {s0}")
        _check(p, s1["scheduled"] == {} and _record(trace, "update", 1)["kv_output"] is not None, "load done at 1")
        _check(p, s2["scheduled"] == {"r0": 1} and s2["computed"]["r0"] == 40, f"step 2 recomputes 1: {s2}")
        _check(p, trace["final"]["r0"]["status"] == "FINISHED_LENGTH_CAPPED", "3 tokens then length cap")
        return p

    return scenario, expect


def remote_prefill_after_local_hit() -> tuple[dict, Expectation]:
    """Prefix caching: a plain request caches 2 full blocks; a remote prefill
    sharing them loads only its third block (the unhashed one)."""
    shared = prompt(5, 2 * BLOCK)
    first = with_prompt(req("r0", 0, 2, 0), shared + prompt(6, 8))
    second = remote_prefill(with_prompt(req("r1", 0, 2, 1), shared + prompt(7, 8)))
    scenario = {
        "id": "hand-pd-remote-prefill-local-hit",
        "seed": 4,
        "note": "the NIXL connector loads only the blocks a local hit does not provide",
        "config": pd_config("kv_consumer", enable_prefix_caching=True),
        "worker": {"requests": {"r1": {"delay": 0}}},
        "sampler": {"stop_prob": 0.0, "eos_prob": 0.0},
        "requests": [first, second],
        "actions": [{"op": "add", "ids": ["r0"]}, {"op": "drain", "depth": 1, "max_steps": 20}]
        + [{"op": "add", "ids": ["r1"]}, {"op": "drain", "depth": 1, "max_steps": 20}],
    }

    def expect(trace: dict) -> list[str]:
        p: list[str] = []
        loads = [r for r in _schedules(trace) if r["kv_recv"]]
        _check(p, len(loads) == 1 and len(loads[0]["kv_recv"]["r1"]) == 1, f"one block loaded: {loads}")
        resumed = [r for r in _schedules(trace) if "r1" in r["scheduled"]]
        _check(p, bool(resumed) and resumed[0]["scheduled"]["r1"] == 1, "then the last token is recomputed")
        return p

    return scenario, expect


# -- test_invalid_blocks_correctness: async load failures under both policies -------


def load_fails(policy: str, failed_recving: bool) -> tuple[dict, Expectation]:
    """A 40-token remote prefill whose load fails: from block 1 on
    (invalid_block_ids) or wholly (failed_recving). `fail`: the request
    finishes with an error in that output and its blocks are freed.
    `recompute`: it keeps the valid prefix (16 tokens; none for a request-level
    failure) and computes the rest locally."""
    override = {"delay": 1, "failed": True} if failed_recving else {"delay": 1, "invalid_from": 1}
    kind = "failed-recving" if failed_recving else "invalid-blocks"
    scenario = {
        "id": f"hand-pd-load-fails-{kind}-{policy}",
        "seed": 5,
        "note": "vLLM test_invalid_blocks_correctness.py (async load, both policies)",
        "config": pd_config("kv_consumer", policy),
        "worker": {"requests": {"r0": override}},
        "sampler": {"stop_prob": 0.0, "eos_prob": 0.0},
        "requests": [remote_prefill(req("r0", 40, 2, 0))],
        "actions": [{"op": "add", "ids": ["r0"]}, {"op": "drain", "depth": 1, "max_steps": 20}],
    }
    valid = 0 if failed_recving else BLOCK

    def expect(trace: dict) -> list[str]:
        p: list[str] = []
        failed_at = _record(trace, "update", 1)
        if policy == "fail":
            out = failed_at["outputs"].get("r0", {})
            _check(p, out.get("finish_reason") == "error", f"finishes with an error: {failed_at}")
            _check(p, failed_at["free_blocks"] == 19 and failed_at["held"] == [], f"blocks freed: {failed_at}")
            _check(p, trace["final"]["r0"]["status"] == "FINISHED_ERROR", "FINISHED_ERROR")
        else:
            _check(p, failed_at["computed"]["r0"] == valid, f"valid prefix {valid}: {failed_at}")
            resumed = [r for r in _schedules(trace) if "r0" in r["scheduled"]]
            _check(p, bool(resumed) and resumed[0]["scheduled"]["r0"] == 40 - valid, f"recomputes the rest: {resumed}")
            _check(p, trace["final"]["r0"]["status"] == "FINISHED_LENGTH_CAPPED", "then decodes")
        return p

    return scenario, expect


def abort_while_loading() -> tuple[dict, Expectation]:
    """An abort while the load is in flight finishes the request but keeps its
    blocks until the worker reports the receive done (the transfer may still
    write them); then they are freed."""
    scenario = {
        "id": "hand-pd-abort-while-loading",
        "seed": 6,
        "note": "vLLM finish_requests: delay_free_blocks for WAITING_FOR_REMOTE_KVS",
        "config": pd_config("kv_consumer"),
        "worker": {"requests": {"r0": {"delay": 2}}},
        "sampler": {"stop_prob": 0.0, "eos_prob": 0.0},
        "requests": [remote_prefill(req("r0", 40, 2, 0))],
        "actions": [{"op": "add", "ids": ["r0"]}, S, U, {"op": "abort", "ids": ["r0"]}, S, U, S, U],
    }

    def expect(trace: dict) -> list[str]:
        p: list[str] = []
        abort = next(r for r in trace["records"] if r["op"] == "abort")
        _check(p, abort["held"] == ["r0"] and abort["free_blocks"] == 16, f"blocks held at abort: {abort}")
        done = _record(trace, "update", 2)
        _check(p, done["held"] == [] and done["free_blocks"] == 19, f"freed on finished_recving: {done}")
        return p

    return scenario, expect


# -- test_remote_decode_lifecycle ---------------------------------------------------


def producer_lifecycle(abort_after_finish: bool) -> tuple[dict, Expectation]:
    """A prefill for a remote decode (max_tokens 1): it finishes length-capped,
    its 3 computed blocks stay held and are announced for sending in the next
    step's metadata; finished_sending two outputs later frees them. An abort
    of the finished request changes nothing."""
    actions = [{"op": "add", "ids": ["r0"]}, S, U]
    if abort_after_finish:
        actions.append({"op": "abort", "ids": ["r0"]})
    actions += [S, U, S, U, S, U]
    scenario = {
        "id": "hand-pd-producer-lifecycle" + ("-abort" if abort_after_finish else ""),
        "seed": 7,
        "note": "vLLM test_remote_decode_lifecycle.py::test_basic_lifecycle / test_abort_during_kv_transfer",
        "config": pd_config("kv_producer"),
        "worker": {"requests": {"r0": {"delay": 2}}},
        "sampler": {"stop_prob": 0.0, "eos_prob": 0.0},
        "requests": [remote_decode(req("r0", 40, 1, 0))],
        "actions": actions,
    }

    def expect(trace: dict) -> list[str]:
        p: list[str] = []
        finished = _record(trace, "update", 0)
        _check(p, finished["outputs"]["r0"]["finish_reason"] == "length", f"length-capped: {finished}")
        _check(p, finished["held"] == ["r0"] and finished["free_blocks"] == 16, f"blocks held: {finished}")
        s1 = _schedules(trace)[1]
        _check(p, len(s1["kv_send"].get("r0", [])) == 3 and s1["finished"] == ["r0"], f"sent next step: {s1}")
        _check(p, _record(trace, "update", 2)["held"] == ["r0"], "still held before finished_sending")
        done = _record(trace, "update", 3)
        _check(p, done["held"] == [] and done["free_blocks"] == 19, f"freed on finished_sending: {done}")
        return p

    return scenario, expect


def consumer_fence_load() -> tuple[dict, Expectation]:
    """The reason for the fence: async scheduling, a consumer, two steps in
    flight. r0 is aborted while two of its steps are in flight; its blocks wait
    in `deferred_frees`, and r1's load cannot be given them until the newer
    step's output is processed."""
    scenario = {
        "id": "hand-pd-consumer-fence-load",
        "seed": 8,
        "note": "vLLM #49674: a load must not land in blocks an in-flight step still writes",
        "config": pd_config("kv_consumer", async_scheduling=True, force_defer_block_free=True, num_blocks=5),
        "worker": {"requests": {"r1": {"delay": 0}}},
        "sampler": {"stop_prob": 0.0, "eos_prob": 0.0},
        "requests": [req("r0", 40, 8, 0), remote_prefill(req("r1", 40, 2, 1))],
        "actions": [{"op": "add", "ids": ["r0", "r1"]}, S, S, {"op": "abort", "ids": ["r0"]}, S, U, S, U, S]
        + [{"op": "drain", "depth": 2, "max_steps": 30}],
    }

    def expect(trace: dict) -> list[str]:
        p: list[str] = []
        abort = next(r for r in trace["records"] if r["op"] == "abort")
        _check(p, abort["deferred_frees"] == 1 and abort["free_blocks"] == 1, f"r0's blocks fenced: {abort}")
        s2 = _schedules(trace)[2]
        _check(p, s2["kv_recv"] == {} and s2["status"]["r1"] == "WAITING", f"no load into fenced blocks: {s2}")
        loads = [r for r in _schedules(trace) if r["kv_recv"]]
        _check(p, len(loads) == 1 and loads[0]["deferred_frees"] == 0, f"load after the drain: {loads}")
        _check(p, trace["final"]["r1"]["status"] == "FINISHED_LENGTH_CAPPED", "r1 completes")
        return p

    return scenario, expect


def all_pd_handwritten() -> list[tuple[dict, Expectation]]:
    cases = [remote_prefill_lifecycle(), remote_prefill_after_local_hit()]
    cases += [load_fails(policy, failed) for policy in ("fail", "recompute") for failed in (False, True)]
    cases += [abort_while_loading(), producer_lifecycle(False), producer_lifecycle(True), consumer_fence_load()]
    return cases
