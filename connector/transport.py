"""The KV transport port: what the nodes implement and call, free of gRPC.

The prefill node (producer) is a `KVServeEndpoint`: it hands out the blocks
it holds and turns each done report into `finished_sending`. The decode node
(consumer) drives a `KVTransport` one attempt at a time under the pull policy
(`pull_policy.py`) and turns the outcome into `finished_recving`. Both
runtimes implement the port: gRPC on the wall clock, a seeded link model on
the virtual clock.

The in-memory source and sink at the bottom are small reference
implementations for tests, benchmarks and examples.
"""

from __future__ import annotations

import enum
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable


class UnknownRequestError(KeyError):
    """The producer does not hold this request (never had it, or freed it)."""


class UnknownBlockError(KeyError):
    """The producer holds the request but not this block id for it."""


class KVAccessDenied(Exception):
    """The caller may not touch this request: its ticket is wrong, or the
    request is bound to another consumer (PERMISSION_DENIED on the wire)."""


@runtime_checkable
class BlockSource(Protocol):
    """Producer side: hands out the bytes of a finished prompt's blocks."""

    def get_blocks(self, request_id: str, block_ids: Sequence[int]) -> Sequence[bytes]:
        """Contents of `block_ids` of `request_id`, in the order asked.

        Raises UnknownRequestError / UnknownBlockError when not held.
        """
        ...


@runtime_checkable
class BlockSink(Protocol):
    """Consumer side: receives each verified block once it has arrived.

    May return an awaitable; the puller awaits it before going on.
    """

    def write_block(
        self, local_block_id: int, request_id: str, block_index: int, data: bytes
    ) -> None | Awaitable[None]: ...


# on_done(request_id, success): the consumer is done with the request's
# blocks; the producer may free them. May return an awaitable.
DoneCallback = Callable[[str, bool], None | Awaitable[None]]


class PullFailure(str, enum.Enum):
    UNKNOWN_REQUEST = "unknown_request"  # producer answered NOT_FOUND
    REJECTED = "rejected"  # producer refused the request as malformed
    PRODUCER_UNAVAILABLE = "producer_unavailable"  # unreachable until the deadline
    DEADLINE_EXCEEDED = "deadline_exceeded"  # attempts kept timing out
    PRODUCER_ERROR = "producer_error"  # producer kept failing (INTERNAL, UNKNOWN, ...)
    CHECKSUM_MISMATCH = "checksum_mismatch"  # blocks still corrupt at the deadline
    PROTOCOL_ERROR = "protocol_error"  # the stream broke the framing rules
    SINK_ERROR = "sink_error"  # BlockSink.write_block raised


@dataclass(frozen=True)
class PullResult:
    """What one pull achieved. Durations are wall-clock seconds."""

    request_id: str
    ok: bool
    failure: PullFailure | None = None
    reason: str = ""
    num_blocks: int = 0  # blocks verified and written to the sink
    num_bytes: int = 0
    attempts: int = 0  # PullBlocks calls made
    checksum_failures: int = 0  # blocks that arrived corrupt (then re-pulled)
    done_reported: bool = False  # ReportDone acknowledged by the producer
    transfer_s: float = 0.0  # start → last block written
    total_s: float = 0.0  # start → result (includes ReportDone)


# A pull fails at once on these: retrying cannot fix them.
FINAL_FAILURES = frozenset({PullFailure.UNKNOWN_REQUEST, PullFailure.REJECTED, PullFailure.SINK_ERROR})


@dataclass(frozen=True)
class PullAttempt:
    """One attempt of a pull: ask the producer for the blocks still missing.

    `block_indices[i]` is the position in the prompt of `remote_block_ids[i]`
    (and of `local_block_ids[i]`); a retry asks only for what has not landed.
    """

    request_id: str  # the consumer's id of the request
    remote_request_id: str
    remote_address: str
    remote_block_ids: tuple[int, ...]
    local_block_ids: tuple[int, ...]
    block_indices: tuple[int, ...]
    num_tokens: int  # prompt tokens of the whole load
    number: int  # 1 for the first attempt
    timeout_s: float
    consumer_id: str = ""
    # The producer's capability for this request (`kv_ticket` in its
    # kv_transfer_params): without it the producer refuses the pull.
    ticket: str = ""


@dataclass(frozen=True)
class PullAttemptResult:
    """What one attempt achieved: the block indices that landed (verified and
    written), and why it stopped short if it did (`failure` None: all landed)."""

    attempt: PullAttempt
    landed: tuple[int, ...] = ()
    failure: PullFailure | None = None
    reason: str = ""
    num_bytes: int = 0
    checksum_failures: int = 0

    @property
    def final(self) -> bool:
        return self.failure in FINAL_FAILURES


@dataclass(frozen=True)
class DoneReport:
    """One attempt to tell the producer the consumer is done with a request's
    blocks (`success` False: the pull failed; the producer may free them)."""

    remote_request_id: str
    remote_address: str
    success: bool
    number: int
    timeout_s: float
    consumer_id: str = ""
    reason: str = ""
    ticket: str = ""


@dataclass(frozen=True)
class DoneReportResult:
    report: DoneReport
    delivered: bool  # acknowledged by the producer
    final: bool = False  # refused: retrying cannot help


# Called by a transport when a block of an attempt has arrived intact on the
# wire: (attempt, block index, bytes). It raises when the content is wrong,
# which ends the attempt with SINK_ERROR.
OnBlock = Callable[[PullAttempt, int, bytes], None]


class KVTransport(Protocol):
    """The consumer's port to the KV handoff: single attempts, no policy.

    Retries, backoff, deadlines and hold timeouts are the node's
    (`connector.pull_policy`), identical whichever transport runs. A transport
    reports every attempt exactly once, within its `timeout_s`.
    Implementations: the gRPC one (`connector.grpc.GrpcKVTransport`) and the
    virtual-clock one (`cluster.inproc.InProcKVTransport`).
    """

    def pull(self, attempt: PullAttempt, on_block: OnBlock, on_result: Callable[[PullAttemptResult], None]) -> None: ...

    def report_done(self, report: DoneReport, on_result: Callable[[DoneReportResult], None]) -> None: ...


@runtime_checkable
class KVServeEndpoint(BlockSource, Protocol):
    """The producer's side of the handoff, as a transport serves it."""

    def check_blocks(self, request_id: str, block_ids: Sequence[int]) -> int:
        """The prompt tokens held in `block_ids` of `request_id`, without
        building their bytes (a transport that moves no bytes serves this).
        Raises UnknownRequestError / UnknownBlockError when not held."""
        ...

    def on_done_report(self, request_id: str, success: bool) -> None: ...


@runtime_checkable
class KVAccessControl(Protocol):
    """A producer that checks who touches a request (a `PrefillNode`):
    transports call `authorize` before serving a pull or passing on a done
    report. Raises UnknownRequestError (never held: NOT_FOUND) or
    KVAccessDenied (PERMISSION_DENIED)."""

    def authorize(self, request_id: str, ticket: str, consumer: str) -> None: ...


class InMemoryBlockSource:
    """A BlockSource backed by a dict: request_id → {block_id: bytes}."""

    def __init__(self) -> None:
        self._requests: dict[str, dict[int, bytes]] = {}

    def add(self, request_id: str, blocks: Mapping[int, bytes] | Iterable[tuple[int, bytes]]) -> None:
        self._requests[request_id] = dict(blocks)

    def remove(self, request_id: str) -> None:
        self._requests.pop(request_id, None)

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._requests

    def get_blocks(self, request_id: str, block_ids: Sequence[int]) -> list[bytes]:
        try:
            held = self._requests[request_id]
        except KeyError:
            raise UnknownRequestError(request_id) from None
        try:
            return [held[block_id] for block_id in block_ids]
        except KeyError as missing:
            raise UnknownBlockError(f"request {request_id!r} holds no block {missing.args[0]}") from None


class InMemoryBlockSink:
    """A BlockSink that keeps what it was given: local_block_id → bytes."""

    def __init__(self) -> None:
        self.blocks: dict[int, bytes] = {}
        self.writes: list[tuple[int, str, int]] = []  # (local_block_id, request_id, block_index)

    def write_block(self, local_block_id: int, request_id: str, block_index: int, data: bytes) -> None:
        self.blocks[local_block_id] = data
        self.writes.append((local_block_id, request_id, block_index))
