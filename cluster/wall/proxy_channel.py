"""A node's connection to the proxy: one framed TCP connection per node,
opened by the node. Requests come in on it, the node's events go out on it,
in order; when the node's process dies the proxy sees the connection close.

    (with a run secret: the proxy's challenge and the node's answer first, `auth.py`)
    node -> proxy: ["hello", node_name] first, then ["ev", [event wire, ...]]
    proxy -> node: ["req", [RequestMessage, ReleaseMessage or AbortMessage wire, ...]]

`emit` is the node's outbox port: the events of one event-loop pass go out
as one frame, so steps that finish together cost one message, in order.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence

from connector.grpc.security import KVSecurity
from engine.outputs import SteadyTokens
from node.messages import (
    AbortMessage,
    MessageError,
    NodeEvent,
    ReleaseMessage,
    RequestMessage,
    proxy_message_from_wire,
    short,
)

from .auth import answer
from .frames import FrameConnection, FrameError

logger = logging.getLogger(__name__)


class ProxyChannel:
    def __init__(
        self,
        node_name: str,
        on_requests: Callable[[list[RequestMessage]], None],
        on_release: Callable[[list[str]], None] | None = None,
        secret: bytes | None = None,
        on_abort: Callable[[list[str]], None] | None = None,
        tls: KVSecurity | None = None,
    ) -> None:
        self.node_name = node_name
        self._tls = tls  # the run's TLS (cluster/wall/tls.py), or plain TCP
        self.on_requests = on_requests
        self.on_release = on_release
        self.on_abort = on_abort
        self._secret = secret
        self.conn: FrameConnection | None = None
        self._reader: asyncio.Task | None = None
        self._pending: list[list] = []
        self._flush_scheduled = False
        self.messages_sent = 0
        self.bad_frames = 0

    async def connect(self, host: str, port: int) -> None:
        self.conn = await FrameConnection.open(host, port, tls=self._tls)
        if self._secret is not None:
            await answer(self.conn, self._secret, self.node_name)
        self.conn.send(["hello", self.node_name])
        self._reader = asyncio.ensure_future(self._read())
        if self._pending:
            self._flush()

    async def _read(self) -> None:
        assert self.conn is not None
        try:
            while (frame := await self.conn.recv()) is not None:
                self._on_frame(frame)
        except FrameError as err:
            logger.error("%s: the proxy broke the framing: %s", self.node_name, err)

    def _on_frame(self, frame: object) -> None:
        try:
            if not (isinstance(frame, list) and len(frame) == 2 and frame[0] == "req" and isinstance(frame[1], list)):
                raise MessageError(f"expected ['req', [requests]], got {short(frame)}")
            messages = [proxy_message_from_wire(w) for w in frame[1]]
        except MessageError as err:
            self.bad_frames += 1
            logger.warning("%s: bad requests from the proxy: %s", self.node_name, err)
            return
        requests = [m for m in messages if isinstance(m, RequestMessage)]
        if requests:
            self.on_requests(requests)
        released = [rid for m in messages if isinstance(m, ReleaseMessage) for rid in m.request_ids]
        if released and self.on_release is not None:
            self.on_release(released)
        # After the requests of the same frame: an abort never overtakes its request.
        aborted = [rid for m in messages if isinstance(m, AbortMessage) for rid in m.request_ids]
        if aborted and self.on_abort is not None:
            self.on_abort(aborted)

    # -- the outbox port -----------------------------------------------------------
    def emit(self, events: Sequence[NodeEvent | SteadyTokens]) -> None:
        if not events:
            return
        for e in events:
            # Bulk token outputs are the in-process runtime's alone (its fast paths).
            assert not isinstance(e, SteadyTokens), "a wall-clock node emitted a SteadyTokens"
            self._pending.append(e.to_wire())
        if not self._flush_scheduled and self.conn is not None:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        if self._pending and self.conn is not None:
            events, self._pending = self._pending, []
            if self.conn.send(["ev", events]):
                self.messages_sent += 1

    async def close(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
        if self.conn is not None:
            await self.conn.close()
