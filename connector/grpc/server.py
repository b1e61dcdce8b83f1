"""Producer side of the KV handoff: a plain handler, a thin servicer, the aio server.

`KVHandoffHandler` holds the behaviour (validate a pull, fetch and checksum
the blocks, dedupe done reports) and knows nothing of gRPC; the servicer only
translates messages and maps errors to status codes; `KVHandoffServer` owns
the `grpc.aio` server's lifetime.

    server = KVHandoffServer(source, on_done=node.on_pull_done)
    address = await server.start()      # "127.0.0.1:<port>"
    ...
    await server.stop()
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, NoReturn

import grpc

from connector.payload import checksum
from connector.transport import (
    BlockSource,
    DoneCallback,
    KVAccessControl,
    KVAccessDenied,
    UnknownBlockError,
    UnknownRequestError,
)
from protos.disagg import kv_handoff_pb2 as pb
from protos.disagg import kv_handoff_pb2_grpc as pb_grpc

from .framing import WireBlock, encode_chunks
from .gate import TokenGate
from .security import KVSecurity
from .wire import (
    DEFAULT_CHUNK_BYTES,
    MAX_CHUNK_BYTES,
    MAX_MESSAGE_BYTES,
    MIN_CHUNK_BYTES,
    release_freed_memory,
    server_options,
    validate_chunk_bytes,
)

logger = logging.getLogger(__name__)

# corrupt(request_id, block_id, data) -> the bytes to put on the wire. A fault
# injection hook: it runs after the checksum was taken, as a bad link would.
CorruptHook = Callable[[str, int, bytes], bytes]


class InvalidPullError(ValueError):
    """The pull request itself is malformed (maps to INVALID_ARGUMENT)."""


class OverloadedError(Exception):
    """Too many pulls are streaming at once (maps to RESOURCE_EXHAUSTED; the
    consumer retries after its backoff)."""


# Input limits: anything longer is refused as INVALID_ARGUMENT, before any
# work, and never echoed back.
MAX_ID_CHARS = 256
MAX_TICKET_CHARS = 128
MAX_REASON_CHARS = 1024
MAX_BLOCKS_PER_PULL = 65_536
# Server-side bound on one PullBlocks stream, whatever deadline the client
# set (or none): a reader that stalls is cut off here, and its memory freed.
DEFAULT_MAX_STREAM_S = 60.0
# Pulls streaming at once across all connections; beyond: RESOURCE_EXHAUSTED.
DEFAULT_MAX_ACTIVE_PULLS = 256
# Chunk memory a server lets its streams hold at once. Each stream is charged
# CHUNKS_HELD_PER_STREAM of its chunk size: the chunk being encoded, the one
# being written and what gRPC buffers past the reader's window (measured:
# ~1.5 MiB per stalled 512 KiB-chunk stream, ~12 MiB per 4 MiB one). A pull
# that would pass the budget is RESOURCE_EXHAUSTED, and the consumer retries.
# The default admits the 256 streams of default-size chunks, or 42 streams of
# 4 MiB chunks.
CHUNKS_HELD_PER_STREAM = 3
DEFAULT_MAX_INFLIGHT_BYTES = 512 * 1024 * 1024


def _short(text: object, limit: int = 64) -> str:
    shown = str(text)
    return shown if len(shown) <= limit else shown[:limit] + "..."


class KVHandoffHandler:
    """What the producer does for each RPC, without gRPC.

    A source that is a `KVAccessControl` (a `PrefillNode`) is asked first
    whether the caller may touch the request (its ticket and consumer); a
    plain `BlockSource` serves whoever asks. A source with `iter_blocks`
    builds each block's bytes only when the stream reaches it, so a pull
    holds the chunks in flight, not the whole prompt.
    """

    def __init__(
        self,
        source: BlockSource,
        on_done: DoneCallback | None = None,
        *,
        default_chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        corrupt: CorruptHook | None = None,
        remembered_done_reports: int = 100_000,
        max_active_pulls: int = DEFAULT_MAX_ACTIVE_PULLS,
        max_inflight_bytes: int = DEFAULT_MAX_INFLIGHT_BYTES,
    ) -> None:
        self.source = source
        self.on_done = on_done
        self.default_chunk_bytes = validate_chunk_bytes(default_chunk_bytes)
        self.corrupt = corrupt
        self.serving = True
        self.max_active_pulls = max_active_pulls
        self.active_pulls = 0
        self.max_inflight_bytes = max_inflight_bytes
        # Chunk memory charged to the streams served now (CHUNKS_HELD_PER_STREAM each).
        self.inflight_bytes = 0
        # The most streams served at once: what an operator sizes memory by.
        self.peak_active_pulls = 0
        # Streams ended by the server's own bound (`max_stream_s`).
        self.pulls_cut_at_bound = 0
        # A lost ack makes the consumer report again; pass each request on
        # once. Bounded so a long run does not grow without limit.
        self._done: OrderedDict[str, None] = OrderedDict()
        self._remembered = remembered_done_reports

    def chunk_bytes_for(self, requested: int) -> int:
        if requested == 0:
            return self.default_chunk_bytes
        try:
            return validate_chunk_bytes(requested)
        except ValueError:
            raise InvalidPullError(f"max_chunk_bytes must be 0 or in [{MIN_CHUNK_BYTES}, {MAX_CHUNK_BYTES}]") from None

    def _authorize(self, request_id: str, ticket: str, consumer: str) -> None:
        if isinstance(self.source, KVAccessControl):
            self.source.authorize(request_id, ticket, consumer)

    def blocks_for_pull(
        self, request_id: str, block_ids: Sequence[int], ticket: str = "", consumer: str = ""
    ) -> Iterator[WireBlock]:
        """The blocks to stream, checksummed and fault hook applied, lazily.

        The request is validated and checked before this returns, so it
        raises UnknownRequestError / UnknownBlockError / KVAccessDenied /
        InvalidPullError up front; contents and checksums come as the stream goes.
        """
        if not request_id:
            raise InvalidPullError("request_id is empty")
        if len(request_id) > MAX_ID_CHARS or len(ticket) > MAX_TICKET_CHARS or len(consumer) > MAX_ID_CHARS:
            raise InvalidPullError("request_id, ticket or consumer_id too long")
        if not block_ids:
            raise InvalidPullError("no block_ids to pull")
        if len(block_ids) > MAX_BLOCKS_PER_PULL:
            raise InvalidPullError(f"more than {MAX_BLOCKS_PER_PULL} block_ids")
        if len(set(block_ids)) != len(block_ids):
            raise InvalidPullError("duplicate block_ids")
        self._authorize(request_id, ticket, consumer)
        iter_blocks = getattr(self.source, "iter_blocks", None)
        if iter_blocks is not None:
            contents: Iterable[bytes] = iter_blocks(request_id, block_ids)
        else:
            contents = self.source.get_blocks(request_id, block_ids)
            if len(contents) != len(block_ids):
                raise RuntimeError(f"BlockSource returned {len(contents)} blocks for {len(block_ids)} ids")
        return (self._wire_block(request_id, b, d) for b, d in zip(block_ids, contents))

    def _wire_block(self, request_id: str, block_id: int, data: bytes) -> WireBlock:
        data = bytes(data)  # no copy when it already is bytes
        crc32 = checksum(data)
        if self.corrupt is not None:
            data = self.corrupt(request_id, block_id, data)
        return WireBlock(block_id, data, crc32)

    async def report_done(self, request_id: str, success: bool, ticket: str = "", consumer: str = "") -> bool:
        """Pass the report on to on_done once; True if this was the first report.
        Raises UnknownRequestError / KVAccessDenied when the caller may not report on it."""
        if not request_id or len(request_id) > MAX_ID_CHARS or len(ticket) > MAX_TICKET_CHARS:
            raise InvalidPullError("request_id or ticket empty or too long")
        self._authorize(request_id, ticket, consumer)
        if request_id in self._done:
            return False
        self._done[request_id] = None
        if len(self._done) > self._remembered:
            self._done.popitem(last=False)
        if self.on_done is not None:
            outcome = self.on_done(request_id, success)
            if inspect.isawaitable(outcome):
                await outcome
        return True


# What a refused call is told: the status and a short, fixed message.
_REFUSALS: dict[type, tuple[grpc.StatusCode, str]] = {
    UnknownRequestError: (grpc.StatusCode.NOT_FOUND, "not held"),
    UnknownBlockError: (grpc.StatusCode.NOT_FOUND, "block not held"),
    KVAccessDenied: (grpc.StatusCode.PERMISSION_DENIED, "not yours"),
    OverloadedError: (grpc.StatusCode.RESOURCE_EXHAUSTED, "too many pulls at once"),
}


class _KVHandoffServicer(pb_grpc.KVHandoffServicer):
    """Translation only: bytes in, handler calls, messages or status codes
    out. Requests arrive as raw bytes and are parsed here, so an undecodable
    one is INVALID_ARGUMENT (not gRPC's UNKNOWN); every call is
    authenticated before it got here (gate.TokenGate); errors carry short fixed
    messages, never the caller's input."""

    def __init__(
        self, handler: KVHandoffHandler, security: KVSecurity | None = None, max_stream_s: float = DEFAULT_MAX_STREAM_S
    ) -> None:
        self._handler = handler
        self._security = security or KVSecurity()
        self._max_stream_s = max_stream_s
        self.refused: dict[str, int] = {}

    async def _refuse(self, context: grpc.aio.ServicerContext, code: grpc.StatusCode, message: str) -> NoReturn:
        self.refused[code.name] = self.refused.get(code.name, 0) + 1
        await context.abort(code, message)
        raise AssertionError("unreachable")  # context.abort raises

    async def _parse(self, context: grpc.aio.ServicerContext, parse: Callable[[bytes], Any], raw: bytes) -> Any:
        # Authentication happened before the body was read (gate.TokenGate).
        try:
            return parse(raw)
        except Exception:  # DecodeError and kin: the bytes are not the message
            await self._refuse(context, grpc.StatusCode.INVALID_ARGUMENT, "undecodable request")

    async def PullBlocks(self, raw: bytes, context: grpc.aio.ServicerContext) -> None:
        """Writes BlockChunks already serialised (see framing.encode_chunks), one
        at a time as the client takes them, within `max_stream_s`."""
        request = await self._parse(context, pb.PullRequest.FromString, raw)
        handler = self._handler
        refusal: tuple[grpc.StatusCode, str] | None = None
        try:
            if handler.active_pulls >= handler.max_active_pulls:
                raise OverloadedError()
            chunk_bytes = handler.chunk_bytes_for(request.max_chunk_bytes)
            charge = CHUNKS_HELD_PER_STREAM * chunk_bytes
            if handler.inflight_bytes + charge > handler.max_inflight_bytes:
                raise OverloadedError()
            blocks = handler.blocks_for_pull(
                request.request_id, list(request.block_ids), request.ticket, request.consumer_id
            )
        except InvalidPullError as err:
            refusal = (grpc.StatusCode.INVALID_ARGUMENT, _short(err))
        except tuple(_REFUSALS) as err:  # type: ignore[misc]  # mypy wants a literal tuple of exception classes
            refusal = _REFUSALS[type(err)]
        if refusal is not None:
            await self._refuse(context, *refusal)
        handler.active_pulls += 1
        handler.inflight_bytes += charge
        handler.peak_active_pulls = max(handler.peak_active_pulls, handler.active_pulls)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._max_stream_s
        try:
            async with asyncio.timeout_at(deadline):
                for chunk in encode_chunks(blocks, chunk_bytes):
                    # Also checked between writes: a cancellation that lands
                    # while grpc finishes a write can be absorbed by it, and
                    # the stream must still end at its bound.
                    if loop.time() >= deadline:
                        raise TimeoutError
                    await context.write(chunk)
        except TimeoutError:
            handler.pulls_cut_at_bound += 1
            await self._refuse(context, grpc.StatusCode.DEADLINE_EXCEEDED, "stream took too long")
        except (UnknownRequestError, UnknownBlockError):  # released while streaming
            await self._refuse(context, grpc.StatusCode.NOT_FOUND, "not held")
        finally:
            handler.active_pulls -= 1
            handler.inflight_bytes -= charge
            if handler.active_pulls == 0:
                # The last stream is gone: hand its chunks' pages back
                # (wire.release_freed_memory says why glibc keeps them).
                release_freed_memory()

    async def ReportDone(self, raw: bytes, context: grpc.aio.ServicerContext) -> pb.DoneAck:
        request = await self._parse(context, pb.DoneRequest.FromString, raw)
        refusal: tuple[grpc.StatusCode, str] | None = None
        try:
            first = await self._handler.report_done(
                request.request_id, request.success, request.ticket, request.consumer_id
            )
        except InvalidPullError as err:
            refusal = (grpc.StatusCode.INVALID_ARGUMENT, _short(err))
        except (UnknownRequestError, KVAccessDenied) as err:
            refusal = _REFUSALS[type(err)]
        if refusal is not None:
            await self._refuse(context, *refusal)
        if not request.success:
            logger.info(
                "consumer %s failed to pull %s: %s",
                _short(request.consumer_id),
                _short(request.request_id),
                _short(request.reason),
            )
        return pb.DoneAck(first_report=first)

    async def Check(self, raw: bytes, context: grpc.aio.ServicerContext) -> pb.HealthCheckResponse:
        await self._parse(context, pb.HealthCheckRequest.FromString, raw)
        status = pb.HealthCheckResponse.SERVING if self._handler.serving else pb.HealthCheckResponse.NOT_SERVING
        return pb.HealthCheckResponse(status=status)


def kv_handoff_rpc_handlers(servicer: _KVHandoffServicer) -> grpc.GenericRpcHandler:
    """The generated add_KVHandoffServicer_to_server, except that requests
    come in as raw bytes (parsed by the servicer) and PullBlocks' responses
    go out as the bytes the servicer already serialised."""
    service = pb.DESCRIPTOR.services_by_name["KVHandoff"]
    methods = {
        "PullBlocks": grpc.unary_stream_rpc_method_handler(
            servicer.PullBlocks,
            request_deserializer=None,  # raw bytes: parsed by the servicer
            response_serializer=None,  # already bytes
        ),
        "ReportDone": grpc.unary_unary_rpc_method_handler(
            servicer.ReportDone,
            request_deserializer=None,
            response_serializer=pb.DoneAck.SerializeToString,
        ),
        "Check": grpc.unary_unary_rpc_method_handler(
            servicer.Check,
            request_deserializer=None,
            response_serializer=pb.HealthCheckResponse.SerializeToString,
        ),
    }
    return grpc.method_handlers_generic_handler(service.full_name, methods)


def format_address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class KVHandoffServer:
    """The producer's KV handoff endpoint on a `grpc.aio` server.

    Binds to 127.0.0.1 and an OS-chosen port unless told otherwise. A stopped
    server cannot be started again (a gRPC server is single-use): make a new one.
    """

    def __init__(
        self,
        source: BlockSource,
        on_done: DoneCallback | None = None,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        default_chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        max_message_bytes: int = MAX_MESSAGE_BYTES,
        corrupt: CorruptHook | None = None,
        security: KVSecurity | None = None,
        max_stream_s: float = DEFAULT_MAX_STREAM_S,
        max_active_pulls: int = DEFAULT_MAX_ACTIVE_PULLS,
        max_inflight_bytes: int = DEFAULT_MAX_INFLIGHT_BYTES,
    ) -> None:
        """`security`: the token every call must carry, and TLS (docs/security.md).
        `max_stream_s` bounds one PullBlocks stream server-side;
        `max_active_pulls` the streams served at once, `max_inflight_bytes`
        the chunk memory they may hold (CHUNKS_HELD_PER_STREAM chunks each)."""
        if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
            raise ValueError(f"KVHandoffServer: port must be an int in [0, 65535], got {port!r}")
        self.handler = KVHandoffHandler(
            source,
            on_done,
            default_chunk_bytes=default_chunk_bytes,
            corrupt=corrupt,
            max_active_pulls=max_active_pulls,
            max_inflight_bytes=max_inflight_bytes,
        )
        self.security = security or KVSecurity()
        self.gate = TokenGate(self.security)
        self.servicer = _KVHandoffServicer(self.handler, self.security, max_stream_s)
        self._host = host
        self._port = port
        self._max_message_bytes = max_message_bytes
        self._server: grpc.aio.Server | None = None
        self._address: str | None = None
        self._stopped = False

    @property
    def address(self) -> str:
        if self._address is None:
            raise RuntimeError("KVHandoffServer: not started")
        return self._address

    async def start(self) -> str:
        """Bind and start serving; returns "host:port"."""
        if self._stopped:
            raise RuntimeError("KVHandoffServer: a stopped server cannot be restarted")
        if self._server is not None:
            return self.address
        server = grpc.aio.server(options=server_options(self._max_message_bytes), interceptors=(self.gate,))
        server.add_generic_rpc_handlers((kv_handoff_rpc_handlers(self.servicer),))
        bound = format_address(self._host, self._port)
        credentials = self.security.server_credentials()
        try:
            if credentials is not None:
                port = server.add_secure_port(bound, credentials)
            else:
                port = server.add_insecure_port(bound)
        except RuntimeError as err:
            raise RuntimeError(f"KVHandoffServer: cannot bind {bound}: {err}") from err
        if port == 0:
            raise RuntimeError(f"KVHandoffServer: cannot bind {bound}")
        await server.start()
        self._server = server
        self._address = format_address(self._host, port)
        return self._address

    async def stop(self, grace: float | None = 0.5) -> None:
        """Report NOT_SERVING, let in-flight calls finish for `grace` seconds, close."""
        self.handler.serving = False
        self._stopped = True
        if self._server is not None:
            await self._server.stop(grace)
            self._server = None

    async def __aenter__(self) -> KVHandoffServer:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.stop()
