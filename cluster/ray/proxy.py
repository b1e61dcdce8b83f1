"""The proxy of the Ray runtime, in front of the prefill and decode nodes:
the proxy role (`proxy.Proxy`, the very class the in-process runtime
drives) on wall-clock links (`cluster/wall/proxy_links.py`).

`ProxyServer` is the plain part: nodes connect to it over framed TCP
(`cluster/wall/proxy_channel.py`) — requests go out and events come in, in
order, on one connection per node — and a node whose connection closes is
gone: the requests it was prefilling fail with finish reason "error", those
it was decoding go to another decode node, and it leaves the routers. With a
run secret, a connection must pass the challenge (`cluster/wall/auth.py`)
under the name it then says hello with; a node already connected is never
replaced by a second connection. `ProxyActor` is its Ray shell: it adds a Ray liveness
watch per node (for a node that dies before it connects) and streams the
client events to the driver as a Ray streaming generator — or, serving
(`serve_front`), hands them to a front door built inside this actor (the
OpenAI HTTP server of `disagg-sim serve`, given as a factory: `cluster` does
not import `bench`), which submits and aborts on `server` directly.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Protocol, TypedDict

from cluster.ray.env import ray
from cluster.wall.auth import AuthError, challenge
from cluster.wall.clock import RunClock
from cluster.wall.frames import FrameConnection, FrameError, serve
from cluster.wall.proxy_links import wall_proxy
from connector.grpc.security import KVSecurity
from node.messages import ProxyMessage, RequestMessage
from proxy.client import ClientEvent, Submission

from ..spec import ClusterSpec
from .handles import ActorInfo, ActorRef

logger = logging.getLogger(__name__)

# The driver gets client events at most this often (they are stamped when
# they happen; batching only saves the driver's CPU).
STREAM_BATCH_S = 0.02


class ProxyServer:
    def __init__(
        self,
        spec: ClusterSpec,
        seed: int,
        clock: RunClock,
        prefill: list[str],
        decode: list[str],
        publish: Callable[[list[ClientEvent]], None],
        secret: bytes | None = None,
        tls: KVSecurity | None = None,
    ) -> None:
        self.names = set(prefill) | set(decode)
        self.tls = tls  # the run's TLS (cluster/wall/tls.py), or plain TCP
        self.clock = clock
        self.proxy, self.links = wall_proxy(
            spec.proxy_settings(prefill, decode, time_scale=spec.time_scale),
            spec.links.proxy.to_spec(),
            seed,
            clock,
            self._send,
            publish,
        )
        self.secret = secret
        self.conns: dict[str, FrameConnection] = {}
        self._unsent: dict[str, list[list[ProxyMessage]]] = {}
        self.connections_refused = 0
        # Killed nodes whose fresh process may say hello again (a restart fault).
        self.restarting: set[str] = set()
        self._server: asyncio.Server | None = None
        self.closing = False
        self.messages_in = 0

    async def start(self, host: str) -> tuple[str, int]:
        self._server, port = await serve(host, self._on_connection, tls=self.tls)
        return host, port

    def submit(self, items: list[Submission]) -> None:
        self.proxy.submit(items)

    def abort(self, request_id: str) -> bool:
        return self.proxy.abort(request_id)

    def node_gone(self, name: str) -> None:
        if not self.closing:
            self.proxy.node_died(name)

    def expect_restart(self, name: str) -> bool:
        """A killed node's fresh process will connect under its name: accepted
        once, and routed to from then on (`Proxy.node_restarted`). False
        while the old one is not known dead yet (its connection still open)."""
        if name in self.names and name in self.proxy.dead and name not in self.conns:
            self.restarting.add(name)
            return True
        return False

    async def _on_connection(self, conn: FrameConnection) -> None:
        try:
            who = await challenge(conn, self.secret) if self.secret is not None else None
            hello = await conn.recv(max_bytes=1024)
        except (AuthError, FrameError) as err:
            self._refuse(f"handshake failed: {err}")
            return
        if not (isinstance(hello, list) and len(hello) == 2 and hello[0] == "hello" and hello[1] in self.names):
            self._refuse("unexpected first frame")
            return
        name = hello[1]
        if who is not None and who != name:
            self._refuse(f"authenticated as {who!r} but said hello as another node")
            return
        if name in self.conns or (name in self.proxy.dead and name not in self.restarting):
            self._refuse(f"{name} is already connected (or gone)")
            return
        self.conns[name] = conn
        if name in self.restarting:
            # A fresh process: what was queued for the dead one is not its own.
            self.restarting.discard(name)
            self._unsent.pop(name, None)
            self.proxy.node_restarted(name)
            logger.warning("proxy: %s is back (restarted)", name)
        for messages in self._unsent.pop(name, []):
            self._send(name, messages)
        try:
            while (frame := await conn.recv()) is not None:
                self.messages_in += 1
                if isinstance(frame, list) and len(frame) == 2 and frame[0] == "ev" and isinstance(frame[1], list):
                    self.links.node_events(name, frame[1])
                else:
                    logger.warning("proxy: unexpected frame from %s: %.80r", name, frame)
        except FrameError as err:
            logger.warning("proxy: %s broke the framing: %s", name, err)
        if self.conns.get(name) is conn:
            del self.conns[name]  # (a restarted node connects again under its name)
            self.node_gone(name)  # the connection closed: the node's process is gone (or stopping)

    def _refuse(self, why: str) -> None:
        self.connections_refused += 1
        logger.warning("proxy: refused a connection: %s", why)

    def _send(self, node: str, messages: list[ProxyMessage]) -> None:
        conn = self.conns.get(node)
        if conn is None:
            self._unsent.setdefault(node, []).append(messages)  # not connected yet
        elif not conn.send(["req", [m.to_wire() for m in messages]]):
            self.proxy.send_failed(node, [m.request_id for m in messages if isinstance(m, RequestMessage)])

    async def close(self) -> None:
        self.closing = True
        self.links.close()
        if self._server is not None:
            self._server.close()
        for conn in list(self.conns.values()):
            await conn.close()


class FrontDoor(Protocol):
    """What a front door built in the proxy actor offers (bench's `RayFront`)."""

    port: int

    async def query(self, name: str, *args: Any) -> Any: ...

    async def close(self) -> None: ...


# (the proxy actor, *arguments; `RayServing` passes the node actors by name first) -> a
# started front door, which sets the actor's `on_events` to take the client events.
FrontFactory = Callable[..., Awaitable[FrontDoor]]


class ProxyStats(TypedDict, total=False):
    """What the proxy actor reports at the end of a run (into the results' `extra`);
    all but `proxy_cpu_s` only if it began routing."""

    proxy_cpu_s: float
    proxy_messages_in: int
    outstanding: dict[str, int]  # node -> requests the proxy still counts there
    routed: dict[str, int]  # node -> requests sent there
    failures: dict[str, str]  # request id -> why it finished with "error"
    rerouted: dict[str, int]  # request id -> times re-routed
    events_rejected: int
    connections_refused: int


@ray.remote(num_cpus=0)
class ProxyActor:
    def __init__(self) -> None:
        self.server: ProxyServer | None = None
        self._events: list[ClientEvent] = []
        self._published = asyncio.Event()
        self._closed = False
        self._watches: list[asyncio.Future[None]] = []
        self._current: dict[str, ActorRef] = {}  # each node's live actor (a restart replaces it)
        # Serving: client events go here instead of the driver's stream.
        self.on_events: Callable[[list[ClientEvent]], None] | None = None
        self.front: FrontDoor | None = None

    async def ready(self) -> ActorInfo:
        return {"name": "proxy", "ray_node_id": ray.get_runtime_context().get_node_id()}

    def _server(self) -> ProxyServer:
        if self.server is None:
            raise RuntimeError("the proxy actor has not begun (call begin first)")
        return self.server

    async def begin(
        self,
        spec_json: str,
        seed: int,
        start_wall: float,
        prefill: dict[str, ActorRef],
        decode: dict[str, ActorRef],
        secret: bytes | None = None,
        tls: KVSecurity | None = None,
    ) -> tuple[str, int]:
        """Start routing; returns the address the nodes connect to."""
        spec = ClusterSpec.model_validate_json(spec_json)
        self.server = ProxyServer(
            spec, seed, RunClock.from_wall_start(start_wall), list(prefill), list(decode), self._publish, secret, tls
        )
        address = await self.server.start(ray.util.get_node_ip_address())
        for name, handle in {**prefill, **decode}.items():
            self._watches.append(asyncio.ensure_future(self._watch(name, handle)))
        return address

    async def _watch(self, name: str, handle: ActorRef) -> None:
        self._current[name] = handle
        try:
            await handle.wait_stopped.remote()
        except asyncio.CancelledError:
            raise
        except Exception:  # ActorDiedError and kin: the node is gone
            pass
        if not self._closed and self._current.get(name) is handle:
            self._server().node_gone(name)

    async def node_restarting(self, name: str, handle: ActorRef) -> bool:
        """A killed node's fresh actor (`run_ray`'s restart fault): its hello will
        be accepted, and its death watched as the first one's was. False
        while the proxy has not yet seen the old one go (ask again)."""
        if not self._server().expect_restart(name):
            return False
        self._current[name] = handle  # the old actor's watch no longer speaks for the node
        self._watches.append(asyncio.ensure_future(self._watch(name, handle)))
        return True

    def _publish(self, events: list[ClientEvent]) -> None:
        if events and self.on_events is not None:
            self.on_events(events)
        elif events:
            self._events.extend(events)
            self._published.set()

    async def submit(self, items: list[Submission]) -> None:
        self._server().submit(items)

    async def stream(self) -> AsyncIterator[list[ClientEvent]]:
        """Client events in batches, until `close_stream`."""
        while True:
            await self._published.wait()
            if not self._closed:
                await asyncio.sleep(STREAM_BATCH_S)
            self._published.clear()
            if self._events:
                batch, self._events = self._events, []
                yield batch
            if self._closed and not self._events:
                return

    # -- serving -------------------------------------------------------------------
    async def serve_front(self, factory: FrontFactory, *args: Any) -> int:
        """Build the front door here (after `begin`); returns the port it listens on."""
        if self.server is None:
            raise RuntimeError("serve_front: call begin first")
        self.front = await factory(self, *args)
        return self.front.port

    async def front_query(self, name: str, *args: Any) -> Any:
        """A question for the front door (its state, for tests and the CLI)."""
        if self.front is None:
            raise RuntimeError("front_query: no front door is serving")
        return await self.front.query(name, *args)

    async def stop_front(self) -> None:
        front, self.front = self.front, None
        if front is not None:
            await front.close()
        self.on_events = None

    async def close_stream(self) -> ProxyStats:
        self._closed = True
        self._published.set()
        for watch in self._watches:
            watch.cancel()
        stats: ProxyStats = {"proxy_cpu_s": time.process_time()}
        if self.server is not None:
            await self.server.close()
            router = self.server.proxy
            stats.update(
                {
                    "proxy_messages_in": self.server.messages_in,
                    "outstanding": dict(router.outstanding),
                    "routed": dict(router.routed),
                    "failures": dict(router.failures),
                    "rerouted": dict(router.rerouted),
                    "events_rejected": router.events_rejected,
                    "connections_refused": self.server.connections_refused,
                }
            )
        return stats
