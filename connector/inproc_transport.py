"""The KV handoff in one process: a pull from the consumer to the producer
over a seeded, impaired `Link`, on a virtual clock.

request (consumer -> producer) -> producer reads its blocks -> payload
(producer -> consumer, sized by bytes per token, through the link's bandwidth)
-> consumer writes the pulled blocks -> `finished_recving` on the consumer ->
done (consumer -> producer) -> `finished_sending` on the producer.

A lost message is retried after `timeout_s`; past `deadline_s` (or when the
producer is gone) the pull fails and the consumer reports a failed receive,
which its scheduler handles by its `kv_load_failure_policy`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol

from engine.kv_connector.pd_connector import RecvSpec

from .link import Direction, Link

REQUEST_BYTES = 256
DONE_BYTES = 64


class PullEndpoint(Protocol):
    name: str
    alive: bool

    def blocks_for_pull(self, request_id: str, block_ids: list[int], num_tokens: int, now: float) -> bool: ...
    def write_pulled_blocks(self, request_id: str, block_ids: list[int], num_tokens: int, now: float) -> None: ...
    def mark_finished_sending(self, request_id: str) -> None: ...
    def mark_finished_recving(self, request_id: str, ok: bool = True) -> None: ...
    def wake(self) -> None: ...


@dataclass
class PullStats:
    started: int = 0
    completed: int = 0
    failed: int = 0
    retries: int = 0
    bytes: int = 0


class InProcKVTransport:
    def __init__(
        self,
        at: Callable[..., None],
        now: Callable[[], float],
        link_between: Callable[[str, str], Link],
        endpoints: dict[str, PullEndpoint],
        bytes_per_token: int,
        timeout_s: float,
        deadline_s: float,
    ) -> None:
        self.at = at
        self.now = now
        self.link_between = link_between
        self.endpoints = endpoints
        self.bytes_per_token = bytes_per_token
        self.timeout_s = timeout_s
        self.deadline_s = deadline_s
        self.stats = PullStats()
        # Called with (request_id, landed_at, ok) when a pull ends on the consumer.
        self.on_pull_end: Callable[[str, float, bool], None] = lambda *_: None

    def start_pull(self, consumer: PullEndpoint, spec: RecvSpec) -> None:
        self.stats.started += 1
        self._send_request(consumer, spec, self.now() + self.deadline_s)

    def _fail(self, consumer: PullEndpoint, spec: RecvSpec) -> None:
        self.stats.failed += 1
        consumer.mark_finished_recving(spec.request_id, ok=False)
        self.on_pull_end(spec.request_id, self.now(), False)
        consumer.wake()

    def _send_request(self, consumer: PullEndpoint, spec: RecvSpec, deadline: float) -> None:
        now = self.now()
        if now >= deadline:
            self._fail(consumer, spec)
            return
        link = self.link_between(consumer.name, spec.remote_engine_id)
        arrival = link.transit(now, REQUEST_BYTES, Direction.FORWARD)
        if arrival is None:
            self.stats.retries += 1
            self.at(now + self.timeout_s, self._send_request, consumer, spec, deadline)
            return
        self.at(arrival, self._serve, consumer, spec, deadline)

    def _serve(self, consumer: PullEndpoint, spec: RecvSpec, deadline: float) -> None:
        now = self.now()
        producer = self.endpoints.get(spec.remote_engine_id)
        if producer is None or not producer.alive:
            # No answer: the consumer times out and retries until its deadline.
            self.stats.retries += 1
            self.at(now + self.timeout_s, self._send_request, consumer, spec, deadline)
            return
        producer.blocks_for_pull(spec.remote_request_id, spec.remote_block_ids, spec.num_tokens, now)
        nbytes = spec.num_tokens * self.bytes_per_token
        link = self.link_between(consumer.name, spec.remote_engine_id)
        arrival = link.transit(now, nbytes, Direction.REVERSE)
        if arrival is None:
            self.stats.retries += 1
            self.at(now + self.timeout_s, self._send_request, consumer, spec, deadline)
            return
        self.stats.bytes += nbytes
        self.at(arrival, self._land, consumer, spec)

    def _land(self, consumer: PullEndpoint, spec: RecvSpec) -> None:
        now = self.now()
        if not consumer.alive:
            return
        consumer.write_pulled_blocks(spec.request_id, spec.local_block_ids, spec.num_tokens, now)
        consumer.mark_finished_recving(spec.request_id, ok=True)
        self.stats.completed += 1
        self.on_pull_end(spec.request_id, now, True)
        consumer.wake()
        self._send_done(consumer, spec, now + self.deadline_s)

    def _send_done(self, consumer: PullEndpoint, spec: RecvSpec, deadline: float) -> None:
        now = self.now()
        if now >= deadline:
            return  # the producer is gone; its blocks go with it
        link = self.link_between(consumer.name, spec.remote_engine_id)
        arrival = link.transit(now, DONE_BYTES, Direction.FORWARD)
        if arrival is None:
            self.at(now + self.timeout_s, self._send_done, consumer, spec, deadline)
            return
        self.at(arrival, self._done_arrives, consumer, spec, deadline)

    def _done_arrives(self, consumer: PullEndpoint, spec: RecvSpec, deadline: float) -> None:
        producer = self.endpoints.get(spec.remote_engine_id)
        if producer is None or not producer.alive:
            return
        producer.mark_finished_sending(spec.remote_request_id)
        producer.wake()
