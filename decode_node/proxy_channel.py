"""A node's connection to the proxy: one framed TCP connection per node,
opened by the node. Requests come in on it, the node's events go out on it,
in order; when the node's process dies the proxy sees the connection close.

    node -> proxy: ["hello", node_name] first, then ["ev", events]
    proxy -> node: ["req", [request wire dicts]]
"""

from __future__ import annotations

import asyncio
import logging
from typing import Callable

from .frames import FrameConnection

logger = logging.getLogger(__name__)


class ProxyChannel:
    def __init__(self, node_name: str, on_requests: Callable[[list[dict]], None]) -> None:
        self.node_name = node_name
        self.on_requests = on_requests
        self.conn: FrameConnection | None = None
        self._reader: asyncio.Task | None = None
        self.messages_sent = 0

    async def connect(self, host: str, port: int) -> None:
        self.conn = await FrameConnection.open(host, port)
        self.conn.send(["hello", self.node_name])
        self._reader = asyncio.ensure_future(self._read())

    async def _read(self) -> None:
        while (frame := await self.conn.recv()) is not None:
            kind, payload = frame
            if kind == "req":
                try:
                    self.on_requests(payload)
                except Exception:
                    logger.exception("%s: bad requests from the proxy", self.node_name)

    def send_events(self, events: list) -> None:
        if self.conn is not None and self.conn.send(["ev", events]):
            self.messages_sent += 1

    async def close(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
        if self.conn is not None:
            await self.conn.close()
