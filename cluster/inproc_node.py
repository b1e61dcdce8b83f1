"""A node on the virtual clock: drives a `NodeCore` through the engine loop
and a `VirtualPipelineExecutor`; up to `max_concurrent_batches` steps are in
flight, their outputs processed strictly in FIFO order."""

from __future__ import annotations

from typing import Callable

from connector.link import Link
from engine.cost_model import CostModel
from engine.model_runner import StepPlan
from engine.node_core import NodeCore
from engine.outputs import EngineCoreOutput
from engine.request import Request

from .des import EventLoop
from .inproc_executor import VirtualPipelineExecutor


class InProcNode:
    def __init__(
        self,
        core: NodeCore,
        loop: EventLoop,
        cost_model: CostModel,
        stage_link: Link | None,
        on_outputs: Callable[["InProcNode", list[EngineCoreOutput]], None],
        debug_invariants: bool = False,
    ) -> None:
        self.core = core
        self.name = core.name
        self.loop = loop
        self.cost_model = cost_model
        self.on_outputs = on_outputs
        self.executor = VirtualPipelineExecutor(loop, core.vllm_config.parallel_config.pipeline_parallel_size, stage_link)
        self.alive = True
        self.debug_invariants = debug_invariants
        self.start_pull: Callable = lambda spec: None
        self._done: dict[int, object] = {}
        self._kick_pending = False

    # -- inputs ---------------------------------------------------------------
    def add_request(self, request: Request) -> None:
        if not self.alive:
            raise RuntimeError(f"{self.name} is dead")
        self.core.engine.add_request(request)
        self.wake()

    def abort(self, request_ids: list[str]) -> None:
        self.core.engine.abort_requests(request_ids)
        self.wake()

    def load(self) -> float:
        running, waiting = self.core.scheduler.get_request_counts()
        return running + waiting

    def wake(self) -> None:
        """Schedule a kick at the current time (coalesced)."""
        if self.alive and not self._kick_pending:
            self._kick_pending = True
            self.loop.at(self.loop.now, self._kick)

    def kill(self) -> None:
        self.alive = False

    # -- the engine loop --------------------------------------------------------
    def _kick(self) -> None:
        self._kick_pending = False
        if not self.alive:
            return
        engine = self.core.engine
        while (plan := engine.schedule_step(self.loop.now)) is not None:
            self._submit(plan)

    def _submit(self, plan: StepPlan) -> None:
        meta = plan.scheduler_output.kv_connector_metadata
        if meta is not None and getattr(meta, "reqs_to_recv", None):
            for spec in meta.reqs_to_recv.values():
                self.core.runner.register_load(spec.request_id, spec.local_block_ids)
                self.start_pull(spec)
        self.executor.execute(plan, self.cost_model.step_time(plan.shape), self._complete)

    def _complete(self, plan: StepPlan) -> None:
        if not self.alive:
            return
        core = self.core
        self._done[id(plan)] = core.runner.finish_step(plan, self.loop.now, core.take_connector_output())
        engine = core.engine
        while (oldest := engine.oldest()) is not None and id(oldest) in self._done:
            mro = self._done.pop(id(oldest))
            outputs = engine.process_oldest(mro)
            if self.debug_invariants:
                core.check_block_conservation()
            if outputs:
                self.on_outputs(self, outputs)
        self._kick()

    # -- PullEndpoint -----------------------------------------------------------
    def blocks_for_pull(self, request_id, block_ids, num_tokens, now) -> bool:
        return self.core.blocks_for_pull(request_id, block_ids, num_tokens, now)

    def write_pulled_blocks(self, request_id, block_ids, num_tokens, now) -> None:
        self.core.write_pulled_blocks(request_id, block_ids, num_tokens, now)

    def mark_finished_sending(self, request_id: str) -> None:
        self.core.mark_finished_sending(request_id)

    def mark_finished_recving(self, request_id: str, ok: bool = True) -> None:
        self.core.mark_finished_recving(request_id, ok)
