"""The in-process runtime: the prefill and decode roles (the very classes
the Ray actors wrap), the proxy in front of them, the KV transport between
them and the load driver, all on one virtual clock. Deterministic: the same
spec, workload and seed give the same trace.

Every node gets the same ports a Ray node gets, implemented on the event
loop: the loop is its `Clock`, a `VirtualPipelineExecutor` its stages, the
proxy link its outbox, an `InProcKVTransport` its KV handoff."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import replace
from operator import attrgetter
from typing import Any

from connector.link import Link, ReliableLine
from decode_node.node import DecodeNode
from engine import fast_paths
from engine.records import RequestRecord, WorkloadRequest
from engine.sampler import DeterministicSampler
from engine.scheduler import Scheduler
from node.messages import RequestMessage
from node.ports import NodePorts
from node.role import NodeRole
from prefill_node.node import PrefillNode

from ..chaos import Fault, chaos_report
from ..invariants import check_requests
from ..router import PrefixIndex, Router
from ..run_result import RunResult, kv_pull_summary
from ..spec import ClusterSpec
from .clock import EventLoop
from .collector import collector_paused
from .executor import VirtualPipelineExecutor
from .fast_forward import SteadyDecodeForwarder
from .faults import FaultsMixin
from .kv_transport import InProcKVTransport
from .proxy_outputs import ProxyOutputsMixin
from .token_runs import SteadyTokenRuns

REQUEST_BYTES = 512


class InProcCluster(ProxyOutputsMixin, FaultsMixin):
    def __init__(
        self,
        spec: ClusterSpec,
        seed: int = 0,
        debug_invariants: bool = False,
        trace: bool = False,
        observer: Any = None,
    ) -> None:
        """`observer` (optional) gets `on_step(StepRecord)` for every step of
        every node and `on_request_finished(node_name, RequestRecord)`."""
        self.spec = spec
        self.observer = observer
        self.seed = seed
        self.loop = EventLoop()
        self.trace_enabled = trace
        self.trace: list[tuple] = []
        self._link_seed = seed * 1000
        self._kv_links: dict[tuple[str, str], Link] = {}
        # Deterministic per seed: the virtual clock has no outsider to keep out,
        # but runs the same ticket checks as Ray (where the key is random).
        settings = replace(spec.node_settings(), ticket_key=hashlib.sha256(f"inproc-run/{seed}".encode()).digest())
        self.nodes: dict[str, NodeRole] = {}
        self.prefill_nodes: list[NodeRole] = []
        self.decode_nodes: list[NodeRole] = []
        self._producers: dict[str, PrefillNode] = {}
        self._settings = settings
        self._on_step = observer.on_step if observer is not None else None
        self._debug_invariants = debug_invariants
        self._executors: dict[str, VirtualPipelineExecutor] = {}
        self.chaos_faults: list[Fault] | None = None
        # The steady-decode fast-forward runs only inside `run()` (fast_forward.py).
        self.fast_forward_active = False
        self._forwarders: list[SteadyDecodeForwarder] = []
        # Token ids by position: the nodes' sampler (`NodePorts.sampler`), the
        # client's records of forwarded steps and the end-of-run check share it.
        self._sampler = DeterministicSampler(spec.sampler.seed + seed, spec.sampler.stop_probability)
        self._token_runs = SteadyTokenRuns(self)
        self._specs: dict[str, tuple[str, Any, Any]] = {}
        self.restarts: dict[str, int] = {}
        for role, node_spec, group in spec.node_specs():
            node_spec.sampler_seed = spec.sampler.seed + seed
            self._specs[node_spec.name] = (role, node_spec, group)
            node = self._build_node(role, node_spec, group)
            (self.prefill_nodes if role == "prefill" else self.decode_nodes).append(node)
            self.nodes[node.name] = node
        # The proxy <-> node connections are TCP: loss costs retransmissions, never order.
        self._proxy_links: dict[str, tuple[ReliableLine, ReliableLine]] = {}
        for n in self.nodes:
            link = self._new_link(spec.links.proxy)
            self._proxy_links[n] = (ReliableLine(link.forward), ReliableLine(link.reverse))
        # Prefix-aware routing's memory of which prompts went where (kept when routers are rebuilt).
        self._prefill_index: PrefixIndex[NodeRole] = PrefixIndex()
        self._decode_index: PrefixIndex[NodeRole] = PrefixIndex()
        self.prefill_router: Router[NodeRole] | None = (
            Router(self.prefill_nodes, spec.routing, NodeRole.load, self._prefill_index) if self.prefill_nodes else None
        )
        self.decode_router: Router[NodeRole] | None = Router(
            self.decode_nodes, spec.routing, NodeRole.load, self._decode_index
        )
        self.eos_token_id = self.decode_nodes[0].core.eos_token_id
        self.records: dict[str, RequestRecord] = {}
        self._workload: dict[str, WorkloadRequest] = {}
        self._node_of: dict[str, NodeRole] = {}
        self._prefill_of: dict[str, PrefillNode] = {}  # the node holding a request's prompt blocks
        self.failures: dict[str, str] = {}  # request id -> why it finished with "error"
        self.rerouted: dict[str, int] = {}  # request id -> times re-routed to a live decode node
        self.events_rejected = 0  # node events about requests not routed to that node
        self.requests_aborted = 0  # requests whose client went away (`abort`)
        # Serving (`bench/serve/driver.py`): ids of requests whose record changed
        # since the server last looked, so it wakes only their handlers. None: off.
        self.touched: set[str] | None = None
        self._backlog: list[WorkloadRequest] = []
        self._in_flight = 0
        self.max_concurrency: int | None = None

    def _new_link(self, settings) -> Link:
        self._link_seed += 1
        return Link(settings.to_spec(), seed=self._link_seed)

    def _kv_link(self, consumer: str, producer: str) -> Link:
        key = (consumer, producer)
        if key not in self._kv_links:
            self._kv_links[key] = self._new_link(self.spec.links.kv)
        return self._kv_links[key]

    def _log(self, *event) -> None:
        if self.trace_enabled:
            self.trace.append((round(self.loop.now(), 9), *event))

    # -- the load driver ---------------------------------------------------------
    def submit(self, workload: Iterable[WorkloadRequest], max_concurrency: int | None = None) -> None:
        self.max_concurrency = max_concurrency
        workload = list(workload)
        seen = set(self._workload)
        for w in workload:
            if w.request_id in seen:
                raise ValueError(f"duplicate request id {w.request_id!r} in the workload")
            seen.add(w.request_id)
        for w in workload:
            self._workload[w.request_id] = w
        # Known up front: the loop keeps them apart from what the run schedules (clock.py).
        self.loop.at_each([w.arrival_time for w in workload], self._arrive, [(w,) for w in workload])

    def _arrive(self, w: WorkloadRequest) -> None:
        if self.max_concurrency is not None and self._in_flight >= self.max_concurrency:
            self._backlog.append(w)
            return
        self._in_flight += 1
        now = self.loop.now()
        self.records[w.request_id] = RequestRecord(w.request_id, now, w.prompt_len, w.output_len, w.priority)
        if self.trace_enabled:
            self._log("arrive", w.request_id)
        if self.prefill_nodes and self.prefill_router is None:
            self._finish(w.request_id, "error")  # every prefill node is gone
            return
        if self.prefill_router is not None:
            self._send(
                self._pick(self.prefill_router, w),
                self._message(w, max_tokens=1, params={"do_remote_decode": True}),
            )
        else:
            if self.decode_router is None:
                self._finish(w.request_id, "error", "no live decode node")
                return
            self._send(self._pick(self.decode_router, w), self._message(w, max_tokens=w.output_len, params=None))

    def _pick(self, router: Router[NodeRole], w: WorkloadRequest) -> NodeRole:
        """The router's node for `w`; its prompt's block hashes are worked
        out only for the policy that reads them."""
        if router.policy != "prefix_aware":
            return router.pick()
        return router.pick(self.spec.prompt_hashes(w.request_id, w.prompt_len, w.prompt_segments))

    def _message(self, w: WorkloadRequest, max_tokens: int, params: dict | None) -> RequestMessage:
        return RequestMessage(
            w.request_id,
            w.prompt_len,
            max_tokens,
            self.records[w.request_id].arrival_time,
            w.priority,
            params,
            self.spec.sampler.ignore_eos if w.ignore_eos is None else w.ignore_eos,
            list(w.prompt_segments) or None,
            w.min_tokens,
            list(w.stop_token_ids) or None,
        )

    # -- the proxy ------------------------------------------------------------------
    def _send(self, node: NodeRole, message: RequestMessage) -> None:
        self._token_runs.close(message.request_id)
        self._node_of[message.request_id] = node
        arrival = self._proxy_links[node.name][0].transit(self.loop.now(), REQUEST_BYTES)
        if arrival is None:  # the connection broke (an outage outlasted TCP's retransmissions)
            self.loop.call_soon(self._connection_broken, node.name)
            return
        self.loop.at(arrival, self._deliver, node, message)

    def _deliver(self, node: NodeRole, message: RequestMessage) -> None:
        if self._node_of.get(message.request_id) is not node:
            return  # re-routed while in transit (its node died)
        if not node.alive:
            self._finish(message.request_id, "error", f"{node.name} is gone")
            return
        node.on_requests([message])

    # -- clients that go away ------------------------------------------------------------
    def abort(self, request_id: str) -> bool:
        """The client went away: the request ends with finish reason "abort"
        and is aborted in the engine of the node that has it (its blocks are
        freed there, `requests_aborted` counts it); a prompt a prefill node
        still holds for it is released. False if it was already finished."""
        rec = self.records.get(request_id)
        if rec is None or rec.finish_reason is not None:
            return False
        self.requests_aborted += 1
        node = self._node_of.pop(request_id, None)  # a message still in transit is dropped on delivery
        if node is not None and node.alive:
            arrival = self._proxy_links[node.name][0].transit(self.loop.now(), REQUEST_BYTES)
            if arrival is not None:
                self.loop.at(arrival, node.abort, [request_id])
        self._release_at_prefill(request_id)
        self._finish(request_id, "abort")
        return True

    def _build_node(self, role: str, node_spec, group) -> NodeRole:
        """A node with its in-process ports: a fresh process, also when a chaos
        restart brings a killed node back."""
        stage_link = self._new_link(self.spec.links.stage) if group.pp_size > 1 else None
        executor = self._executors[node_spec.name] = VirtualPipelineExecutor(self.loop, group.pp_size, stage_link)
        ports = NodePorts(
            clock=self.loop,
            executor=executor,
            emit=lambda events, name=node_spec.name: self._from_node(name, events),
            sampler=self._sampler,
        )
        if role == "prefill":
            executor.serves_prefill = True
            producer = PrefillNode(node_spec, self._settings, ports, self._on_step, self._debug_invariants)
            producer.loop.keep_timings = False  # on the virtual clock every step takes its run time exactly
            producer.set_address(producer.name)  # in-process, a producer's address is its name
            self._producers[producer.name] = producer
            return producer
        kv = InProcKVTransport(
            node_spec.name,
            self.loop,
            self._producers,
            self._kv_link,  # type: ignore[arg-type]
            self.spec.bytes_per_token,
        )
        node = DecodeNode(node_spec, self._settings, ports, kv, self._on_step, self._debug_invariants)
        node.loop.keep_timings = False  # on the virtual clock every step takes its run time exactly
        forwarder = SteadyDecodeForwarder(self, node, executor)
        self._forwarders.append(forwarder)
        node.loop.fast_forward = forwarder
        self._bulk_outputs(node, self.fast_forward_active)  # a node restarted mid-run
        return node

    @staticmethod
    def _bulk_outputs(node: NodeRole, on: bool) -> None:
        """A decode node's one-token outputs reach the proxy as one
        `SteadyTokens` per step, kept as token runs (token_runs.py), and its
        decode-only steps are scheduled in bulk (engine/bulk_step.py), while
        a batch run takes the fast paths (the paced `serve` driver reads
        records while time passes). v1 only: v0 has its own outputs."""
        scheduler = node.core.scheduler
        if isinstance(scheduler, Scheduler):
            scheduler.bulk_token_outputs = on
            scheduler.sampler = node.core.sampler if on else None  # its bulk steps' (engine/bulk_step.py)

    def _rebuild_routers(self) -> None:
        live_prefill = [n for n in self.prefill_nodes if n.alive]
        live_decode = [n for n in self.decode_nodes if n.alive]
        self.prefill_router = (
            Router(live_prefill, self.spec.routing, NodeRole.load, self._prefill_index) if live_prefill else None
        )
        self.decode_router = (
            Router(live_decode, self.spec.routing, NodeRole.load, self._decode_index) if live_decode else None
        )

    def forget(self, request_id: str) -> None:
        """Drop a finished request's bookkeeping (a long-running server)."""
        self._token_runs.close(request_id)
        for table in (self.records, self._workload, self._node_of, self._prefill_of, self.failures, self.rerouted):
            table.pop(request_id, None)  # type: ignore[attr-defined]

    # -- faults ----------------------------------------------------------------------
    def _release_at_prefill(self, request_id: str) -> None:
        prefill = self._prefill_of.pop(request_id, None)
        if prefill is not None:
            self._release_held(prefill, request_id)

    def _release_held(self, prefill: NodeRole, request_id: str) -> None:
        if prefill.alive and isinstance(prefill, PrefillNode):
            arrival = self._proxy_links[prefill.name][0].transit(self.loop.now(), REQUEST_BYTES)
            if arrival is not None:
                self.loop.at(arrival, prefill.release, [request_id])

    # -- run ---------------------------------------------------------------------------
    def run(self, until: float | None = None, max_events: int | None = 50_000_000) -> RunResult:
        with collector_paused():  # the run and its result (collector.py: why)
            return self._run(until, max_events)

    def _run(self, until: float | None, max_events: int | None) -> RunResult:
        self.fast_forward_active = fast_paths.enabled() and until is None and not self._debug_invariants
        for node in self.decode_nodes:
            self._bulk_outputs(node, self.fast_forward_active)
        try:
            self.loop.run(until=until, max_events=max_events)
        finally:
            self.fast_forward_active = False
            for node in self.decode_nodes:
                self._bulk_outputs(node, False)
            self._token_runs.close_all()
        reports = {name: n.report() for name, n in self.nodes.items() if n.alive}
        steps = [s for r in reports.values() for s in r.steps]
        steps.sort(key=attrgetter("time", "node"))  # (time, node), without a Python call per step
        node_counters = {name: n.counters() for name, n in self.nodes.items()}
        for name, n in self.nodes.items():
            if not n.alive:
                node_counters[name]["killed"] = 1
            if name in self.restarts:
                # The counters are the last process's; earlier ones died with theirs.
                node_counters[name]["restarts"] = self.restarts[name]
        records = [self.records[r] for r in sorted(self.records, key=lambda r: (self.records[r].arrival_time, r))]
        sampler = self._sampler
        errors = check_requests(
            records, sampler.token_at, sampler.eos_token_id, self.spec.decode.engine.max_model_len, self._workload
        )
        node_errors = 0
        for report in reports.values():
            errors.extend(report.invariant_errors)
            node_errors += len(report.invariant_errors)
        # As on Ray (and in `vllm bench serve`), the run lasted until its last
        # request finished; the nodes' tail (freeing held blocks) is not in it.
        ends = [r.finish_time for r in records if r.finish_time is not None]
        done = len(ends) == len(records)
        return RunResult(
            clock="virtual",
            duration=max(ends) if done and ends else self.loop.now(),
            requests=records,
            steps=steps,
            node_counters=node_counters,
            violations=[v for r in reports.values() for v in r.violations],
            invariant_errors=errors,
            trace=self.trace,
            extra={
                "num_events": self.loop.num_events,
                "steps_fast_forwarded": sum(f.steps_forwarded for f in self._forwarders),
                "kv_pulls": kv_pull_summary(node_counters),
                "failures": dict(self.failures),
                "rerouted": dict(self.rerouted),
                "events_rejected": self.events_rejected,
                **(
                    {"chaos": chaos_report(self.chaos_faults, records, errors, node_errors).to_dict()}
                    if self.chaos_faults is not None
                    else {}
                ),
            },
        )


def run_inproc(
    spec: ClusterSpec,
    workload: list[WorkloadRequest],
    seed: int = 0,
    max_concurrency: int | None = None,
    debug_invariants: bool = False,
    trace: bool = False,
) -> RunResult:
    with collector_paused():  # setting up allocates per request too (collector.py); `run` pauses itself
        cluster = InProcCluster(spec, seed=seed, debug_invariants=debug_invariants, trace=trace)
        cluster.submit(workload, max_concurrency)
    return cluster.run()
