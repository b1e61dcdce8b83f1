"""The proxy's ports on the virtual clock: its connections to the nodes.

Each proxy <-> node connection is TCP (`ReliableLine`: loss costs
retransmissions, never order) over the scenario's proxy link. Messages to a
node land after their transit and go to the node if the proxy still sends
them (`Proxy.deliverable`); a node's events land at the proxy after theirs.
A connection whose outage outlasts TCP's retransmissions breaks: the node is
gone to the run (`on_broken`).

The steady-decode paths' outputs take the bulk-token interface: a
`SteadyTokens` batch, and a fast-forward's steps at once (`steady_outputs`),
reach `Proxy.on_steady_tokens` with the node's first scheduled times."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import cast

from connector.link import Link, ReliableLine
from engine.outputs import SteadyTokens
from node.messages import AbortMessage, NodeEvent, OutputEvent, ProxyMessage, RequestMessage
from node.role import NodeRole
from prefill_node.node import PrefillNode
from proxy.proxy import Proxy

from .clock import EventLoop

REQUEST_BYTES = 512
OUTPUT_BYTES = 64


class InProcProxyLinks:
    def __init__(self, loop: EventLoop, nodes: dict[str, NodeRole], on_broken: Callable[[str], None]) -> None:
        self.loop = loop
        self.nodes = nodes  # by name: the live process of each (a restart replaces it)
        self.on_broken = on_broken
        self.proxy: Proxy | None = None  # set once the proxy exists (it takes `send` as a port)
        self._to_node: dict[str, ReliableLine] = {}
        self._from_node: dict[str, ReliableLine] = {}

    def connect(self, name: str, link: Link) -> None:
        self._to_node[name] = ReliableLine(link.forward)
        self._from_node[name] = ReliableLine(link.reverse)

    def ideal_from(self, name: str) -> bool:
        return self._from_node[name].line.is_ideal

    # -- proxy -> node ------------------------------------------------------------------
    def send(self, name: str, message: ProxyMessage) -> None:
        """The proxy's `send` port."""
        arrival = self._to_node[name].transit(self.loop.now(), REQUEST_BYTES)
        if arrival is None:  # the connection broke (an outage outlasted TCP's retransmissions)
            self.loop.call_soon(self.on_broken, name)
            return
        self.loop.at(arrival, self._deliver, name, message)

    def _deliver(self, name: str, message: ProxyMessage) -> None:
        assert self.proxy is not None
        for m in self.proxy.deliverable(name, [message]):
            node = self.nodes[name]
            if isinstance(m, RequestMessage):
                node.on_requests([m])
            elif isinstance(m, AbortMessage):
                node.abort(m.request_ids)
            elif isinstance(node, PrefillNode):  # a release: only prefill nodes hold prompts for others
                node.release(m.request_ids)

    # -- node -> proxy ------------------------------------------------------------------
    def from_node(self, name: str, events: Sequence[NodeEvent | SteadyTokens]) -> None:
        """A node's outbox (`NodePorts.emit`); an in-process node's may lead
        with a `SteadyTokens` (node/role.py)."""
        n = len(events)
        first = events[0] if events else None
        if isinstance(first, SteadyTokens):  # one output per request it names
            n += len(first.request_ids) - 1
        arrival = self._from_node[name].transit(self.loop.now(), OUTPUT_BYTES * n)
        if arrival is None:
            self.loop.call_soon(self.on_broken, name)
            return
        self.loop.at(arrival, self._receive, self.nodes[name], events)

    def _receive(self, node: NodeRole, events: Sequence[NodeEvent | SteadyTokens]) -> None:
        assert self.proxy is not None
        first = events[0] if events else None
        if isinstance(first, SteadyTokens):
            events = events[1:]
            # The events after it are of the same batch, for the API server's streaming.
            extra = sum(len(ev.new_token_ids) for ev in events if type(ev) is OutputEvent)
            self.proxy.on_steady_tokens(
                node.name,
                first.request_ids,
                [self.loop.now()],
                None,
                node.core.first_scheduled_time,
                {0: extra} if extra else None,
            )
        if events:
            # A SteadyTokens only ever leads a batch (node/role.py): the rest are events.
            self.proxy.on_node_events(node.name, cast(list[NodeEvent], events))

    def steady_outputs(
        self,
        node: NodeRole,
        ids: list[str],
        ends: list[float],
        sizes: list[int],
        finished: dict[int, list[OutputEvent]],
    ) -> None:
        """What `from_node` and `_receive` do for the outputs of forwarded
        steps (fast_forward.py): one link transit per step at its end
        (`sizes`: its outputs), the requests' tokens (one per step until each
        finishes), and each step's finishing outputs (`finished`, by step)
        when the step ends. Tokens reach the proxy at the end of the first
        step, before any finish (its receipt of the outputs before these is
        due now)."""
        line = self._from_node[node.name]
        arrivals = line.transit_all(ends, [OUTPUT_BYTES * n for n in sizes])  # ideal: arrival == t
        assert arrivals == ends, "the fast-forward runs only over an ideal proxy link"
        # A request finishing in these steps gets its last token with its finish.
        finishing = {ev.request_id: j - 1 for j, events in finished.items() for ev in events}
        event_tokens = {j - 1: sum(len(ev.new_token_ids) for ev in events) for j, events in finished.items()}
        self.loop.at(ends[0], self._receive_steady, node, ids, ends, finishing or None, event_tokens or None)
        for j, events in finished.items():
            self.loop.at(ends[j - 1], self._receive, node, events)

    def _receive_steady(
        self,
        node: NodeRole,
        ids: list[str],
        times: list[float],
        finishing: dict[str, int] | None,
        event_tokens: dict[int, int] | None,
    ) -> None:
        assert self.proxy is not None
        self.proxy.on_steady_tokens(node.name, ids, times, finishing, node.core.first_scheduled_time, event_tokens)
