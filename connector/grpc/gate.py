"""Refuse a KV call on its metadata, before gRPC reads its body.

A servicer only sees a unary request after gRPC has received and buffered
the whole message, so a token checked there comes too late: strangers could
make the server hold whatever they send (issue 34: 300 requests of 8 MiB
without a token took a prefill actor to 2.4 GB). The interceptor below runs
in the handler lookup, where only the headers have arrived. For a caller
without the token it returns a *request-streaming* handler that aborts
without ever iterating its request stream, so the body is never pulled into
Python; the server's small receive limit (`wire.MAX_REQUEST_BYTES`) bounds
what gRPC core buffers meanwhile.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from .security import KVSecurity

UNAUTHENTICATED_DETAILS = "missing or wrong KV token"


class TokenGate(grpc.aio.ServerInterceptor):
    """Counts what it refused (`refused`), for tests and stats."""

    def __init__(self, security: KVSecurity) -> None:
        self._security = security
        self.refused = 0

        async def refuse(_requests: Any, context: grpc.aio.ServicerContext) -> None:
            self.refused += 1
            await context.abort(grpc.StatusCode.UNAUTHENTICATED, UNAUTHENTICATED_DETAILS)

        # Request-streaming on purpose: gRPC hands the handler an iterator and
        # reads no message until it is iterated, which this one never does.
        self._refusal = grpc.stream_stream_rpc_method_handler(refuse)

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler:
        if self._security.authenticated(handler_call_details.invocation_metadata):
            return await continuation(handler_call_details)
        return self._refusal
