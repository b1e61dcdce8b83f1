"""What the prefill and the decode role share: a `NodeCore` driven by the
`StepLoop`, requests taken from the proxy (one it cannot take is answered
with a rejection, as vLLM's front end rejects it — the request fails, the
node serves on), outputs turned into events for the proxy, and the
end-of-run report. A role adds its KV handoff side on top."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from engine.model_runner import StepPlan
from engine.node_core import NodeCore, NodeSpec
from engine.outputs import EngineCoreOutput, SteadyTokens
from engine.records import StepRecord

from .messages import NodeEvent, OutputEvent, RequestMessage
from .ports import NodePorts
from .settings import NodeSettings
from .step_loop import StepLoop, StepTiming


@dataclass
class NodeReport:
    """A node at the end of a run, as the runtimes collect it."""

    name: str
    role: str
    counters: dict[str, Any]
    steps: list[StepRecord]
    violations: list[dict[str, Any]]
    invariant_errors: list[str]
    timings: list[StepTiming] = field(default_factory=list)
    where: dict[str, Any] = field(default_factory=dict)  # process facts added by a Ray shell
    observer_errors: list[str] = field(default_factory=list)


class NodeRole:
    role = "node"

    def __init__(
        self,
        spec: NodeSpec,
        settings: NodeSettings,
        ports: NodePorts,
        on_step: Callable[[StepRecord], None] | None = None,
        check_each_step: bool = False,
    ) -> None:
        self.name = spec.name
        self.settings = settings
        self.clock = ports.clock
        self._emit = ports.emit
        self.core = NodeCore(spec, on_step=on_step, sampler=ports.sampler)
        self.loop = StepLoop(
            self.core,
            ports.executor,
            ports.clock,
            settings,
            self._on_outputs,
            on_submit=self._on_submit,
            check_each_step=check_each_step,
        )
        self.requests_rejected = 0
        self.requests_aborted = 0  # aborts of requests this node's engine had (clients that went away)

    # -- events in ----------------------------------------------------------------
    def on_requests(self, messages: list[RequestMessage]) -> None:
        rejected: list[NodeEvent] = []
        for message in messages:
            try:
                self.loop.add_request(message.to_request(self.core.eos_token_id))
            except ValueError as err:
                self.requests_rejected += 1
                rejected.append(OutputEvent.rejected(message.request_id, err))
        if rejected:
            self._emit(rejected)

    def abort(self, request_ids: list[str]) -> None:
        known = set(self.core.request_ids())
        request_ids = [r for r in request_ids if r in known]  # finished meanwhile, or never delivered
        if request_ids:
            self.requests_aborted += len(request_ids)
            self.loop.abort(request_ids)

    def kill(self) -> None:
        """The node's process is gone: nothing it does is seen any more."""
        self.loop.stop()

    @property
    def alive(self) -> bool:
        return self.loop.alive

    def load(self) -> int:
        """Requests running or waiting here (least-loaded routing in-process)."""
        running, waiting = self.core.request_counts()
        return running + waiting

    # -- hooks for the roles ----------------------------------------------------------
    def _on_submit(self, plan: StepPlan) -> None:
        pass

    def _on_outputs(self, outputs: list[EngineCoreOutput | SteadyTokens]) -> None:
        # Built inline, not through `OutputEvent.from_core`: this runs once per token.
        # A `SteadyTokens` (one token for each of many requests, from the
        # in-process steady-decode fast path) goes to the proxy as it is.
        first = self.core.first_scheduled_time
        self._emit(
            [
                o
                if type(o) is SteadyTokens
                else OutputEvent(
                    o.request_id,
                    o.new_token_ids,
                    o.finish_reason,
                    o.kv_transfer_params,
                    o.num_preemptions,
                    first(o.request_id),
                )
                for o in outputs
            ]
        )

    # -- reporting ------------------------------------------------------------------------
    def busy(self) -> bool:
        """Work left: steps to schedule or in flight (a role adds its KV work)."""
        return not self.loop.is_idle()

    def extra_counters(self) -> dict[str, Any]:
        return {}

    def counters(self) -> dict[str, Any]:
        c = self.core.counters()
        c.update(self.extra_counters())
        c["requests_rejected"] = self.requests_rejected
        c["requests_aborted"] = self.requests_aborted
        c["stage_token_mismatches"] = self.loop.stage_token_mismatches
        return c

    def report(self) -> NodeReport:
        errors = self.core.end_of_run_errors()
        if self.loop.error:
            errors.append(f"{self.name}: {self.loop.error}")
        return NodeReport(
            name=self.name,
            role=self.role,
            counters=self.counters(),
            steps=self.core.step_records,
            violations=self.core.shadow_violations(),
            invariant_errors=errors,
            timings=list(self.loop.timings),
        )
