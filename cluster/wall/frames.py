"""Framed messages over asyncio TCP: the per-step data path of the Ray
runtime (node <-> pipeline stages, nodes <-> proxy).

Ray actors host the processes and carry the control calls (start, report,
stop), but a Ray actor call costs ~3.5-4.5 ms round trip on this 2-vCPU box
under load, against ~0.3 ms for a frame over a plain loopback socket
(measured side by side between the same two actors): at one or two calls
per decode step, Ray calls alone would use up the 2 ms per-step budget.

A frame is a 4-byte big-endian length and a msgpack body (msgpack comes with
Ray; it carries only plain data — no code — unlike pickle). Tuples arrive
as lists. TCP keeps each connection's frames in order; asyncio sets
TCP_NODELAY on its TCP sockets, so small frames are not held back.
"""

from __future__ import annotations

import asyncio
import struct
from collections.abc import Awaitable, Callable
from typing import Any

import msgpack

from connector.grpc.security import KVSecurity

from .tls import client_ssl_context, server_ssl_context

MAX_FRAME_BYTES = 64 << 20
_HEADER = struct.Struct("!I")


class FrameError(Exception):
    """The peer broke the framing (oversized or malformed frame)."""


def encode(obj: Any) -> bytes:
    body = msgpack.packb(obj, use_bin_type=True)
    if len(body) > MAX_FRAME_BYTES:
        raise FrameError(f"frame of {len(body)} bytes exceeds the {MAX_FRAME_BYTES}-byte limit")
    return _HEADER.pack(len(body)) + body


class FrameConnection:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.frames_sent = 0
        self.frames_received = 0

    @classmethod
    async def open(
        cls, host: str, port: int, timeout_s: float = 10.0, tls: KVSecurity | None = None
    ) -> FrameConnection:
        """`tls`: the run's certificates (cluster/wall/tls.py): the server must
        present one its CA signed, for its name; None: plain TCP."""
        if tls is None:
            opened = asyncio.open_connection(host, port)
        else:
            opened = asyncio.open_connection(host, port, ssl=client_ssl_context(tls), server_hostname=tls.server_name)
        reader, writer = await asyncio.wait_for(opened, timeout_s)
        return cls(reader, writer)

    @property
    def closed(self) -> bool:
        return self.writer.is_closing()

    def send(self, obj: Any) -> bool:
        """Queue one frame; False if the connection is already closed."""
        if self.writer.is_closing():
            return False
        self.writer.write(encode(obj))
        self.frames_sent += 1
        return True

    async def recv(self, max_bytes: int = MAX_FRAME_BYTES) -> Any:
        """The next frame, or None once the peer has closed the connection.
        `max_bytes` lowers the size limit (before a peer has authenticated)."""
        try:
            header = await self.reader.readexactly(_HEADER.size)
            (size,) = _HEADER.unpack(header)
            if size > max_bytes:
                raise FrameError(f"peer announced a frame of {size} bytes (limit {max_bytes})")
            body = await self.reader.readexactly(size)
        except (asyncio.IncompleteReadError, ConnectionError):
            return None
        self.frames_received += 1
        try:
            return msgpack.unpackb(body, raw=False, strict_map_key=False)
        except Exception as err:
            raise FrameError(f"undecodable frame ({type(err).__name__})") from None

    async def close(self) -> None:
        if not self.writer.is_closing():
            self.writer.close()
        try:
            await self.writer.wait_closed()
        except (ConnectionError, OSError):
            pass


async def serve(
    host: str, on_connection: Callable[[FrameConnection], Awaitable[None]], tls: KVSecurity | None = None
) -> tuple[asyncio.Server, int]:
    """Listen on `host` (an OS-chosen port); each connection is handed to
    `on_connection`, which owns it until it returns. `tls`: the run's
    certificate is presented (TLS); None: plain TCP."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = FrameConnection(reader, writer)
        try:
            await on_connection(conn)
        finally:
            if not writer.is_closing():
                writer.close()  # not awaited: this may run while the loop shuts down

    server = await asyncio.start_server(handle, host, 0, ssl=server_ssl_context(tls) if tls is not None else None)
    return server, server.sockets[0].getsockname()[1]
