"""What keeps strangers and slow clients from costing the front door much:
an API key (vLLM's `--api-key`), read timeouts and a connection limit.

- API key: with keys set, every request under /v1 must carry
  `Authorization: Bearer <key>`; otherwise a 401 with vLLM's body,
  `{"error": "Unauthorized"}`, before the body is read. /health, /metrics,
  /tokenize and /detokenize stay open, as vLLM guards only its /v1 (and
  /v2, /inference) prefixes. Keys are compared as SHA-256 digests in
  constant time, against every key.
- Header timeout: a connection must complete a request's headers within
  `header_timeout_s` of opening, and the next request's within as long of
  its previous response (the idle keep-alive bound too). aiohttp reads
  headers as they come and keeps a connection that trickles them forever
  (slowloris), so the guard closes it.
- Body timeout: a request's body must be read whole within
  `body_timeout_s` of its headers (`read_body`); otherwise a 408 and the
  connection closes.
- Connection limit: at most `max_connections` open at once; one past it is
  answered a 503 and closed without being read.

The guard sits between asyncio and aiohttp's protocol
(`ConnectionGuard.protocol` wraps each `RequestHandler`): it sees a
connection open and close without depending on aiohttp internals, and a
middleware tells it when a request's headers are in and when its response
is done.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import secrets
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

GUARDED_PREFIX = "/v1"  # vLLM's guarded prefixes that this server has


@dataclass(frozen=True)
class ServeLimits:
    # uvicorn, under vLLM, closes idle keep-alive connections after 5 s and
    # has no header timeout; 10 s is ample for a client on any network.
    header_timeout_s: float = 10.0
    # A body is at most 8 MiB (app.MAX_BODY_BYTES): 30 s is 280 KB/s.
    body_timeout_s: float = 30.0
    # Above the default --max-pending (512 in flight) with room for idle
    # keep-alive connections; under a 1,024 open-file limit with the
    # server's own files.
    max_connections: int = 900

    def __post_init__(self) -> None:
        for name in ("header_timeout_s", "body_timeout_s"):
            value = getattr(self, name)
            if not value > 0:
                raise ValueError(f"{name}={value!r} is invalid; allowed: > 0 seconds")
        if self.max_connections < 1:
            raise ValueError(f"max_connections={self.max_connections!r} is invalid; allowed: >= 1")


def api_keys_from(args_keys: Iterable[str] | None, env: dict[str, str]) -> list[str]:
    """vLLM's rule: `--api-key` values, else `VLLM_API_KEY`; empty keys are no keys."""
    keys = list(args_keys or [])
    if not keys and env.get("VLLM_API_KEY"):
        keys = [env["VLLM_API_KEY"]]
    return [k for k in keys if k]


def api_key_middleware(keys: list[str]):
    """401 for a /v1 request without one of `keys` as its bearer token."""
    digests = [hashlib.sha256(k.encode("utf-8")).digest() for k in keys]

    def allowed(header: str | None) -> bool:
        if not header:
            return False
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer":
            return False
        got = hashlib.sha256(token.encode("utf-8", "surrogateescape")).digest()
        match = False
        for digest in digests:  # every key compared: no early exit to time
            match |= secrets.compare_digest(got, digest)
        return match

    @web.middleware
    async def check_key(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]):
        if request.method != "OPTIONS" and request.path.startswith(GUARDED_PREFIX):
            if not allowed(request.headers.get("Authorization")):
                response = web.json_response({"error": "Unauthorized"}, status=401)
                response.force_close()  # its body is never read
                return response
        return await handler(request)

    return check_key


_BUSY_BODY = json.dumps(
    {
        "error": {
            "message": "the server has its limit of open connections; retry later",
            "type": "server_error",
            "param": None,
            "code": 503,
        }
    }
).encode()
_BUSY_RESPONSE = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nConnection: close\r\n"
    + b"Content-Length: %d\r\n\r\n" % len(_BUSY_BODY)
    + _BUSY_BODY
)


class _Connection(asyncio.Protocol):
    """One client connection: aiohttp's handler inside, a timer around it."""

    def __init__(self, guard: ConnectionGuard, inner: Any) -> None:
        self.guard = guard
        self.inner = inner  # aiohttp's RequestHandler
        self.transport: asyncio.Transport | None = None
        self.active = 0  # requests whose headers are in and response not done
        self.timer: asyncio.TimerHandle | None = None
        self.refused = False

    # -- asyncio's side ----------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport
        guard = self.guard
        if len(guard.open) >= guard.limits.max_connections:
            self.refused = True
            guard.refused += 1
            transport.write(_BUSY_RESPONSE)
            transport.close()
            return
        guard.open[self.inner] = self
        self.inner.connection_made(transport)
        self.arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self.disarm()
        if self.refused:
            return
        self.guard.open.pop(self.inner, None)
        self.inner.connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if not self.refused:
            self.inner.data_received(data)

    def eof_received(self) -> bool | None:
        return None if self.refused else self.inner.eof_received()

    def pause_writing(self) -> None:
        if not self.refused:
            self.inner.pause_writing()

    def resume_writing(self) -> None:
        if not self.refused:
            self.inner.resume_writing()

    # -- the timer ---------------------------------------------------------------------
    def arm(self) -> None:
        self.disarm()
        loop = asyncio.get_running_loop()
        self.timer = loop.call_later(self.guard.limits.header_timeout_s, self._expired)

    def disarm(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
            self.timer = None

    def _expired(self) -> None:
        self.timer = None
        if self.active == 0 and self.transport is not None and not self.transport.is_closing():
            self.guard.timed_out += 1
            self.transport.close()


class ConnectionGuard:
    def __init__(self, limits: ServeLimits) -> None:
        self.limits = limits
        self.open: dict[Any, _Connection] = {}
        self.refused = 0  # connections over the limit, answered 503
        self.timed_out = 0  # connections closed for not sending a request's headers in time

    def protocol_factory(self, make_handler: Callable[[], Any]) -> Callable[[], asyncio.Protocol]:
        return lambda: _Connection(self, make_handler())

    @web.middleware
    async def middleware(self, request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]):
        conn = self.open.get(request.protocol)
        if conn is None:  # not a guarded connection (a test client of its own)
            return await handler(request)
        conn.active += 1
        conn.disarm()
        try:
            return await handler(request)
        finally:
            conn.active -= 1
            if conn.active == 0:
                conn.arm()

    def counts(self) -> dict[str, int]:
        return {
            "connections_open": len(self.open),
            "connections_refused": self.refused,
            "connections_timed_out": self.timed_out,
        }
