"""The proxy's routing behaviour, free of Ray and sockets (see
`cluster/ray/proxy.py` for the proxy itself): a request goes to a prefill
node with `max_tokens=1` and `do_remote_decode`, then with the returned
`kv_transfer_params` to a decode node; the decode node's tokens become
client events. Routing is round-robin or least-loaded over the live nodes,
least-loaded counting the requests outstanding at each node. Each
proxy<->node edge is a `Link` applied here, in wall time (a lost message is
retransmitted, never overtaken: the proxy's transport is TCP, as in-process).

A node's events count only for the requests routed to that node; others are
dropped (`events_rejected`). When a decode node dies, its requests go to a
live decode node, computed there from scratch (their prompt plus the tokens
the client already has), and the prefill node that holds their blocks is
told to release them; with no decode node left they fail.

A client that goes away (`abort`, the OpenAI front door): the request
finishes "abort" at once, the node that has it is told to abort it in its
engine (`AbortMessage`, on the same ordered link as its request), and a
prefill node holding its prompt is told to release it — also when the
prompt finishes after the abort (its output finds the request gone).

Client events (`cluster.client_events`), times in run seconds stamped here.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from cluster.wall.clock import RunClock
from cluster.wall.delay_line import DelayedMailbox
from connector.link import Link
from node.messages import (
    AbortMessage,
    KVEvent,
    MessageError,
    NodeEvent,
    OutputEvent,
    ProxyMessage,
    ReleaseMessage,
    RequestMessage,
    event_from_wire,
)

from ..client_events import Arrived, ClientEvent, Finished, Scheduled, Submission, Tokens
from ..router import PrefixIndex, Router
from ..spec import ClusterSpec

logger = logging.getLogger(__name__)

REQUEST_BYTES = 512
OUTPUT_BYTES = 64


@dataclass
class _Req:
    request_id: str
    prompt_len: int
    output_len: int
    priority: int
    arrival: float
    node: str = ""
    phase: str = "prefill"
    done: bool = False
    sched_sent: bool = False
    counted: bool = False  # included in `outstanding[node]`
    prefill_node: str = ""  # holds the prompt's blocks until the decode node pulls them
    delivered: int = 0  # tokens streamed to the client
    prompt_segments: tuple[tuple[int, int], ...] = ()
    ignore_eos: bool | None = None  # None: the cluster's sampler setting
    min_tokens: int = 0
    stop_token_ids: tuple[int, ...] = ()


_GONE = _Req("", 0, 0, 0, 0.0)


class ProxyRouter:
    """The proxy's behaviour, free of Ray: `send(node, wires)` carries requests
    to a node, `publish(events)` hands client events to the stream."""

    def __init__(
        self,
        spec: ClusterSpec,
        seed: int,
        clock: RunClock,
        prefill: list[str],
        decode: list[str],
        send: Callable[[str, list[ProxyMessage]], None],
        publish: Callable[[list[ClientEvent]], None],
    ) -> None:
        if not decode:
            raise ValueError("the proxy needs at least one decode node")
        self.spec = spec
        self.clock = clock
        self.send = send
        self.publish = publish
        self.prefill = list(prefill)
        self.decode = list(decode)
        self._prefill_set = set(self.prefill)
        self.dead: set[str] = set()
        self.outstanding: dict[str, int] = {n: 0 for n in self.prefill + self.decode}
        self.requests: dict[str, _Req] = {}
        self.failures: dict[str, str] = {}  # request id -> why it finished with "error"
        self.rerouted: dict[str, int] = {}
        self.events_rejected = 0
        self.requests_aborted = 0
        self._routers: dict[str, Router | None] = {}
        # Prefix-aware routing's memory per role (kept when routers are rebuilt).
        self._prefix_index: dict[str, PrefixIndex[str]] = {"prefill": PrefixIndex(), "decode": PrefixIndex()}
        self._rebuild_routers()
        links = spec.links.proxy.to_spec()
        self._to_node: dict[str, DelayedMailbox] = {}
        self._from_node: dict[str, DelayedMailbox] = {}
        for i, name in enumerate(self.prefill + self.decode):
            link = Link(links, seed=seed * 1000 + 500 + i)
            ideal = link.is_ideal
            broken = lambda name=name: self.node_died(name)  # noqa: E731
            self._to_node[name] = DelayedMailbox(
                clock,
                None if ideal else link.forward,
                lambda batch, name=name: self._deliver_to_node(name, batch),
                broken,
            )
            self._from_node[name] = DelayedMailbox(
                clock,
                None if ideal else link.reverse,
                lambda batch, name=name: self._on_node_events(name, batch),
                broken,
            )

    def _rebuild_routers(self) -> None:
        load = self.outstanding.__getitem__
        for role, names in (("prefill", self.prefill), ("decode", self.decode)):
            live = [n for n in names if n not in self.dead]
            self._routers[role] = Router(live, self.spec.routing, load, self._prefix_index[role]) if live else None

    # -- client side ------------------------------------------------------------
    def submit(self, items: list[Submission]) -> None:
        now = self.clock.now()
        events: list[ClientEvent] = []
        for item in items:
            if item.request_id in self.requests:
                raise ValueError(f"duplicate request id {item.request_id!r}")
            req = _Req(item.request_id, item.prompt_len, item.output_len, item.priority, now)
            req.prompt_segments = tuple(item.prompt_segments)
            req.ignore_eos, req.min_tokens, req.stop_token_ids = item.ignore_eos, item.min_tokens, item.stop_token_ids
            self.requests[item.request_id] = req
            events.append(Arrived(item.request_id, now))
        self.publish(events)
        for item in items:
            req = self.requests[item.request_id]
            if self.prefill:
                self._route(req, "prefill", 1, {"do_remote_decode": True})
            else:
                self._route(req, "decode", req.output_len, None)

    def _route(self, req: _Req, role: str, max_tokens: int, params: dict | None, prompt_extra: int = 0) -> None:
        router = self._routers[role]
        if router is None:
            self._release_at_prefill(req)
            self._finish(req, "error", why=f"no live {role} node")
            return
        node = router.pick(self.spec.prompt_hashes(req.request_id, req.prompt_len, req.prompt_segments))
        req.node, req.phase, req.counted = node, role, True
        self.outstanding[node] += 1
        message = RequestMessage(
            req.request_id,
            req.prompt_len + prompt_extra,
            max_tokens,
            req.arrival,
            req.priority,
            params,
            self.spec.sampler.ignore_eos if req.ignore_eos is None else req.ignore_eos,
            # A re-routed request's prompt grew by what was streamed: content of its own.
            list(req.prompt_segments) if req.prompt_segments and not prompt_extra else None,
            max(0, req.min_tokens - prompt_extra),
            list(req.stop_token_ids) or None,
        )
        self._to_node[node].put(message, REQUEST_BYTES)

    def _deliver_to_node(self, node: str, messages: list[ProxyMessage]) -> None:
        if node in self.dead:
            self.send_failed(node, [m.request_id for m in messages if isinstance(m, RequestMessage)])
            return
        # A request re-routed while its message was on the way is not sent.
        live = [
            m
            for m in messages
            if not isinstance(m, RequestMessage) or (self.requests.get(m.request_id) or _GONE).node == node
        ]
        if live:
            self.send(node, live)

    def send_failed(self, node: str, request_ids: list[str]) -> None:
        """The node could not take these requests (its actor is gone)."""
        for request_id in request_ids:
            req = self.requests.get(request_id)
            if req is not None and not req.done and req.node == node:
                self._finish(req, "error", why=f"{node} could not take it")

    # -- node side --------------------------------------------------------------
    def node_events(self, node: str, wires: list) -> None:
        """A node's events as they came off its connection (wire form)."""
        try:
            events = [event_from_wire(w) for w in wires]
        except MessageError as err:
            self.events_rejected += len(wires)
            logger.warning("proxy: bad events from %s: %s", node, err)
            return
        self._from_node[node].put(events, OUTPUT_BYTES * len(events))

    def _on_node_events(self, node: str, batches: list[list[NodeEvent]]) -> None:
        now = self.clock.now()
        out: list[ClientEvent] = []
        is_prefill = node in self._prefill_set
        for events in batches:
            for ev in events:
                req = self.requests.get(ev.request_id)
                if req is None or req.done:
                    if (
                        is_prefill
                        and type(ev) is OutputEvent
                        and ev.kv_transfer_params
                        and ev.finish_reason == "length"
                    ):
                        # A prompt finished for a request that ended meanwhile
                        # (its client went away): the prefill node need not hold it.
                        self._to_node[node].put(ReleaseMessage([ev.request_id]), REQUEST_BYTES)
                    continue
                if req.node != node:
                    # Not routed there (any more): a dead decode node's last
                    # tokens, or a node speaking of another node's request.
                    self.events_rejected += 1
                    continue
                if isinstance(ev, KVEvent):
                    out.append(ev)
                    continue
                rid, tokens, reason, params = ev.request_id, ev.new_token_ids, ev.finish_reason, ev.kv_transfer_params
                if not req.sched_sent and ev.first_scheduled_time is not None:
                    req.sched_sent = True
                    out.append(Scheduled(rid, ev.first_scheduled_time))
                if is_prefill:
                    if reason is None:
                        continue  # the prefill's own token is not streamed: decode resamples it
                    self._release(req)
                    if params and reason == "length":
                        req.prefill_node = node
                        self._route(req, "decode", req.output_len, dict(params))
                    else:
                        # A first token that is EOS ends the request at the
                        # prefill node: no handoff, the client gets that token.
                        if reason == "stop" and tokens:
                            out.append(Tokens(rid, tokens, now))
                        out.append(self._finish(req, reason or "error", publish=False))
                    continue
                if tokens:
                    req.delivered += len(tokens)
                    out.append(Tokens(rid, tokens, now))
                if reason is not None:
                    why = ""
                    if reason == "error":
                        why = f"{node}: " + (str(params.get("rejected"))[:200] if params else "finished with an error")
                    out.append(self._finish(req, reason, ev.num_preemptions, publish=False, why=why))
        self.publish(out)

    def _finish(
        self, req: _Req, reason: str, num_preemptions: int = 0, publish: bool = True, why: str = ""
    ) -> Finished:
        if reason == "error":
            self.failures[req.request_id] = why or "error"
        req.done = True
        self._release(req)
        del self.requests[req.request_id]
        event = Finished(req.request_id, reason, self.clock.now(), num_preemptions, req.node)
        if publish:
            self.publish([event])
        return event

    def _release(self, req: _Req) -> None:
        if req.counted:
            req.counted = False
            self.outstanding[req.node] -= 1

    # -- clients that go away ------------------------------------------------------
    def abort(self, request_id: str) -> bool:
        """The client went away: the request finishes "abort" now (published
        like any finish); the node that has it aborts it in its engine, a
        prefill node holding its prompt releases it. False if it is not in
        flight (finished already, or unknown)."""
        req = self.requests.get(request_id)
        if req is None or req.done:
            return False
        self.requests_aborted += 1
        if req.node and req.node not in self.dead:
            self._to_node[req.node].put(AbortMessage([request_id]), REQUEST_BYTES)
        self._release_at_prefill(req)
        self._finish(req, "abort")
        return True

    def node_died(self, node: str) -> None:
        if node in self.dead:
            return
        self.dead.add(node)
        self._rebuild_routers()
        lost = [r for r in self.requests.values() if r.node == node and not r.done]
        rerouted = 0
        for req in lost:
            self._release(req)
            if req.phase == "decode" and self._routers["decode"] is not None and req.delivered < req.output_len:
                self._reroute(req)
                rerouted += 1
            else:
                self._release_at_prefill(req)
                self._finish(req, "error", why=f"{node} is gone")
        logger.warning(
            "proxy: node %s is gone; %d request(s) there re-routed, %d failed", node, rerouted, len(lost) - rerouted
        )

    def _reroute(self, req: _Req) -> None:
        """From scratch on a live decode node: the prompt plus the tokens the
        client already has, for the rest (sampling is per position, so the
        stream continues exactly)."""
        self._release_at_prefill(req)
        self.rerouted[req.request_id] = self.rerouted.get(req.request_id, 0) + 1
        self._route(req, "decode", req.output_len - req.delivered, None, prompt_extra=req.delivered)

    def _release_at_prefill(self, req: _Req) -> None:
        node, req.prefill_node = req.prefill_node, ""
        if node and node not in self.dead:
            self._to_node[node].put(ReleaseMessage([req.request_id]), REQUEST_BYTES)

    def close(self) -> None:
        for box in list(self._to_node.values()) + list(self._from_node.values()):
            box.close()
