"""Hosts one node role on asyncio, on the wall clock: the role class is the
very one the in-process runtime runs (`prefill_node.PrefillNode`,
`decode_node.DecodeNode`); this only gives it wall-clock ports and owns
their lifetimes:

- clock: `WallClock` (run seconds since the run's shared start);
- executor: `WallExecutor` over the pipeline stages (in this process, or
  the stage workers' processes when a `StepRunner` is given);
- outbox and requests: the `ProxyChannel` to the proxy;
- KV: a producer serves its held blocks on a gRPC `KVHandoffServer`; a
  consumer pulls through a `GrpcKVTransport` (the KV link's impairments are
  gRPC interceptors on its channels).

Ray's actor shells (`cluster.ray.actors`) wrap a host and only forward.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from connector.grpc import GrpcKVTransport, KVHandoffServer
from connector.grpc.security import KVSecurity
from connector.link import Link, LinkSpec
from decode_node.node import DecodeNode
from engine.node_core import NodeSpec
from engine.records import StepRecord
from node.messages import RequestMessage
from node.ports import NodePorts
from node.role import NodeReport
from node.settings import NodeSettings
from prefill_node.node import PrefillNode

from .auth import derive_key
from .clock import WallClock
from .executors import LocalPipeline, StepRunner, WallExecutor
from .proxy_channel import ProxyChannel


@dataclass(frozen=True)
class WallNodeSettings:
    """A node's settings plus what only the wall-clock runtime has: real links and addresses."""

    node: NodeSettings
    # Between pipeline stages, and on the KV handoff (the consumer's gRPC
    # channels). None or an ideal spec: no impairment.
    stage_link: LinkSpec | None = None
    kv_link: LinkSpec | None = None
    # Seeds every link this node opens (channels in the order they are opened).
    link_seed: int = 0
    # The run's shared secret (docs/security.md): authenticates the proxy
    # channel, the stage links and (as a derived token) every KV call. None:
    # no authentication (tests that build nodes by hand). The KV tickets'
    # key is `node.ticket_key` (the Ray driver derives it from this secret).
    secret: bytes | None = field(default=None, repr=False)
    # TLS of the KV handoff (certificates; the token comes from `secret`),
    # and of the framed-TCP links (proxy channel, stage links) with the same
    # certificates.
    kv_tls: KVSecurity | None = None

    def kv_security(self) -> KVSecurity:
        token = None if self.secret is None else derive_key(self.secret, "kv-grpc").hex()
        return replace(self.kv_tls or KVSecurity(), auth_token=token)


class WallNodeHost:
    def __init__(
        self,
        role: str,
        spec: NodeSpec,
        settings: WallNodeSettings,
        runner: StepRunner | None = None,
        on_step: Callable[[StepRecord], None] | None = None,
        kv_host: str = "127.0.0.1",
    ) -> None:
        """`kv_host`: the address a producer's KV server binds and advertises,
        the machine the host runs on (known there only: a Ray actor asks Ray)."""
        if role not in ("prefill", "decode"):
            raise ValueError(f"role={role!r} is invalid; allowed: 'prefill' or 'decode'")
        self.role = role
        self.name = spec.name
        self.settings = settings
        self.clock = WallClock()
        if runner is None:
            pp = spec.pipeline_parallel_size
            link = settings.stage_link
            stage_link = Link(link, seed=settings.link_seed) if pp > 1 and link is not None else None
            runner = LocalPipeline(pp, self.clock, stage_link)
        self.executor = WallExecutor(runner)
        # Its KV tickets' key comes with its settings (the driver derives it from the run's secret).
        node_settings = settings.node
        on_release = self._on_release if role == "prefill" else None
        self.channel = ProxyChannel(
            spec.name, self._on_requests, on_release, settings.secret, self._on_abort, tls=settings.kv_tls
        )
        ports = NodePorts(self.clock, self.executor, self.channel.emit)
        security = settings.kv_security()
        self.server: KVHandoffServer | None = None
        self.kv: GrpcKVTransport | None = None
        self.node: PrefillNode | DecodeNode
        if role == "prefill":
            self.node = PrefillNode(spec, node_settings, ports, on_step)
            self.server = KVHandoffServer(self.node, on_done=self.node.on_done_report, host=kv_host, security=security)
        else:
            self.kv = GrpcKVTransport(
                link=settings.kv_link,
                link_seed=settings.link_seed,
                link_epoch=self.clock.run_clock.epoch,
                consumer_id=spec.name,
                security=security,
                timing=node_settings.kv_timing,
                time_scale=node_settings.time_scale,
            )
            self.node = DecodeNode(spec, node_settings, ports, self.kv, on_step)
        self.node.loop.on_failure = self._on_failure

    def _on_failure(self, reason: str) -> None:
        """The engine loop stopped on a failure (a broken stage link): close
        the proxy connection, so the proxy takes this node out of the run and
        re-routes or fails its requests, as for a node that died."""
        self._failure_close = asyncio.get_running_loop().create_task(self.channel.close())

    async def start(self) -> str:
        """Bind the KV server (a producer); its address goes into every `kv_transfer_params`."""
        if self.server is None:
            return ""
        address = await self.server.start()
        assert isinstance(self.node, PrefillNode)  # only a prefill node has a KV server
        self.node.set_address(address)
        return address

    async def begin(self, start_wall: float, proxy_address: tuple[str, int]) -> None:
        """Start the run clock, reach the stages and the proxy; the node takes requests from then on."""
        self.clock.start(start_wall)
        if self.kv is not None:
            # Outage windows of the KV link are in run seconds.
            self.kv.set_link_epoch(self.clock.run_clock.epoch)
        await self.executor.connect()
        await self.channel.connect(*proxy_address)

    def _on_requests(self, messages: list[RequestMessage]) -> None:
        self.node.on_requests(messages)

    def _on_release(self, request_ids: list[str]) -> None:
        if isinstance(self.node, PrefillNode):
            self.node.release(request_ids)

    def _on_abort(self, request_ids: list[str]) -> None:
        self.node.abort(request_ids)

    def busy(self) -> bool:
        return self.node.busy()

    async def quiesce(self, timeout_s: float) -> bool:
        """Wait until nothing is scheduled, in flight, pulled or held; False on timeout."""
        deadline = asyncio.get_running_loop().time() + timeout_s
        while self.node.busy():
            if asyncio.get_running_loop().time() >= deadline:
                return False
            self.node.loop.wake()
            await asyncio.sleep(0.01)
        return True

    def report(self) -> NodeReport:
        report = self.node.report()
        report.counters["node_messages_sent"] = self.channel.messages_sent
        return report

    async def close(self) -> None:
        self.node.kill()
        if self.server is not None:
            await self.server.stop(grace=0.2)
        if self.kv is not None:
            await self.kv.close()
        await self.executor.close()
        await self.channel.close()
