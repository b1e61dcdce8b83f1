"""The ports a runtime gives a node at construction. A node never sleeps,
reads a clock, opens a socket or spawns a task itself: time comes from the
`Clock`, steps go out through the `StepExecutor`, events through `Emit`, KV
blocks through `connector.transport.KVTransport`.

Implementations: `cluster.inproc` (virtual clock, discrete events) and
`cluster.wall` (asyncio on the run clock, stage actors, gRPC)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from engine.model_runner import StepPlan
from engine.outputs import SteadyTokens
from engine.sampler import DeterministicSampler

from .messages import NodeEvent


class Timer(Protocol):
    def cancel(self) -> None: ...


class Clock(Protocol):
    """Run seconds: t = 0 is the start of the run."""

    def now(self) -> float: ...

    def call_soon(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run `fn` after the current event, before time moves on."""
        ...

    def call_at(self, t: float, fn: Callable[..., Any], *args: Any) -> Timer:
        """Run `fn` at run time `t` (at once, after the current event, if it has passed)."""
        ...


# on_done(plan, tokens): tokens are what the last stage sampled per plan
# entry, or None to let the node's runner sample (the sampler is deterministic).
StepDone = Callable[[StepPlan, list[list[int]] | None], None]


class StepExecutor(Protocol):
    """Where a node sends a scheduled step: through its pipeline stages,
    taking `duration_s` run seconds in all. Calls `on_done` once the last
    stage has finished, or `on_error` if the step cannot complete (a stage
    worker died): the node then stops."""

    def execute(
        self, plan: StepPlan, duration_s: float, on_done: StepDone, on_error: Callable[[str], None]
    ) -> None: ...


# The node's outbox: events for the proxy, in order (in process, a decode
# node's one-token outputs may come as one `SteadyTokens`: engine/outputs.py).
Emit = Callable[[Sequence[NodeEvent | SteadyTokens]], None]


@dataclass(frozen=True)
class NodePorts:
    clock: Clock
    executor: StepExecutor
    emit: Emit
    # A sampler the runtime shares among its nodes and its client check (in
    # one process: its request-id hashes are then worked out once); None:
    # the node makes its own.
    sampler: DeterministicSampler | None = None
