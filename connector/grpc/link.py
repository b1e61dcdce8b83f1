"""Link impairments for `grpc.aio` clients, applied in the application.

The kernel here has no netem, so a client interceptor runs every message of
an RPC through a `Link` (connector/link.py) in wall time: the request through
the FORWARD delay line before it is sent, each response message through the
REVERSE line after it arrives, sleeping until the link says it arrives.

- Order and throughput: a pump task reads the real response stream as fast
  as it comes, stamping each message with its link arrival time, so messages
  overlap on the modelled wire instead of each paying the full delay in turn.
- Loss: a dropped message stalls the call, as a dead TCP peer would: the call
  fails with DEADLINE_EXCEEDED at its deadline, or at once with UNAVAILABLE
  when it has none (so nothing hangs). The caller retries. The end of a
  response stream (its status) is a zero-byte message and can be lost too.
- Outages: windows are in seconds since `epoch`, a `time.monotonic()` value
  (the clock asyncio uses; system-wide on Linux, so processes can share one).

Only RPCs with a unary request are impaired (unary-unary, unary-stream), which
is every RPC of the KV handoff; streaming-request RPCs pass through untouched.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from typing import Any, NoReturn

import grpc

from connector.link import Direction, Link

_END = object()
_LOST = object()


def _message_bytes(message: Any) -> int:
    if isinstance(message, (bytes, bytearray, memoryview)):
        return len(message)
    byte_size = getattr(message, "ByteSize", None)
    return byte_size() if byte_size is not None else 0


def _rpc_error(code: grpc.StatusCode, details: str) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details=details)


def link_interceptors(link: Link, epoch: float | None = None) -> list[grpc.aio.ClientInterceptor]:
    """The interceptors to install on one channel so that `link` impairs it.

    grpc.aio files each interceptor under the first arity it implements
    (an if/elif chain in aio/_channel.py), so one object cannot serve both
    unary-unary and unary-stream calls: this returns one per arity, sharing
    `link` — all calls on the channel queue on the same two delay lines.
    """
    epoch = time.monotonic() if epoch is None else epoch
    return [UnaryUnaryLinkInterceptor(link, epoch), UnaryStreamLinkInterceptor(link, epoch)]


class _LinkTiming:
    """Clock, deadlines and sleeps shared by the per-arity interceptors."""

    def __init__(self, link: Link, epoch: float | None = None) -> None:
        self.link = link
        self.epoch = time.monotonic() if epoch is None else epoch

    # -- clock -----------------------------------------------------------------

    def _now(self) -> float:
        """Seconds since the epoch, on the link's clock."""
        return time.monotonic() - self.epoch

    @staticmethod
    def _deadline(details: grpc.aio.ClientCallDetails) -> float | None:
        return None if details.timeout is None else time.monotonic() + details.timeout

    @staticmethod
    def _with_remaining_timeout(
        details: grpc.aio.ClientCallDetails, deadline: float | None
    ) -> grpc.aio.ClientCallDetails:
        # Time spent on the modelled wire counts against the caller's timeout.
        if deadline is None:
            return details
        return details._replace(timeout=max(0.0, deadline - time.monotonic()))

    # -- delays ----------------------------------------------------------------

    async def _stall(self, deadline: float | None, what: str) -> NoReturn:
        if deadline is None:
            raise _rpc_error(grpc.StatusCode.UNAVAILABLE, f"{what} dropped by the link model")
        await asyncio.sleep(max(0.0, deadline - time.monotonic()))
        raise _rpc_error(grpc.StatusCode.DEADLINE_EXCEEDED, f"Deadline Exceeded ({what} dropped by the link model)")

    async def _wait_until(self, arrival: float, deadline: float | None, what: str) -> None:
        arrival_wall = self.epoch + arrival
        if deadline is not None and arrival_wall > deadline:
            await asyncio.sleep(max(0.0, deadline - time.monotonic()))
            raise _rpc_error(
                grpc.StatusCode.DEADLINE_EXCEEDED,
                f"Deadline Exceeded ({what} still on the modelled link)",
            )
        wait = arrival_wall - time.monotonic()
        if wait > 0:
            await asyncio.sleep(wait)

    async def _send_request(self, request: Any, deadline: float | None) -> None:
        arrival = self.link.transit(self._now(), _message_bytes(request), Direction.FORWARD)
        if arrival is None:
            await self._stall(deadline, "request")
        else:
            await self._wait_until(arrival, deadline, "request")


class UnaryUnaryLinkInterceptor(_LinkTiming, grpc.aio.UnaryUnaryClientInterceptor):
    # grpc.aio's interceptor API is untyped (no stubs): the call, its details
    # and the messages are grpc's objects, passed through as they come.
    async def intercept_unary_unary(self, continuation: Any, client_call_details: Any, request: Any) -> Any:
        deadline = self._deadline(client_call_details)
        await self._send_request(request, deadline)
        call = await continuation(self._with_remaining_timeout(client_call_details, deadline), request)
        response = await call  # a failed call raises its AioRpcError here
        arrival = self.link.transit(self._now(), _message_bytes(response), Direction.REVERSE)
        if arrival is None:
            await self._stall(deadline, "response")
        else:
            await self._wait_until(arrival, deadline, "response")
        return response


class UnaryStreamLinkInterceptor(_LinkTiming, grpc.aio.UnaryStreamClientInterceptor):
    async def intercept_unary_stream(
        self, continuation: Any, client_call_details: Any, request: Any
    ) -> AsyncIterator[Any]:
        deadline = self._deadline(client_call_details)
        await self._send_request(request, deadline)
        call = await continuation(self._with_remaining_timeout(client_call_details, deadline), request)
        return self._delayed_responses(call, deadline)

    async def _delayed_responses(self, call: Any, deadline: float | None) -> AsyncIterator[Any]:
        queue: asyncio.Queue[tuple[float | None, Any]] = asyncio.Queue()
        reverse = self.link.reverse

        async def pump() -> None:
            try:
                async for message in call:
                    arrival = reverse.transit(self._now(), _message_bytes(message))
                    queue.put_nowait((arrival, message if arrival is not None else _LOST))
                    if arrival is None:
                        return  # the stream stalls here: nothing behind it gets through
                end: Any = _END
            except Exception as err:  # the call's status (AioRpcError), delivered in order
                end = err
            arrival = reverse.transit(self._now(), 0)
            queue.put_nowait((arrival, end if arrival is not None else _LOST))

        pump_task = asyncio.ensure_future(pump())
        try:
            while True:
                arrival, item = await queue.get()
                if arrival is None:  # the item is _LOST
                    await self._stall(deadline, "response message")
                await self._wait_until(arrival, deadline, "response message")
                if item is _END:
                    return
                if isinstance(item, Exception):
                    raise item
                yield item
        finally:
            pump_task.cancel()
            call.cancel()  # no-op once the call has finished
