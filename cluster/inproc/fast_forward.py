"""The steady-decode fast-forward on the virtual clock (issue 15;
docs/fast-paths.md).

When a node is about to schedule a step and is in steady decode
(`engine/steady_decode.py`: only token counts change from step to step),
it advances over every step that ends before the next event that could
change its schedule, at once: the engine state (`steady_decode.advance`,
requests reaching their length cap finish where they would), the step
records and timings, the executor's pipeline arithmetic, and the client's
token records, finishes and the proxy link's bookkeeping (events due when
those steps end), exactly as stepping one by one would have left them.
When the last step ends the node goes on as if it had just come back.

"Could change its schedule" (`_limits`): any event in the loop's queue,
except the proxy's receipts of this node's outputs that can start nothing
(the tokens of earlier forwarded steps always; other outputs unless a finish
could start a waiting request), and an arrival whose routing cannot read this node's load (the
forward then runs through the step the arrival falls in: what it sets off
only queues requests, admitted at the end of that step on either path).
With a closed-loop backlog a finish ends a forward. Steps end strictly
before the next event, so no tie needs ordering. Only for runs driven by
`InProcCluster.run` (a paced driver reads records as time goes by), with an
ideal proxy link back from the node, one pipeline stage and no slow-down
windows.

When requests wait (or the next event is within a step), a steady node
takes one step the usual way with its running requests' work in bulk
(`_admission_step`, `steady_step.schedule_with_steady`).

Switched off with the other fast paths (`engine/fast_paths.py`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from itertools import islice
from typing import Any

from engine.cost_model import StepShape
from engine.steady_decode import SteadyBatch, advance, block_plan, is_quiet, steady_batch
from engine.steady_step import schedule_with_steady
from node.messages import OutputEvent
from node.role import NodeRole
from node.step_loop import StepTiming
from proxy.proxy import Proxy

from .clock import EventLoop
from .executor import VirtualPipelineExecutor
from .load_driver import LoadDriver
from .proxy_links import InProcProxyLinks


def _function(fn: Any) -> Any:
    """The function a bound method calls (None for anything else), to be
    compared with a class's attribute. A Python method has `__func__`; a
    compiled build's method (docs/compiled.md) is a builtin method, whose
    class attribute is the descriptor its class holds under its name."""
    func = getattr(fn, "__func__", None)
    if func is None:
        owner, name = getattr(fn, "__self__", None), getattr(fn, "__name__", None)
        if owner is not None and name is not None:
            func = getattr(type(owner), name, None)
    return func


class SteadyDecodeForwarder:
    def __init__(
        self,
        loop: EventLoop,
        links: InProcProxyLinks,
        driver: LoadDriver,
        proxy: Proxy,
        active: Callable[[], bool],
        node: NodeRole,
        executor: VirtualPipelineExecutor,
    ) -> None:
        self.loop = loop
        self.links = links
        self.driver = driver
        self.proxy = proxy
        self.active = active  # inside `InProcCluster.run` (not a paced driver's steps)
        self.node = node
        self.executor = executor
        self.steps_forwarded = 0
        self.jumps = 0
        self.admission_steps = 0

    def _harmless(self, fn: Any, args: tuple) -> bool:
        """The proxy's receipt of this node's outputs, when it starts nothing:
        always for the tokens of forwarded steps (`_receive_steady`: no finish
        comes with them), else when no finish can start a waiting request."""
        if not args or args[0] is not self.node:
            return False
        func = _function(fn)
        if func is InProcProxyLinks._receive_steady:
            return True
        if func is not InProcProxyLinks._receive:
            return False
        if not self.driver.backlog:
            return True
        return all(getattr(ev, "finish_reason", None) is None for ev in args[1])

    def _passable(self, fn: Any, args: tuple) -> bool:
        """An arrival, or a prefill node's step coming back, whose handling
        cannot read this node's state: it, and everything it sets off (a
        prefill, the hand-over to a decode node), only queues requests, which
        the node admits at the end of the step they arrive in on either path,
        so a forward may run through the step it falls in. They would read
        this node's load only to pick among several decode nodes by load."""
        func = _function(fn)
        if func is LoadDriver.arrive:
            pass
        elif func is VirtualPipelineExecutor._done:
            if not fn.__self__.serves_prefill:
                return False
        else:
            return False
        router = self.proxy.routers["decode"]
        return router is None or len(router.nodes) == 1 or router.policy == "round_robin"

    def _limits(self) -> tuple[float, float]:
        """(horizon, arrival): forwarded steps end before `horizon` and start
        before `arrival` (never ending exactly at it). From the first events in
        the loop that will run (`EventLoop.first_live`):
        this node's harmless pending outputs are skipped, passable events
        (`_passable`) may follow, cancelled timers do not count; the first
        other event is the horizon."""
        # A cancelled timer (a prefill node's hold timer, cancelled by the
        # done report) does nothing when its time comes, not even move the
        # clock: it limits nothing.
        live = self.loop.first_live(4)
        i = 0
        while i < len(live) and self._harmless(live[i][2], live[i][3]):
            i += 1
        arrival = math.inf
        while i < len(live):
            event = live[i]
            if not self._passable(event[2], event[3]):
                return event[0], arrival
            if arrival == math.inf:
                arrival = event[0]
            i += 1
        # Past what we looked at: the last event seen is as far as we may go.
        return (live[-1][0] if len(live) == 4 else math.inf), arrival

    def __call__(self) -> bool:
        if self.node.loop.forwarding:
            return True  # steps are in flight until `_resume` (a step in flight schedules nothing)
        if not self.active():
            return False
        node, executor = self.node, self.executor
        if executor.slow_windows or executor.pipeline.pp_size != 1 or node.role == "prefill":
            return False
        if type(node)._on_outputs is not NodeRole._on_outputs:
            return False  # a role that does more with its outputs than emit them
        core = node.core
        batch = steady_batch(core, admitting=True)
        if batch is None:
            return False
        if not is_quiet(core) or not self.links.ideal_from(node.name):
            return self._admission_step(batch)
        loop = self.loop
        horizon, arrival = self._limits()
        now = loop.now()
        # Finishes end a forward only when one could start a waiting request
        # (the closed loop's backlog): the proxy's receipt of a finish is then
        # an event that changes the schedule.
        limit = batch.last_finish if not self.driver.backlog else batch.first_finish
        sizes, contexts, durations, runs, times = self._plan(batch, limit, now, horizon, arrival)
        m = len(durations)
        if m == 0:
            return self._admission_step(batch)  # the next event is due within a step
        per_step, finishing, fits = block_plan(core, batch, m)
        if fits < m:
            m = fits
            if m == 0:
                return False
            del sizes[m:], contexts[m:], durations[m:], runs[m:], times[m + 1 :], per_step[m + 1 :], finishing[m + 1 :]
        # Commit: the executor's own arithmetic (`StagePipeline.finish_time`
        # of one stage: each step starts when the last one ends).
        busy = executor.busy_time
        for run in runs:
            busy += run
        executor.busy_time = busy
        executor.pipeline.stage_free_at[0] = times[m]
        ids = batch.ids
        finished = advance(core, batch, per_step, finishing, m, times, durations, sizes, contexts)
        if node.loop.keep_timings:
            first_index = core.current_step - m + 1
            timings = node.loop.timings
            for j in range(m):
                timings.append(StepTiming(first_index + j, times[j], durations[j], runs[j], times[j + 1]))
        self.steps_forwarded += m
        self.jumps += 1
        # The outputs of the requests each step finished, as the role emits them.
        first = core.first_scheduled_time
        events = {
            j: [
                OutputEvent(o.request_id, o.new_token_ids, o.finish_reason, o.kv_transfer_params, o.num_preemptions,
                            first(o.request_id))
                for o in outs
            ]
            for j, outs in finished.items()
        }  # fmt: skip
        # The node goes on when the last step ends, before the proxy takes in
        # that step's outputs (the order of a step's end on the plain path).
        loop.at(times[m], self._resume)
        self.links.steady_outputs(node, ids, times[1:], sizes, events)
        node.loop.forwarding = True
        return True

    def _plan(
        self, batch: SteadyBatch, limit: int, now: float, horizon: float, arrival: float
    ) -> tuple[list[int], list[int], list[float], list[float], list[float]]:
        """The forward's steps, up to `limit`, that end before `horizon` and
        start before `arrival` (never ending exactly at it): their batch
        sizes, attended context tokens, modelled durations and run times, and
        `times` (now, then when each ends: the pipeline arithmetic of one
        stage)."""
        settings = self.node.settings
        cost_model = settings.cost_model
        decode_step_time = getattr(cost_model, "decode_step_time", None)
        time_scale = settings.time_scale  # `NodeSettings.run_seconds`: modelled x time_scale
        stage_free = self.executor.pipeline.stage_free_at[0]
        sizes: list[int] = []
        contexts: list[int] = []
        durations: list[float] = []
        runs: list[float] = []
        times = [now]
        t = now
        # islice, not zip(range(limit), ...): mypyc 2.4.1's compiled zip
        # takes the generator's end for an error (docs/compiled.md).
        for n, ctx in islice(batch.step_sizes(), max(limit, 0)):
            if decode_step_time is not None:
                modelled = decode_step_time(n, ctx)
            else:
                modelled = cost_model.step_time(StepShape(0, n, ctx, n, ctx, 0))
            run = modelled * time_scale
            start = t if t > stage_free else stage_free
            end = start + run
            if not end < horizon or math.isinf(end) or not start < arrival or end == arrival:
                break
            sizes.append(n)
            contexts.append(ctx)
            durations.append(modelled)
            runs.append(run)
            times.append(end)
            t = stage_free = end
        return sizes, contexts, durations, runs, times

    def _admission_step(self, batch: SteadyBatch) -> bool:
        """Requests wait while the running ones are in steady decode: one
        step, scheduled and run the usual way, but with the steady requests'
        work done in bulk (`schedule_with_steady`). It needs no look ahead:
        like any step, it takes effect when it is scheduled and when it
        comes back."""
        core = self.node.core
        per_step, _, fits = block_plan(core, batch, 1)
        if fits < 1:
            return False
        now = self.loop.now()
        plan = core.queue_step(now, schedule_with_steady(core, batch, per_step))
        assert plan is not None  # the step has tokens
        self.admission_steps += 1
        self.node.loop.submit(plan)
        return True

    def _resume(self) -> None:
        """The last forwarded step is back: the node schedules on."""
        self.node.loop.resume()
