"""The consumer role: an engine core in `kv_consumer` role (the fence is on
by vLLM's gate once batches overlap). Written once, without I/O; both
runtimes run this class.

When a step carries a KV load (`reqs_to_recv`), the worker side registers
the target blocks with the shadow store and pulls the producer's blocks
through the `KVTransport` port, one attempt at a time under the fault policy
(`connector.pull_policy`: per-attempt timeout, retries with backoff, one
deadline; at most `max_concurrent_pulls` at once). When every block has
landed it writes the shadow store and reports `finished_recving`, then tells
the producer (done report, retried); a pull that fails reports a failed
receive, which the scheduler handles by its `kv_load_failure_policy`
(recompute, or finish the request with FINISHED_ERROR), and tells the
producer once, best effort.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from typing import Any

from connector.pull_policy import DoneSession, Failed, Landed, PullSession, Retry
from connector.transport import DoneReportResult, KVTransport, PullAttempt, PullAttemptResult
from engine.kv_connector.pd_connector import RecvSpec
from engine.model_runner import StepPlan
from engine.node_core import NodeSpec
from engine.records import StepRecord
from node.access import TICKET_PARAM
from node.messages import KVEvent, RequestMessage
from node.ports import NodePorts
from node.role import NodeRole
from node.settings import NodeSettings

from .block_sink import VerifyingBlockSink

logger = logging.getLogger(__name__)


class DecodeNode(NodeRole):
    role = "decode"

    def __init__(
        self,
        spec: NodeSpec,
        settings: NodeSettings,
        ports: NodePorts,
        kv: KVTransport,
        on_step: Callable[[StepRecord], None] | None = None,
        check_each_step: bool = False,
    ) -> None:
        super().__init__(spec, settings, ports, on_step, check_each_step)
        self.kv = kv
        self.policy = settings.kv_policy
        self.sink = VerifyingBlockSink(spec.cache.block_size, settings.bytes_per_token)
        self._pulls: dict[str, PullSession] = {}  # by the consumer's request id
        self._waiting: deque[RecvSpec] = deque()  # for a pull slot
        self._reports_in_flight = 0
        # The producer's ticket per request (by the consumer's request id),
        # from its kv_transfer_params: every pull and done report carries it.
        self._tickets: dict[str, str] = {}
        self.pulls_started = 0
        self.pulls_completed = 0
        self.pulls_failed = 0
        self.pull_attempts = 0
        self.pull_retries = 0
        self.pull_checksum_failures = 0
        self.blocks_pulled = 0
        self.bytes_pulled = 0
        self.pull_failures: dict[str, int] = {}
        self.done_reports_sent = 0
        self.done_reports_delivered = 0

    def on_requests(self, messages: list[RequestMessage]) -> None:
        for message in messages:
            params = message.kv_transfer_params
            ticket = params.get(TICKET_PARAM) if params else None
            if isinstance(ticket, str):
                self._tickets[message.request_id] = ticket
        super().on_requests(messages)

    # -- KV loads start with the step that carries them ---------------------------
    def _on_submit(self, plan: StepPlan) -> None:
        loads = plan.loads()
        if not loads:
            return
        now = self.clock.now()
        for spec in loads:
            self.core.register_load(spec.request_id, spec.local_block_ids)
            self.pulls_started += 1
            self._waiting.append(spec)
        self._emit([KVEvent(spec.request_id, "start", now, True) for spec in loads])
        self._start_waiting()

    def _start_waiting(self) -> None:
        while self._waiting and len(self._pulls) < self.policy.max_concurrent_pulls:
            spec = self._waiting.popleft()
            try:
                session = PullSession(
                    spec,
                    self.policy,
                    self.clock.now(),
                    consumer_id=self.name,
                    ticket=self._tickets.pop(spec.request_id, ""),
                )
            except ValueError as err:  # a malformed load fails the request, not the node
                logger.warning("%s: load of %s refused: %s", self.name, spec.request_id, err)
                self._count_failure("rejected")
                self._tickets.pop(spec.request_id, None)
                self._finish_load(spec, ok=False)
                continue
            self._pulls[spec.request_id] = session
            self.sink.expect(spec.remote_request_id, spec.num_tokens)
            self._attempt(session)

    def _attempt(self, session: PullSession) -> None:
        if not self.alive:
            return
        step = session.next_attempt(self.clock.now())
        if isinstance(step, Failed):
            self._pull_failed(session, step)
            return
        self.pull_attempts += 1
        if step.number > 1:
            self.pull_retries += 1
        self.kv.pull(step, self._on_block, lambda result: self._on_attempt_result(session, result))

    def _on_block(self, attempt: PullAttempt, index: int, data: bytes) -> None:
        local = attempt.local_block_ids[attempt.block_indices.index(index)]
        self.sink.write_block(local, attempt.remote_request_id, index, data)

    def _on_attempt_result(self, session: PullSession, result: PullAttemptResult) -> None:
        if not self.alive:
            return
        self.pull_checksum_failures += result.checksum_failures
        self.blocks_pulled += len(result.landed)
        self.bytes_pulled += result.num_bytes
        decision = session.record(result, self.clock.now())
        if isinstance(decision, Landed):
            self._landed(session)
        elif isinstance(decision, Retry):
            self.clock.call_at(decision.at, self._attempt, session)
        else:
            self._pull_failed(session, decision)

    def _landed(self, session: PullSession) -> None:
        spec = session.spec
        self._end_session(session)
        self.pulls_completed += 1
        self.core.write_pulled_blocks(
            spec.request_id, spec.local_block_ids, spec.num_tokens, self.clock.now(), spec.first_block_index
        )
        self._finish_load(spec, ok=True)
        self._report(
            DoneSession(
                spec.remote_request_id,
                spec.remote_address,
                True,
                self.policy,
                self.clock.now(),
                consumer_id=self.name,
                ticket=session.ticket,
            )
        )

    def _pull_failed(self, session: PullSession, failed: Failed) -> None:
        spec = session.spec
        self._end_session(session)
        logger.info("%s: pull of %s failed: %s (%s)", self.name, spec.request_id, failed.failure.value, failed.reason)
        self._count_failure(failed.failure.value)
        self._finish_load(spec, ok=False)
        self._report(
            DoneSession(
                spec.remote_request_id,
                spec.remote_address,
                False,
                self.policy,
                self.clock.now(),
                consumer_id=self.name,
                reason=failed.failure.value,
                ticket=session.ticket,
            )
        )

    def _count_failure(self, reason: str) -> None:
        self.pulls_failed += 1
        self.pull_failures[reason] = self.pull_failures.get(reason, 0) + 1

    def _end_session(self, session: PullSession) -> None:
        self._pulls.pop(session.spec.request_id, None)
        self.sink.forget(session.spec.remote_request_id)
        self._start_waiting()

    def _finish_load(self, spec: RecvSpec, ok: bool) -> None:
        self.core.mark_finished_recving(spec.request_id, ok=ok)
        self._emit([KVEvent(spec.request_id, "end", self.clock.now(), ok)])
        self.loop.wake()

    # -- done reports to the producer ------------------------------------------------
    def _report(self, session: DoneSession) -> None:
        if not self.alive:
            return
        self._reports_in_flight += 1
        self.done_reports_sent += 1
        report = session.next_report(self.clock.now())
        self.kv.report_done(report, lambda result: self._on_report_result(session, result))

    def _on_report_result(self, session: DoneSession, result: DoneReportResult) -> None:
        self._reports_in_flight -= 1
        if not self.alive:
            return
        if result.delivered:
            self.done_reports_delivered += 1
        retry = session.record(result, self.clock.now())
        if retry is not None:
            self._reports_in_flight += 1  # the retry is pending from now on
            self.clock.call_at(retry.at, self._report_again, session)

    def _report_again(self, session: DoneSession) -> None:
        self._reports_in_flight -= 1
        self._report(session)

    # -- reporting -------------------------------------------------------------------------
    def busy(self) -> bool:
        """Work left: steps to schedule or in flight, pulls or done reports running."""
        return self.alive and (
            super().busy() or bool(self._pulls) or bool(self._waiting) or self._reports_in_flight > 0
        )

    def extra_counters(self) -> dict[str, Any]:
        c = {
            "kv_pulls_started": self.pulls_started,
            "kv_pulls_completed": self.pulls_completed,
            "kv_pulls_failed": self.pulls_failed,
            "kv_pull_attempts": self.pull_attempts,
            "transport_retries": self.pull_retries,
            "kv_blocks_pulled": self.blocks_pulled,
            "kv_bytes_pulled": self.bytes_pulled,
            "kv_checksum_failures": self.pull_checksum_failures,
            "kv_blocks_verified": self.sink.blocks_verified,
            "kv_block_content_mismatches": self.sink.mismatches,
            "kv_done_reports_sent": self.done_reports_sent,
            "kv_done_reports_delivered": self.done_reports_delivered,
        }
        c.update({f"kv_pulls_failed_{k}": v for k, v in self.pull_failures.items()})
        return c
