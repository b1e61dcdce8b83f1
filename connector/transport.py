"""The KV transport port: what the nodes implement and call, free of gRPC.

The prefill node (producer) implements `BlockSource` and takes an `on_done`
callback, which it turns into `finished_sending`. The decode node (consumer)
implements `BlockSink` and calls a `KVPullTransport` — the gRPC `KVPuller`
in `grpc_client.py`, or an in-process stand-in on the virtual clock — and
turns a `PullResult` into `finished_recving`.

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


class KVPullTransport(Protocol):
    """What the decode node's worker side calls to fetch a request's KV blocks."""

    async def pull(
        self,
        request_id: str,
        remote_address: str,
        remote_block_ids: Sequence[int],
        local_block_ids: Sequence[int],
    ) -> PullResult: ...


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
