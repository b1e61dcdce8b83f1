"""The KV transport port on the virtual clock: one instance per consumer
node, over a seeded, impaired `Link` per (consumer, producer) pair. It moves
no bytes — the producer checks the blocks it would serve (`check_blocks`,
with its shadow read) and the payload's size goes through the link's
bandwidth — and it reports each attempt exactly once, within its timeout,
as the gRPC transport does:

    attempt:  request (consumer -> producer) -> producer checks the blocks
              -> payload (producer -> consumer) -> every block landed
    lost request or payload, or a payload that would land after the
    attempt's timeout: DEADLINE_EXCEEDED at the timeout
    producer gone: PRODUCER_UNAVAILABLE when the request would have reached it
    producer does not hold them: UNKNOWN_REQUEST when its answer arrives
    wrong ticket, or another consumer's request: REJECTED when its answer arrives
    done report: report -> producer's `on_done_report` -> ack; lost either
    way: not delivered, at the timeout

The connector's own terms (connector/kv_timing.py) come on top of the link:
the handshake with a producer not contacted yet and the request's metadata
before the request goes out, the per-transfer latency, descriptors and
bandwidth once the payload is served; an attempt they push past its timeout
fails as above. The attempt's timeout counts from when its read can start
(the handshake is the connector's, not the attempt's).

The retry policy is the node's, not this transport's.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Protocol, TypeGuard

from connector.kv_timing import NO_KV_TIMING, KVContacts, KVTransferTiming
from connector.link import Direction, Link
from connector.transport import (
    DoneReport,
    DoneReportResult,
    KVAccessControl,
    KVAccessDenied,
    KVServeEndpoint,
    OnBlock,
    PullAttempt,
    PullAttemptResult,
    PullFailure,
    UnknownBlockError,
    UnknownRequestError,
)

from .clock import EventLoop

REQUEST_BYTES = 256
ANSWER_BYTES = 64
DONE_BYTES = 64


_ACCESS_CONTROLLED: dict[type, bool] = {}


def _access_controlled(producer: object) -> TypeGuard[KVAccessControl]:
    """`isinstance(producer, KVAccessControl)`, asked once per class: a
    runtime protocol check walks the protocol's members on every call, and
    this runs for every pull and every done report."""
    known = _ACCESS_CONTROLLED.get(type(producer))
    if known is None:
        known = _ACCESS_CONTROLLED[type(producer)] = isinstance(producer, KVAccessControl)
    return known


def _authorize(producer: object, request_id: str, ticket: str, consumer: str) -> None:
    """A producer that checks who may pull (`KVAccessControl`) checks it here."""
    if _access_controlled(producer):
        producer.authorize(request_id, ticket, consumer)


class Producer(KVServeEndpoint, Protocol):
    @property
    def alive(self) -> bool: ...


class InProcKVTransport:
    def __init__(
        self,
        consumer: str,
        loop: EventLoop,
        producers: Mapping[str, Producer],
        link_to: Callable[[str, str], Link],
        bytes_per_token: int,
        timing: KVTransferTiming = NO_KV_TIMING,
    ) -> None:
        """`producers` maps an address (the producer's name in-process) to its
        node; `link_to(consumer, address)` gives the link between them."""
        self.consumer = consumer
        self.loop = loop
        self.producers = producers
        self.link_to = link_to
        self.bytes_per_token = bytes_per_token
        self.timing = timing
        self._timed = not timing.is_free
        self.contacts = KVContacts()
        # Reports passed on already: a repeat (its ack was lost) is only
        # acknowledged, as the gRPC server's handler does.
        self._reported: set[tuple[str, str]] = set()

    def forget_reports(self, keep: set[str]) -> None:
        """A long-running server: forget passed-on reports of requests not in
        `keep`. A late repeat of one is refused by its producer, which has
        forgotten the request too."""
        self._reported = {key for key in self._reported if key[1] in keep}

    def _link(self, address: str) -> Link:
        return self.link_to(self.consumer, address)

    # -- pulls -------------------------------------------------------------------
    def pull(self, attempt: PullAttempt, on_block: OnBlock, on_result: Callable[[PullAttemptResult], None]) -> None:
        now = self.loop.now()
        if self._timed:
            # The handshake (first contact) and the request's metadata go
            # first; the attempt's timeout counts from when its read can start.
            now = self.contacts.start_at(self.timing, attempt.remote_address, attempt.request_id, now)
        timeout_at = now + attempt.timeout_s
        arrival = self._link(attempt.remote_address).transit(now, REQUEST_BYTES, Direction.FORWARD)
        if arrival is None or arrival > timeout_at:
            self._timeout(attempt, on_result, timeout_at)
            return
        self.loop.at(arrival, self._serve, attempt, on_result, timeout_at)

    def _timeout(self, attempt: PullAttempt, on_result: Callable[[PullAttemptResult], None], at: float) -> None:
        result = PullAttemptResult(attempt, failure=PullFailure.DEADLINE_EXCEEDED, reason="attempt timed out")
        self.loop.at(at, on_result, result)

    def _serve(self, attempt: PullAttempt, on_result: Callable[[PullAttemptResult], None], timeout_at: float) -> None:
        now = self.loop.now()
        producer = self.producers.get(attempt.remote_address)
        if producer is None or not producer.alive:
            on_result(PullAttemptResult(attempt, failure=PullFailure.PRODUCER_UNAVAILABLE, reason="producer gone"))
            return
        link = self._link(attempt.remote_address)
        try:
            _authorize(producer, attempt.remote_request_id, attempt.ticket, self.consumer)
            num_tokens = producer.check_blocks(attempt.remote_request_id, attempt.remote_block_ids)
        except (UnknownRequestError, UnknownBlockError, KVAccessDenied) as err:
            answer = link.transit(now, ANSWER_BYTES, Direction.REVERSE)
            if answer is None or answer > timeout_at:
                self._timeout(attempt, on_result, timeout_at)
                return
            if isinstance(err, KVAccessDenied):
                failure, reason = PullFailure.REJECTED, f"PERMISSION_DENIED: {err}"
            else:
                failure, reason = PullFailure.UNKNOWN_REQUEST, "NOT_FOUND: not held"
            self.loop.at(answer, on_result, PullAttemptResult(attempt, failure=failure, reason=reason))
            return
        nbytes = num_tokens * self.bytes_per_token
        arrival = link.transit(now, nbytes, Direction.REVERSE)
        if arrival is not None and self._timed:
            arrival += self.timing.transfer_s(len(attempt.block_indices), nbytes)
        if arrival is None or arrival > timeout_at:
            self._timeout(attempt, on_result, timeout_at)
            return
        result = PullAttemptResult(attempt, landed=attempt.block_indices, num_bytes=nbytes)
        self.loop.at(arrival, on_result, result)

    # -- done reports ----------------------------------------------------------------
    def report_done(self, report: DoneReport, on_result: Callable[[DoneReportResult], None]) -> None:
        now = self.loop.now()
        timeout_at = now + report.timeout_s
        arrival = self._link(report.remote_address).transit(now, DONE_BYTES, Direction.FORWARD)
        if arrival is None or arrival > timeout_at:
            self.loop.at(timeout_at, on_result, DoneReportResult(report, delivered=False))
            return
        self.loop.at(arrival, self._deliver_report, report, on_result, timeout_at)

    def _deliver_report(
        self, report: DoneReport, on_result: Callable[[DoneReportResult], None], timeout_at: float
    ) -> None:
        producer = self.producers.get(report.remote_address)
        if producer is None or not producer.alive:
            on_result(DoneReportResult(report, delivered=False))
            return
        refused = False
        try:
            _authorize(producer, report.remote_request_id, report.ticket, self.consumer)
        except (UnknownRequestError, KVAccessDenied):
            refused = True
        key = (report.remote_address, report.remote_request_id)
        if not refused and key not in self._reported:
            self._reported.add(key)
            producer.on_done_report(report.remote_request_id, report.success)
        ack = self._link(report.remote_address).transit(self.loop.now(), ANSWER_BYTES, Direction.REVERSE)
        if ack is None or ack > timeout_at:
            self.loop.at(timeout_at, on_result, DoneReportResult(report, delivered=False))
            return
        self.loop.at(ack, on_result, DoneReportResult(report, delivered=not refused, final=refused))
