"""Who may touch a held request's KV blocks, without I/O.

A producer gives every request whose blocks it holds a ticket: a MAC of
the request id under the node's `ticket_key` (keyed BLAKE2b, RFC 7693's MAC
mode: one C call, a quarter of `hmac.new`'s cost, which was ~2 % of a 1P+1D
in-process run). The ticket travels in the
request's `kv_transfer_params` (`kv_ticket`) to the proxy and on to the one
decode node the proxy routes the request to; nobody else learns it, and it
cannot be guessed from the request id. A pull or a done report must carry
it. The first consumer that presents it is bound to the request: a pull or
report from another consumer, even with the ticket, is refused.

Released requests are remembered (bounded) so that a repeated done report,
whose ack was lost, is still recognised and acknowledged.
"""

from __future__ import annotations

import hashlib
import hmac
from collections import OrderedDict
from typing import Any

from connector.transport import KVAccessDenied, UnknownRequestError

TICKET_PARAM = "kv_ticket"
REMEMBERED_RELEASES = 10_000


def make_ticket(key: bytes, request_id: str) -> str:
    if len(key) > 64:  # BLAKE2b's longest key (the runtimes' keys are 32 bytes)
        key = hashlib.blake2b(key).digest()
    return hashlib.blake2b(b"kv-ticket\0" + request_id.encode(), key=key, digest_size=16).hexdigest()


class AccessList:
    def __init__(self, key: bytes, remembered: int = REMEMBERED_RELEASES) -> None:
        self._key = key
        self._live: dict[str, list[Any]] = {}  # request id -> [ticket, bound consumer or None]
        self._released: OrderedDict[str, list[Any]] = OrderedDict()
        self._remembered = remembered
        self.denied = 0

    def grant(self, request_id: str) -> str:
        ticket = make_ticket(self._key, request_id)
        self._released.pop(request_id, None)
        self._live[request_id] = [ticket, None]
        return ticket

    def release(self, request_id: str) -> None:
        entry = self._live.pop(request_id, None)
        if entry is not None:
            self._released[request_id] = entry
            if len(self._released) > self._remembered:
                self._released.popitem(last=False)

    def check(self, request_id: str, ticket: str, consumer: str) -> None:
        """Raises UnknownRequestError (never held, or forgotten) or KVAccessDenied."""
        entry = self._live.get(request_id) or self._released.get(request_id)
        if entry is None:
            raise UnknownRequestError("not held")
        if not isinstance(ticket, str) or not hmac.compare_digest(ticket.encode(), entry[0].encode()):
            self.denied += 1
            raise KVAccessDenied("wrong ticket")
        if entry[1] is None:
            entry[1] = consumer
        elif entry[1] != consumer:
            self.denied += 1
            raise KVAccessDenied("bound to another consumer")
