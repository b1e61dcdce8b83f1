"""The consumer node: an engine core in `kv_consumer` role (the fence is on
by vLLM's gate once batches overlap) whose executor runs the pipeline stages.

When a step carries a KV load (`reqs_to_recv`), the worker side registers
the target blocks with the shadow store and pulls the producer's blocks over
gRPC (`KVPuller`: per-attempt timeout, retries, one deadline, CRC on every
block) into a `VerifyingBlockSink`. When the last block has landed the node
writes the shadow store and reports `finished_recving` (the puller then tells
the producer, `finished_sending` there); a pull that fails reports a failed
receive, which the scheduler handles by its `kv_load_failure_policy`
(recompute, or finish the request with FINISHED_ERROR). Nothing waits past
the pull deadline.

A plain class: the Ray actor shell in `cluster/ray_actors.py` builds the
stage workers and passes their executor in.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Callable

from connector.grpc_client import KVPuller, PullerConfig
from connector.link import Link
from connector.transport import PullResult
from engine.kv_connector.pd_connector import RecvSpec
from engine.model_runner import StepPlan
from engine.node_core import NodeCore, NodeSpec
from engine.outputs import EngineCoreOutput

from .block_sink import VerifyingBlockSink
from .engine_loop import EngineLoop, LocalPipelineExecutor, StepExecutor
from .events import Outbox, output_events
from .proxy_intake import ProxyIntakeMixin
from .proxy_channel import ProxyChannel
from .settings import WallNodeSettings
from .wall_clock import RunClock

logger = logging.getLogger(__name__)

ExecutorFactory = Callable[[RunClock], StepExecutor]


class DecodeNode(ProxyIntakeMixin):
    role = "decode"

    def __init__(self, spec: NodeSpec, settings: WallNodeSettings, executor_factory: ExecutorFactory | None = None) -> None:
        self.name = spec.name
        self.core = NodeCore(spec)
        self.settings = settings
        self.pp = self.core.vllm_config.parallel_config.pipeline_parallel_size
        self.executor_factory = executor_factory or self._local_executor
        self.clock = RunClock.starting_now()
        self.sink = VerifyingBlockSink(spec.cache.block_size, settings.bytes_per_token, self._on_landed)
        # Remote request id -> its load, from submit until it lands or fails.
        self._loading: dict[str, RecvSpec] = {}
        self.puller: KVPuller | None = None
        self.loop: EngineLoop | None = None
        self.outbox: Outbox | None = None
        self.channel: ProxyChannel | None = None
        self._pulls: set[asyncio.Task] = set()
        self.pulls_started = 0
        self.pulls_completed = 0
        self.pulls_failed = 0
        self.pull_attempts = 0
        self.pull_checksum_failures = 0
        self.pull_failures: dict[str, int] = {}

    def _local_executor(self, clock: RunClock) -> StepExecutor:
        link = self.settings.stage_link
        stage_link = Link(link, seed=self.settings.link_seed) if self.pp > 1 and link is not None else None
        return LocalPipelineExecutor(self.pp, clock, stage_link)

    async def begin(self, start_wall: float, proxy_address: tuple[str, int]) -> None:
        """Start the run clock, connect to the stages and the proxy, start the loop."""
        s = self.settings
        self.clock = self.settings.clock(start_wall)
        config = PullerConfig(
            attempt_timeout_s=s.kv_pull_timeout_s,
            deadline_s=s.kv_pull_deadline_s,
            max_concurrent_pulls=s.max_concurrent_pulls,
            consumer_id=self.name,
        )
        # Outage windows of the KV link are in run seconds: the link's epoch
        # is the run's t = 0 on this process's monotonic clock.
        self.puller = KVPuller(self.sink, config, link=s.kv_link, link_seed=s.link_seed, link_epoch=self.clock.epoch)
        self.channel = ProxyChannel(self.name, self._on_requests)
        self.outbox = Outbox(self.channel.send_events)
        executor = self.executor_factory(self.clock)
        await executor.connect()
        self.loop = EngineLoop(self.core, executor, s, self.clock, self._emit, on_submit=self._on_submit)
        await self.channel.connect(*proxy_address)

    # -- outputs (requests come in through ProxyIntakeMixin) ---------------------
    def _emit(self, outputs: list[EngineCoreOutput]) -> None:
        self.outbox.put(output_events(self.core.engine, outputs))

    # -- KV loads -----------------------------------------------------------------
    def _on_submit(self, plan: StepPlan) -> None:
        meta = plan.scheduler_output.kv_connector_metadata
        if meta is None or not getattr(meta, "reqs_to_recv", None):
            return
        for spec in meta.reqs_to_recv.values():
            self.core.runner.register_load(spec.request_id, spec.local_block_ids)
            self.sink.expect(spec.remote_request_id, spec.num_tokens)
            self.pulls_started += 1
            self.outbox.put([("kv", spec.request_id, "start", self.clock.now(), True)])
            task = asyncio.ensure_future(self._pull(spec))
            self._pulls.add(task)
            task.add_done_callback(self._pulls.discard)

    async def _pull(self, spec: RecvSpec) -> None:
        self._loading[spec.remote_request_id] = spec
        result: PullResult | None = None
        try:
            if len(spec.remote_block_ids) != len(spec.local_block_ids):
                raise ValueError(
                    f"{spec.request_id}: {len(spec.remote_block_ids)} remote blocks for "
                    f"{len(spec.local_block_ids)} local blocks"
                )
            result = await self.puller.pull(
                spec.remote_request_id, spec.remote_address, spec.remote_block_ids, spec.local_block_ids
            )
        except asyncio.CancelledError:
            raise
        except Exception as err:  # a malformed load must fail the request, not the node
            logger.warning("%s: pull of %s failed: %s", self.name, spec.request_id, err)
        self.sink.forget(spec.remote_request_id)
        if result is not None:
            self.pull_attempts += result.attempts
            self.pull_checksum_failures += result.checksum_failures
        if self._loading.pop(spec.remote_request_id, None) is None:
            return  # it landed already (`_on_landed`); the rest was the done report
        # It never landed: a failed receive.
        self.pulls_failed += 1
        reason = result.failure.value if result is not None and result.failure else "error"
        self.pull_failures[reason] = self.pull_failures.get(reason, 0) + 1
        self._finish_load(spec, ok=False)

    def _on_landed(self, remote_request_id: str) -> None:
        """Every block of a load arrived and was verified."""
        spec = self._loading.pop(remote_request_id, None)
        if spec is None:
            return
        self.pulls_completed += 1
        self.core.write_pulled_blocks(spec.request_id, spec.local_block_ids, spec.num_tokens, self.clock.now())
        self._finish_load(spec, ok=True)

    def _finish_load(self, spec: RecvSpec, ok: bool) -> None:
        if self.loop is None or not self.loop.alive:
            return
        self.core.mark_finished_recving(spec.request_id, ok=ok)
        self.outbox.put([("kv", spec.request_id, "end", self.clock.now(), ok)])
        self.loop.wake()

    # -- reporting ----------------------------------------------------------------
    @property
    def pulls_in_flight(self) -> int:
        return len(self._pulls)

    def busy(self) -> bool:
        """Work left: steps to schedule or in flight, or pulls (and their done reports) running."""
        return self.loop is not None and self.loop.alive and (not self.loop.is_idle() or bool(self._pulls))

    def extra_counters(self) -> dict:
        c = {
            "kv_pulls_started": self.pulls_started,
            "kv_pulls_completed": self.pulls_completed,
            "kv_pulls_failed": self.pulls_failed,
            "kv_pull_attempts": self.pull_attempts,
            # Retried attempts, as the in-process transport counts them.
            "transport_retries": max(0, self.pull_attempts - self.pulls_completed - self.pulls_failed),
            "kv_checksum_failures": self.pull_checksum_failures,
            "kv_blocks_verified": self.sink.blocks_verified,
            "kv_block_content_mismatches": self.sink.mismatches,
            "node_messages_sent": self.outbox.num_messages if self.outbox else 0,
            "stage_token_mismatches": self.loop.stage_token_mismatches if self.loop else 0,
        }
        c.update({f"kv_pulls_failed_{k}": v for k, v in self.pull_failures.items()})
        return c

    async def close(self) -> None:
        for task in list(self._pulls):
            task.cancel()
        await asyncio.gather(*self._pulls, return_exceptions=True)
        if self.loop is not None:
            await self.loop.close()
        if self.puller is not None:
            await self.puller.close()
        if self.channel is not None:
            await self.channel.close()
