"""The proxy/router of the Ray runtime, in front of the prefill and decode
nodes (vLLM's disaggregated proxy, as in the in-process cluster):

1. A request from the load driver goes to a prefill node (round-robin or
   least-loaded) with `max_tokens=1` and `do_remote_decode`.
2. When the prefill node finishes it, the returned `kv_transfer_params` go
   with the request to a decode node.
3. The decode node's tokens stream back to the client (the driver) through
   `stream()`, a Ray streaming generator of event batches.

Every proxy<->node edge is a `Link` applied here, in the application: a
request leaves after the link's forward delay, a node's events are handled
after its reverse delay, in order (a lost message is resent at once: the
proxy's transport is reliable, as in-process). Least-loaded counts the
requests the proxy has outstanding at each node.

A node whose actor dies (a fault, or a crash) is noticed through a liveness
call that never returns while it lives: the requests it was prefilling fail
with finish reason "error" and it leaves the routers. Nothing waits on it.

Client events, times in run seconds stamped here:
    ("arrive", rid, t) ("sched", rid, t) ("kv", rid, "start"|"end", t, ok)
    ("tok", rid, token_ids, t) ("fin", rid, reason, t, num_preemptions)
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from dataclasses import dataclass
from typing import Callable

from cluster.ray_env import ray
from connector.link import DelayLine, Link
from decode_node.events import request_to_wire
from decode_node.wall_clock import RunClock

from .router import Router
from .spec import ClusterSpec

logger = logging.getLogger(__name__)

REQUEST_BYTES = 512
OUTPUT_BYTES = 64


class DelayedMailbox:
    """One direction of a link in wall time: items arrive in FIFO order after
    the delay line's transit, and those due together are delivered as one batch."""

    def __init__(self, clock: RunClock, line: DelayLine | None, deliver: Callable[[list], None]) -> None:
        self.clock = clock
        self.line = line
        self.deliver = deliver
        self._queue: deque[tuple[float, object]] = deque()
        self._last = 0.0
        self._wakeup = asyncio.Event()
        self._task = asyncio.ensure_future(self._run())

    def put(self, item: object, nbytes: int) -> None:
        now = self.clock.now()
        arrival = None if self.line is None else self.line.transit(now, nbytes)
        self._last = max(self._last, now if arrival is None else arrival)
        self._queue.append((self._last, item))
        self._wakeup.set()

    async def _run(self) -> None:
        queue = self._queue
        while True:
            if not queue:
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            await self.clock.sleep_until(queue[0][0])
            now = self.clock.now()
            batch = []
            while queue and queue[0][0] <= now:
                batch.append(queue.popleft()[1])
            if batch:
                try:
                    self.deliver(batch)
                except Exception:  # one bad batch must not stop the link
                    logger.exception("delivery failed")

    def close(self) -> None:
        self._task.cancel()


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


class ProxyRouter:
    """The proxy's behaviour, free of Ray: `send(node, wires)` carries requests
    to a node, `publish(events)` hands client events to the stream."""

    def __init__(self, spec: ClusterSpec, seed: int, clock: RunClock, prefill: list[str], decode: list[str],
                 send: Callable[[str, list[dict]], None], publish: Callable[[list[tuple]], None]) -> None:
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
        self._routers: dict[str, Router | None] = {}
        self._rebuild_routers()
        links = spec.links.proxy.to_spec()
        self._to_node: dict[str, DelayedMailbox] = {}
        self._from_node: dict[str, DelayedMailbox] = {}
        for i, name in enumerate(self.prefill + self.decode):
            link = Link(links, seed=seed * 1000 + 500 + i)
            ideal = link.is_ideal
            self._to_node[name] = DelayedMailbox(clock, None if ideal else link.forward,
                                                 lambda batch, name=name: self._deliver_to_node(name, batch))
            self._from_node[name] = DelayedMailbox(clock, None if ideal else link.reverse,
                                                   lambda batch, name=name: self._on_node_events(name, batch))

    def _rebuild_routers(self) -> None:
        load = self.outstanding.__getitem__
        for role, names in (("prefill", self.prefill), ("decode", self.decode)):
            live = [n for n in names if n not in self.dead]
            self._routers[role] = Router(live, self.spec.routing, load) if live else None

    # -- client side ------------------------------------------------------------
    def submit(self, items: list[tuple[str, int, int, int]]) -> None:
        now = self.clock.now()
        events = []
        for request_id, prompt_len, output_len, priority in items:
            if request_id in self.requests:
                raise ValueError(f"duplicate request id {request_id!r}")
            req = _Req(request_id, prompt_len, output_len, priority, now)
            self.requests[request_id] = req
            events.append(("arrive", request_id, now))
        self.publish(events)
        for request_id, *_ in items:
            req = self.requests[request_id]
            if self.prefill:
                self._route(req, "prefill", 1, {"do_remote_decode": True})
            else:
                self._route(req, "decode", req.output_len, None)

    def _route(self, req: _Req, role: str, max_tokens: int, params: dict | None) -> None:
        router = self._routers[role]
        if router is None:
            self._finish(req, "error")
            return
        node = router.pick()
        req.node, req.phase, req.counted = node, role, True
        self.outstanding[node] += 1
        wire = request_to_wire(req.request_id, req.prompt_len, max_tokens, req.arrival, req.priority, params)
        self._to_node[node].put(wire, REQUEST_BYTES)

    def _deliver_to_node(self, node: str, wires: list[dict]) -> None:
        if node in self.dead:
            for wire in wires:
                self.send_failed(node, [wire["request_id"]])
            return
        self.send(node, wires)

    def send_failed(self, node: str, request_ids: list[str]) -> None:
        """The node could not take these requests (its actor is gone)."""
        for request_id in request_ids:
            req = self.requests.get(request_id)
            if req is not None and not req.done and req.node == node:
                self._finish(req, "error")

    # -- node side --------------------------------------------------------------
    def node_events(self, node: str, events: list[tuple]) -> None:
        self._from_node[node].put(events, OUTPUT_BYTES * len(events))

    def _on_node_events(self, node: str, batches: list[list[tuple]]) -> None:
        now = self.clock.now()
        out: list[tuple] = []
        is_prefill = node in self._prefill_set
        for events in batches:
            for ev in events:
                req = self.requests.get(ev[1])
                if req is None or req.done:
                    continue
                if ev[0] == "kv":
                    out.append(ev)
                    continue
                _, rid, tokens, reason, params, num_preemptions, first_sched = ev
                if not req.sched_sent and first_sched is not None:
                    req.sched_sent = True
                    out.append(("sched", rid, first_sched))
                if is_prefill:
                    if reason is None:
                        continue  # the prefill's own token is not streamed: decode resamples it
                    self._release(req)
                    if params and reason == "length":
                        self._route(req, "decode", req.output_len, dict(params))
                    else:
                        out.append(self._finish(req, reason or "error", publish=False))
                    continue
                if tokens:
                    out.append(("tok", rid, tokens, now))
                if reason is not None:
                    out.append(self._finish(req, reason, num_preemptions, publish=False))
        self.publish(out)

    def _finish(self, req: _Req, reason: str, num_preemptions: int = 0, publish: bool = True) -> tuple:
        req.done = True
        self._release(req)
        del self.requests[req.request_id]
        event = ("fin", req.request_id, reason, self.clock.now(), num_preemptions)
        if publish:
            self.publish([event])
        return event

    def _release(self, req: _Req) -> None:
        if req.counted:
            req.counted = False
            self.outstanding[req.node] -= 1

    def node_died(self, node: str) -> None:
        if node in self.dead:
            return
        self.dead.add(node)
        self._rebuild_routers()
        lost = [r for r in self.requests.values() if r.node == node and not r.done]
        for req in lost:
            self._finish(req, "error")
        logger.warning("proxy: node %s is gone; %d request(s) there failed", node, len(lost))

    def close(self) -> None:
        for box in list(self._to_node.values()) + list(self._from_node.values()):
            box.close()


@ray.remote(num_cpus=0)
class ProxyActor:
    """Thin Ray shell around `ProxyRouter`, plus the client stream."""

    def __init__(self) -> None:
        self.router: ProxyRouter | None = None
        self.handles: dict = {}
        self._events: list[tuple] = []
        self._published = asyncio.Event()
        self._closed = False
        self._watches: list[asyncio.Future] = []
        self.messages_in = 0

    async def begin(self, spec_json: str, seed: int, start_wall: float, prefill: dict, decode: dict) -> None:
        spec = ClusterSpec.model_validate_json(spec_json)
        self.handles = {**prefill, **decode}
        self.router = ProxyRouter(spec, seed, RunClock.from_wall_start(start_wall), list(prefill), list(decode),
                                  self._send, self._publish)
        for name, handle in self.handles.items():
            self._watches.append(asyncio.ensure_future(self._watch(name, handle)))

    async def _watch(self, name: str, handle) -> None:
        try:
            await handle.wait_stopped.remote()
        except asyncio.CancelledError:
            raise
        except Exception:  # ActorDiedError and kin: the node is gone
            pass
        if not self._closed and self.router is not None:
            self.router.node_died(name)

    def _send(self, node: str, wires: list[dict]) -> None:
        ref = self.handles[node].add_requests.remote(wires)
        asyncio.ensure_future(self._check_send(node, ref, [w["request_id"] for w in wires]))

    async def _check_send(self, node: str, ref, request_ids: list[str]) -> None:
        try:
            await ref
        except Exception as err:
            logger.warning("proxy: %s did not take %d request(s): %s", node, len(request_ids), type(err).__name__)
            self.router.send_failed(node, request_ids)

    def _publish(self, events: list[tuple]) -> None:
        if events:
            self._events.extend(events)
            self._published.set()

    # -- called by the driver and the nodes ----------------------------------------
    async def submit(self, items: list[tuple]) -> None:
        self.router.submit(items)

    async def deliver(self, node: str, events: list[tuple]) -> None:
        # No await before this line: calls from one node are handled in order.
        self.messages_in += 1
        self.router.node_events(node, events)

    async def stream(self):
        """Client events in batches, until `close_stream`."""
        while True:
            await self._published.wait()
            self._published.clear()
            if self._events:
                batch, self._events = self._events, []
                yield batch
            if self._closed and not self._events:
                return

    async def close_stream(self) -> dict:
        self._closed = True
        self._published.set()
        for watch in self._watches:
            watch.cancel()
        if self.router is not None:
            self.router.close()
        return {"proxy_messages_in": self.messages_in, "outstanding": dict(self.router.outstanding) if self.router else {}}
