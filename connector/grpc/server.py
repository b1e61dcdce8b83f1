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

import inspect
import logging
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Iterator, Sequence

import grpc

from connector.payload import checksum
from connector.transport import (
    BlockSource,
    DoneCallback,
    UnknownBlockError,
    UnknownRequestError,
)
from protos.disagg import kv_handoff_pb2 as pb
from protos.disagg import kv_handoff_pb2_grpc as pb_grpc

from .framing import WireBlock, encode_chunks
from .wire import (
    DEFAULT_CHUNK_BYTES,
    MAX_MESSAGE_BYTES,
    server_options,
    validate_chunk_bytes,
)

logger = logging.getLogger(__name__)

# corrupt(request_id, block_id, data) -> the bytes to put on the wire. A fault
# injection hook: it runs after the checksum was taken, as a bad link would.
CorruptHook = Callable[[str, int, bytes], bytes]


class InvalidPullError(ValueError):
    """The pull request itself is malformed (maps to INVALID_ARGUMENT)."""


class KVHandoffHandler:
    """What the producer does for each RPC, without gRPC."""

    def __init__(
        self,
        source: BlockSource,
        on_done: DoneCallback | None = None,
        *,
        default_chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        corrupt: CorruptHook | None = None,
        remembered_done_reports: int = 100_000,
    ) -> None:
        self.source = source
        self.on_done = on_done
        self.default_chunk_bytes = validate_chunk_bytes(default_chunk_bytes)
        self.corrupt = corrupt
        self.serving = True
        # A lost ack makes the consumer report again; pass each request on
        # once. Bounded so a long run does not grow without limit.
        self._done: OrderedDict[str, None] = OrderedDict()
        self._remembered = remembered_done_reports

    def chunk_bytes_for(self, requested: int) -> int:
        if requested == 0:
            return self.default_chunk_bytes
        try:
            return validate_chunk_bytes(requested)
        except ValueError as err:
            raise InvalidPullError(str(err)) from None

    def blocks_for_pull(self, request_id: str, block_ids: Sequence[int]) -> Iterator[WireBlock]:
        """The blocks to stream, checksummed and fault hook applied, lazily.

        The request is validated and the contents fetched before this
        returns, so it raises UnknownRequestError / UnknownBlockError /
        InvalidPullError up front; checksums are taken as the stream goes.
        """
        if not request_id:
            raise InvalidPullError("request_id is empty")
        if not block_ids:
            raise InvalidPullError(f"request {request_id!r}: no block_ids to pull")
        if len(set(block_ids)) != len(block_ids):
            raise InvalidPullError(f"request {request_id!r}: duplicate block_ids {list(block_ids)}")
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

    async def report_done(self, request_id: str, success: bool) -> bool:
        """Pass the report on to on_done once; True if this was the first report."""
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


class _KVHandoffServicer(pb_grpc.KVHandoffServicer):
    """Translation only: messages in, handler calls, messages or status codes out."""

    def __init__(self, handler: KVHandoffHandler) -> None:
        self._handler = handler

    async def PullBlocks(self, request: pb.PullRequest, context: grpc.aio.ServicerContext) -> AsyncIterator[bytes]:
        """Yields BlockChunks already serialised (see framing.encode_chunks)."""
        handler = self._handler
        try:
            chunk_bytes = handler.chunk_bytes_for(request.max_chunk_bytes)
            blocks = handler.blocks_for_pull(request.request_id, list(request.block_ids))
        except (UnknownRequestError, UnknownBlockError) as err:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"not held: {err.args[0]}")
        except InvalidPullError as err:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(err))
        for chunk in encode_chunks(blocks, chunk_bytes):
            yield chunk

    async def ReportDone(self, request: pb.DoneRequest, context: grpc.aio.ServicerContext) -> pb.DoneAck:
        if not request.request_id:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "request_id is empty")
        first = await self._handler.report_done(request.request_id, request.success)
        if not request.success:
            logger.info(
                "consumer %r failed to pull %s: %s",
                request.consumer_id,
                request.request_id,
                request.reason,
            )
        return pb.DoneAck(first_report=first)

    async def Check(self, request: pb.HealthCheckRequest, context: grpc.aio.ServicerContext) -> pb.HealthCheckResponse:
        status = pb.HealthCheckResponse.SERVING if self._handler.serving else pb.HealthCheckResponse.NOT_SERVING
        return pb.HealthCheckResponse(status=status)


def kv_handoff_rpc_handlers(servicer: _KVHandoffServicer) -> grpc.GenericRpcHandler:
    """The generated add_KVHandoffServicer_to_server, except that PullBlocks'
    responses go out as the bytes the servicer already serialised."""
    service = pb.DESCRIPTOR.services_by_name["KVHandoff"]
    methods = {
        "PullBlocks": grpc.unary_stream_rpc_method_handler(
            servicer.PullBlocks,
            request_deserializer=pb.PullRequest.FromString,
            response_serializer=None,  # already bytes
        ),
        "ReportDone": grpc.unary_unary_rpc_method_handler(
            servicer.ReportDone,
            request_deserializer=pb.DoneRequest.FromString,
            response_serializer=pb.DoneAck.SerializeToString,
        ),
        "Check": grpc.unary_unary_rpc_method_handler(
            servicer.Check,
            request_deserializer=pb.HealthCheckRequest.FromString,
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
    ) -> None:
        if isinstance(port, bool) or not isinstance(port, int) or not 0 <= port <= 65535:
            raise ValueError(f"KVHandoffServer: port must be an int in [0, 65535], got {port!r}")
        self.handler = KVHandoffHandler(source, on_done, default_chunk_bytes=default_chunk_bytes, corrupt=corrupt)
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
        server = grpc.aio.server(options=server_options(self._max_message_bytes))
        server.add_generic_rpc_handlers((kv_handoff_rpc_handlers(_KVHandoffServicer(self.handler)),))
        bound = format_address(self._host, self._port)
        try:
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
