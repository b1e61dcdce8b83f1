"""Replays a v1 scenario (see v1_scenario.py) against one scheduler and records a trace.

The SAME code drives both sides: vLLM 0.33.0 inside its venv
(`tools/oracle/v1_driver.py`) and our engine (`v1_ours.py`). Each side only
supplies an adapter that builds the scheduler, the requests and the fake
`ModelRunnerOutput`; everything else — action order, the batch queue, the fake
sampler, what is recorded — is shared, so a difference in the traces is a
difference between the schedulers.

Adapter interface (duck-typed)::

    name: str
    create_scheduler(config: dict) -> scheduler     # fence forcing and prefix guard applied
    create_request(spec: dict) -> request           # one scenario request entry
    make_model_runner_output(req_ids, sampled_token_ids) -> ModelRunnerOutput
    abort(scheduler, ids)                           # finish_requests(ids, FINISHED_ABORTED)
  and, for scenarios with a KV connector (config.kv):
    connector_meta(scheduler_output) -> (recv, send)   # {req id: block ids} each: loads the
                                                    # step starts, blocks it holds for a send
    attach_kv_output(model_runner_output, report)   # the fake worker's report (pd_worker.py)

Stdlib only, no package-relative imports (loaded by path in both interpreters).
"""

from __future__ import annotations

import traceback
from collections import deque

from pd_worker import FakeWorker
from v1_scenario import fake_token, request_by_id

# A runaway scenario must not hang the suite: no more schedule() calls than this.
MAX_SCHEDULES_PER_SCENARIO = 5000
# With prefix caching, the head of the free queue (the next blocks handed out
# or evicted) is compared too.
FREE_ORDER_PREFIX = 8


def _free_order(queue) -> list[int]:
    """The first block ids of a free queue (vLLM's is a linked list with a getter)."""
    blocks = queue.get_all_free_blocks() if hasattr(queue, "get_all_free_blocks") else queue
    out = []
    for block in blocks:
        if len(out) == FREE_ORDER_PREFIX:
            break
        out.append(block.block_id)
    return out


class AllocationCounter:
    """Wraps `kv_cache_manager.allocate_slots`: counts calls per `schedule()` and
    makes exactly the Nth call after arming return None, like vLLM's
    `_fail_one_allocation` test helper. Every other call reaches the real allocator,
    so the counts are the scheduler's real retry counts."""

    def __init__(self, kv_cache_manager) -> None:
        self._real = kv_cache_manager.allocate_slots
        self.calls = 0
        self._fail_at: int | None = None
        kv_cache_manager.allocate_slots = self._allocate_slots

    def arm(self, call_number: int) -> None:
        self._fail_at = self.calls + call_number

    def _allocate_slots(self, *args, **kwargs):
        self.calls += 1
        if self._fail_at is not None and self.calls == self._fail_at:
            self._fail_at = None
            return None
        return self._real(*args, **kwargs)


class _Run:
    def __init__(self, scenario: dict, adapter) -> None:
        self.scenario = scenario
        self.adapter = adapter
        self.specs = request_by_id(scenario)
        self.sched = adapter.create_scheduler(scenario["config"])
        self.caching = bool(scenario["config"].get("enable_prefix_caching", False))
        self.alloc = AllocationCounter(self.sched.kv_cache_manager)
        # Requests are built up front so that their objects (and final state)
        # survive the scheduler deleting its own entry at finish.
        self.reqs = {rid: adapter.create_request(spec) for rid, spec in self.specs.items()}
        self.added: list[str] = []
        self.pending: deque = deque()  # (step, scheduler_output, model_runner_output), FIFO
        self.step = 0
        self.records: list[dict] = []
        # The connector's worker half (P/D scenarios only).
        self.worker = FakeWorker(scenario) if "kv" in scenario["config"] else None

    # -- observations ---------------------------------------------------------
    def _fence(self) -> dict:
        s = self.sched
        pool = s.kv_cache_manager.block_pool
        fence = {
            "free_blocks": pool.get_num_free_blocks(),
            "sched_step_seq": s.sched_step_seq,
            "processed_step_seq": s.processed_step_seq,
            "deferred_frees": len(s.deferred_frees),
        }
        if self.caching:
            # Hash values differ between the sides (sha256 there); what is
            # cached, and in what order blocks are reused, must not.
            fence["cached_hashes"] = len(pool.cached_block_hash_to_block)
            fence["free_order"] = _free_order(pool.free_block_queue)
        return fence

    def _state(self) -> dict:
        """Every added request's status and computed tokens, and the running order."""
        reqs = self.reqs
        return {
            "status": {rid: reqs[rid].status.name for rid in self.added},
            "computed": {rid: reqs[rid].num_computed_tokens for rid in self.added},
            "running": [r.request_id for r in self.sched.running],
        }

    def _connector_view(self) -> dict:
        """What the scheduler holds for the connector: finished requests whose
        blocks wait for a send or a receive to end, loads reported done but not
        yet promoted, loads reported failed."""
        s = self.sched
        return {
            "held": sorted(rid for rid, r in s.requests.items() if r.is_finished()),
            "recv_done": sorted(s.finished_recving_kv_req_ids),
            "recv_failed": sorted(s.failed_recving_kv_req_ids),
        }

    # -- actions --------------------------------------------------------------
    def add(self, ids: list[str]) -> dict:
        for rid in ids:
            self.sched.add_request(self.reqs[rid])
            self.added.append(rid)
        return {"op": "add", "ids": list(ids)}

    def schedule(self) -> dict:
        if self.step >= MAX_SCHEDULES_PER_SCENARIO:
            raise RuntimeError(f"more than {MAX_SCHEDULES_PER_SCENARIO} schedule() calls")
        calls_before = self.alloc.calls
        so = self.sched.schedule()
        scheduled = dict(so.num_scheduled_tokens)
        # Fake model output, decided right after schedule(): a request still in a
        # prefill chunk samples nothing; otherwise one token from the fake sampler.
        prefill_chunks = sorted(rid for rid in scheduled if self.reqs[rid].is_prefill_chunk)
        req_ids = list(scheduled)
        sampled = [
            []
            if self.reqs[rid].is_prefill_chunk
            else [fake_token(self.scenario, self.step, rid, self.specs[rid]["stop_token_ids"])]
            for rid in req_ids
        ]
        self.pending.append((self.step, so, self.adapter.make_model_runner_output(req_ids, sampled)))
        kv: dict = {}
        if self.worker is not None:
            recv, send = self.adapter.connector_meta(so)
            self.worker.announce(self.step, recv, send)
            kv = {"kv_recv": recv, "kv_send": send, **self._connector_view()}
        record = {
            "op": "schedule",
            "step": self.step,
            "scheduled": scheduled,
            "preempted": sorted(so.preempted_req_ids or ()),
            "finished": sorted(so.finished_req_ids or ()),
            "prefill_chunks": prefill_chunks,
            "alloc_calls": self.alloc.calls - calls_before,
            **self._fence(),
            **self._state(),
            **kv,
        }
        self.step += 1
        return record

    def update(self) -> dict:
        if not self.pending:
            raise RuntimeError("update with no unprocessed SchedulerOutput (bad scenario)")
        step, so, mro = self.pending.popleft()
        kv: dict = {}
        if self.worker is not None:
            report = self.worker.take(step)
            if report is not None:
                self.adapter.attach_kv_output(mro, report)
            kv = {"kv_output": report}
        engine_outputs = self.sched.update_from_output(so, mro)
        outputs = {}
        for client_outputs in engine_outputs.values():
            for out in client_outputs.outputs:
                reason = out.finish_reason
                outputs[out.request_id] = {
                    "tokens": list(out.new_token_ids),
                    "finish_reason": None if reason is None else str(reason),
                }
        if kv:
            kv.update(self._connector_view())
        return {"op": "update", "step": step, "outputs": outputs, **self._fence(), **self._state(), **kv}

    def abort(self, ids: list[str]) -> dict:
        self.adapter.abort(self.sched, list(ids))
        kv = self._connector_view() if self.worker is not None else {}
        return {"op": "abort", "ids": list(ids), **self._fence(), **self._state(), **kv}

    def drain(self, depth: int, max_steps: int) -> None:
        """The engine loop (`step_with_batch_queue` at depth > 1, `step` at depth 1):
        schedule while fewer than `depth` outputs are pending, else process the oldest."""
        steps = 0
        while True:
            # Like EngineCore: schedule only while the scheduler has unfinished requests,
            # or (P/D) finished ones whose blocks wait for the worker's report.
            has_work = any(not self.reqs[rid].is_finished() for rid in self.added) or (
                self.worker is not None and self.worker.pending()
            )
            if has_work and len(self.pending) < depth and steps < max_steps:
                self.records.append(self.schedule())
                steps += 1
            elif self.pending:
                self.records.append(self.update())
            else:
                break  # all finished (or step cap reached) and nothing in flight

    def apply(self, act: dict) -> None:
        op = act["op"]
        if op == "add":
            self.records.append(self.add(act["ids"]))
        elif op == "schedule":
            self.records.append(self.schedule())
        elif op == "update":
            self.records.append(self.update())
        elif op == "abort":
            self.records.append(self.abort(act["ids"]))
        elif op == "fail_next_allocation":
            self.alloc.arm(act["call_number"])
        elif op == "set_priority":
            for rid, prio in act["priorities"].items():
                self.reqs[rid].priority = prio
        elif op == "drain":
            self.drain(act["depth"], act["max_steps"])
        else:
            raise ValueError(f"unknown action op {op!r}")

    def final(self) -> dict:
        return {
            rid: {
                "status": req.status.name,
                "output_token_ids": list(req.output_token_ids),
                "num_preemptions": req.num_preemptions,
            }
            for rid, req in self.reqs.items()
        }


def play(scenario: dict, adapter) -> dict:
    """Runs every action; returns {"id", "side", "records", "final", "error"}.
    An exception stops the scenario and is reported (type and message) in "error"
    with the index of the failing action."""
    trace = {"id": scenario["id"], "side": adapter.name, "records": [], "final": {}, "error": None}
    run = None
    index = -1
    try:
        run = _Run(scenario, adapter)
        for index, act in enumerate(scenario["actions"]):
            first = len(run.records)
            run.apply(act)
            for rec in run.records[first:]:
                rec["action_index"] = index
    except Exception as exc:  # reported, compared, never swallowed silently
        trace["error"] = {
            "action_index": index,
            "type": type(exc).__name__,
            "message": str(exc)[:500],
            "traceback": traceback.format_exc()[-3000:],
        }
    if run is not None:
        trace["records"] = run.records
        trace["final"] = run.final()
    return trace
