"""The producer node: an engine core in `kv_producer` role whose finished
prompts keep their blocks until the consumer has pulled them.

- It serves those blocks over gRPC (`KVHandoffServer` around a
  `HeldBlockSource`), and turns each consumer's `ReportDone` into
  `finished_sending`, which frees the blocks through the scheduler's own
  path on the next step.
- A held request whose consumer never reports is released after
  `kv_hold_timeout_s` (vLLM's NIXL connector aborts such requests too), so a
  lost report cannot leak blocks.
- Its steps run on a `LocalPipelineExecutor` (the prefill side has no stage
  workers).

A plain class: the Ray actor shell in `cluster/ray_actors.py` only forwards.
"""

from __future__ import annotations

import asyncio
from connector.grpc_server import KVHandoffServer
from connector.link import Link
from decode_node.engine_loop import EngineLoop, LocalPipelineExecutor
from decode_node.events import Outbox, output_events
from decode_node.proxy_intake import ProxyIntakeMixin
from decode_node.proxy_channel import ProxyChannel
from decode_node.settings import WallNodeSettings
from decode_node.wall_clock import RunClock
from engine.node_core import NodeCore, NodeSpec
from engine.outputs import EngineCoreOutput

from .block_source import HeldBlockSource


class PrefillNode(ProxyIntakeMixin):
    role = "prefill"

    def __init__(self, spec: NodeSpec, settings: WallNodeSettings) -> None:
        if spec.kv_role not in ("kv_producer", "kv_both"):
            raise ValueError(f"{spec.name}: a prefill node needs kv_role 'kv_producer' or 'kv_both', got {spec.kv_role!r}")
        self.name = spec.name
        self.core = NodeCore(spec)
        self.settings = settings
        self.clock = RunClock.starting_now()
        self.source = HeldBlockSource(self.core, settings.bytes_per_token, lambda: self.clock.now())
        self.server = KVHandoffServer(self.source, on_done=self._on_done, host=settings.kv_host)
        self.loop: EngineLoop | None = None
        self.outbox: Outbox | None = None
        self.channel: ProxyChannel | None = None
        # Request id -> run time its blocks began to be held for a pull.
        self._held: dict[str, float] = {}
        self.done_reports = 0
        self.failed_done_reports = 0
        self.late_done_reports = 0
        self.hold_timeouts = 0

    @property
    def address(self) -> str:
        return self.server.address

    async def start(self) -> str:
        """Bind the KV server; its address goes into every `kv_transfer_params`."""
        address = await self.server.start()
        self.core.connector.engine_address = address
        return address

    async def begin(self, start_wall: float, proxy_address: tuple[str, int]) -> None:
        """Start the run clock, connect to the proxy and start the engine loop."""
        self.clock = self.settings.clock(start_wall)
        pp = self.core.vllm_config.parallel_config.pipeline_parallel_size
        link = self.settings.stage_link
        stage_link = Link(link, seed=self.settings.link_seed) if pp > 1 and link is not None else None
        self.channel = ProxyChannel(self.name, self._on_requests)
        self.outbox = Outbox(self.channel.send_events)
        self.loop = EngineLoop(self.core, LocalPipelineExecutor(pp, self.clock, stage_link), self.settings,
                               self.clock, self._emit)
        await self.channel.connect(*proxy_address)

    # -- outputs (requests come in through ProxyIntakeMixin) -------------------
    def _emit(self, outputs: list[EngineCoreOutput]) -> None:
        now = self.clock.now()
        running_loop = asyncio.get_running_loop()
        for out in outputs:
            if out.finished and out.kv_transfer_params and out.request_id in self.core.scheduler.requests:
                self._held[out.request_id] = now
                running_loop.call_later(self.settings.kv_hold_timeout_s, self._hold_expired, out.request_id, now)
        self.outbox.put(output_events(self.core.engine, outputs))

    # -- the consumer is done with a request's blocks ---------------------------
    def _on_done(self, request_id: str, success: bool) -> None:
        self.done_reports += 1
        if not success:
            self.failed_done_reports += 1
        if self._held.pop(request_id, None) is None:
            self.late_done_reports += 1  # released already (hold timeout) or never held
            return
        self._release(request_id)

    def _hold_expired(self, request_id: str, held_since: float) -> None:
        if self._held.get(request_id) != held_since:
            return
        del self._held[request_id]
        self.hold_timeouts += 1
        self._release(request_id)

    def _release(self, request_id: str) -> None:
        self.core.mark_finished_sending(request_id)
        if self.loop is not None:
            self.loop.wake()

    # -- reporting --------------------------------------------------------------
    @property
    def num_held(self) -> int:
        return len(self._held)

    def busy(self) -> bool:
        """Work left: steps to schedule or in flight, or blocks held for a pull."""
        return self.loop is not None and self.loop.alive and (not self.loop.is_idle() or bool(self._held))

    def extra_counters(self) -> dict:
        return {
            "kv_blocks_served": self.source.blocks_served,
            "kv_pull_reads_failed": self.source.reads_failed,
            "kv_done_reports": self.done_reports,
            "kv_failed_done_reports": self.failed_done_reports,
            "kv_late_done_reports": self.late_done_reports,
            "kv_hold_timeouts": self.hold_timeouts,
            "node_messages_sent": self.outbox.num_messages if self.outbox else 0,
        }

    async def close(self) -> None:
        await self.server.stop(grace=0.2)
        if self.loop is not None:
            await self.loop.close()
        if self.channel is not None:
            await self.channel.close()
