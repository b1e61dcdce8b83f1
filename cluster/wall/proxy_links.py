"""The proxy's ports on the wall clock (the Ray proxy actor's): one impaired
link each way per node, applied in the application (`DelayedMailbox`: TCP,
so loss shows up as delay and never reorders, as in-process). Messages to a
node go out through `send_to_node` once they have crossed the link and the
proxy still sends them (`Proxy.deliverable`); a node's events (wire form,
as they came off its connection) reach the proxy after theirs. A link whose
outage outlasts the retransmissions breaks: the node is gone to the run."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from functools import partial

from connector.link import Link, LinkSpec
from node.messages import MessageError, NodeEvent, ProxyMessage, event_from_wire
from proxy.client import ClientEvent, EventPublisher
from proxy.ports import ProxyPorts, ProxySettings
from proxy.proxy import Proxy

from .clock import RunClock
from .delay_line import DelayedMailbox

logger = logging.getLogger(__name__)

REQUEST_BYTES = 512
OUTPUT_BYTES = 64


class WallProxyLinks:
    def __init__(
        self,
        clock: RunClock,
        names: list[str],
        link_spec: LinkSpec,
        seed: int,
        send_to_node: Callable[[str, list[ProxyMessage]], None],
    ) -> None:
        self.send_to_node = send_to_node
        self.proxy: Proxy | None = None  # set once the proxy exists (it takes `send` as a port)
        self._to_node: dict[str, DelayedMailbox[ProxyMessage]] = {}
        self._from_node: dict[str, DelayedMailbox[list[NodeEvent]]] = {}
        for i, name in enumerate(names):
            link = Link(link_spec, seed=seed * 1000 + 500 + i)
            ideal = link.is_ideal
            broken = partial(self._broken, name)
            self._to_node[name] = DelayedMailbox(
                clock, None if ideal else link.forward, partial(self._at_node, name), broken
            )
            self._from_node[name] = DelayedMailbox(
                clock, None if ideal else link.reverse, partial(self._at_proxy, name), broken
            )

    def _broken(self, name: str) -> None:
        assert self.proxy is not None
        self.proxy.node_died(name, "lost its proxy connection")

    def send(self, name: str, message: ProxyMessage) -> None:
        """The proxy's `send` port."""
        self._to_node[name].put(message, REQUEST_BYTES)

    def _at_node(self, name: str, messages: list[ProxyMessage]) -> None:
        assert self.proxy is not None
        live = self.proxy.deliverable(name, messages)
        if live:
            self.send_to_node(name, live)

    def node_events(self, name: str, wires: list[object]) -> None:
        """A node's events as they came off its connection (wire form, checked here)."""
        assert self.proxy is not None
        try:
            events = [event_from_wire(w) for w in wires]
        except MessageError as err:
            self.proxy.events_rejected += len(wires)
            logger.warning("proxy: bad events from %s: %s", name, err)
            return
        self._from_node[name].put(events, OUTPUT_BYTES * len(events))

    def _at_proxy(self, name: str, batches: list[list[NodeEvent]]) -> None:
        assert self.proxy is not None
        for events in batches:
            self.proxy.on_node_events(name, events)

    def close(self) -> None:
        for box in list(self._to_node.values()) + list(self._from_node.values()):
            box.close()


def wall_proxy(
    settings: ProxySettings,
    link_spec: LinkSpec,
    seed: int,
    clock: RunClock,
    send_to_node: Callable[[str, list[ProxyMessage]], None],
    publish: Callable[[list[ClientEvent]], None],
) -> tuple[Proxy, WallProxyLinks]:
    """The proxy role on wall-clock links: its client events go to `publish`;
    its timeline's legs (run seconds: `ClusterSpec.proxy_settings(time_scale=...)`)
    are timers on the running event loop."""
    links = WallProxyLinks(clock, [*settings.prefill, *settings.decode], link_spec, seed, send_to_node)

    def call_later(delay: float, fn: Callable[[], None]) -> None:
        asyncio.get_running_loop().call_later(delay, fn)

    proxy = Proxy(settings, ProxyPorts(clock.now, links.send, EventPublisher(publish), call_later=call_later))
    links.proxy = proxy
    return proxy, links
