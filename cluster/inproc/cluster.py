"""The in-process runtime: the prefill and decode roles (the very classes
the Ray actors wrap), the proxy role in front of them (the very class the
Ray proxy actor drives), the KV transport between them and the load
driver, all on one virtual clock. Deterministic: the same spec, workload
and seed give the same trace.

Every node gets the same ports a Ray node gets, implemented on the event
loop: the loop is its `Clock`, a `VirtualPipelineExecutor` its stages, the
proxy link its outbox, an `InProcKVTransport` its KV handoff. The proxy gets
its ports the same way: the loop's time, the proxy links
(`proxy_links.py`), and the clients' records (`records.py`)."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable
from functools import partial
from operator import attrgetter

from connector.link import Link
from decode_node.node import DecodeNode
from engine import fast_paths
from engine.node_core import NodeSpec
from engine.records import RequestRecord, WorkloadRequest
from engine.sampler import DeterministicSampler
from engine.scheduler import Scheduler
from node.ports import NodePorts
from node.role import NodeRole
from prefill_node.node import PrefillNode
from proxy.ports import ProxyPorts
from proxy.proxy import Proxy

from ..chaos import ChaosConfig, Fault, chaos_report
from ..engine_settings import NodeGroup
from ..invariants import check_requests
from ..link_settings import LinkSettings
from ..run_result import RunResult, kv_pull_summary
from ..spec import ClusterSpec, NodePlan
from .clock import EventLoop
from .collector import collector_paused
from .executor import VirtualPipelineExecutor
from .fast_forward import SteadyDecodeForwarder
from .faults import schedule_chaos
from .kv_transport import InProcKVTransport
from .load_driver import LoadDriver
from .observer import RunObserver
from .proxy_links import InProcProxyLinks
from .records import ClientRecords


class InProcCluster:
    def __init__(
        self,
        spec: ClusterSpec,
        seed: int = 0,
        debug_invariants: bool = False,
        trace: bool = False,
        observer: RunObserver | None = None,
        stream: Callable[[list[RequestRecord]], None] | None = None,
        keep_steps: bool = True,
    ) -> None:
        """`observer` (optional) gets `on_step(StepRecord)` for every step of
        every node and `on_request_finished(node_name, RequestRecord)`.

        A fleet (docs/fleet.md): `stream` gets the finished requests' records
        in batches, each batch checked first (the invariants of
        cluster/invariants.py), and the run keeps none of them — its result's
        `requests` is empty; `keep_steps=False`: the nodes keep no step
        records (the result's `steps` is empty, `extra["num_steps"]` counts them)."""
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
        self._settings = spec.node_settings(ticket_key=hashlib.sha256(f"inproc-run/{seed}".encode()).digest())
        self.nodes: dict[str, NodeRole] = {}
        self.prefill_nodes: list[NodeRole] = []
        self.decode_nodes: list[NodeRole] = []
        self._producers: dict[str, PrefillNode] = {}
        self._on_step = observer.on_step if observer is not None else None
        self._debug_invariants = debug_invariants
        self._executors: dict[str, VirtualPipelineExecutor] = {}
        self.chaos_faults: list[Fault] | None = None
        # The steady-decode fast-forward runs only inside `run()` (fast_forward.py).
        self.fast_forward_active = False
        self._forwarders: list[SteadyDecodeForwarder] = []
        # Token ids by position: the nodes' sampler (`NodePorts.sampler`), the
        # client's records of token runs and the end-of-run check share it.
        self._sampler = DeterministicSampler(spec.sampler.seed + seed, spec.sampler.stop_probability)
        self.client = ClientRecords(self._sampler, observer)
        self._stream = stream
        self._keep_steps = keep_steps
        self._stream_errors: list[str] = []
        if stream is not None:
            self.client.on_done_batch = self._check_and_stream
        self.links = InProcProxyLinks(self.loop, self.nodes, self._connection_broken)
        self.proxy = Proxy(
            spec.proxy_settings(),
            ProxyPorts(
                self.loop.now,
                self.links.send,
                self.client,
                self._log if trace else None,
                call_later=lambda delay, fn: self.loop.at(self.loop.now() + delay, fn),
            ),
        )
        self.links.proxy = self.proxy
        self.driver = LoadDriver(self.loop, self.proxy, self.client)
        self._specs: dict[str, NodePlan] = {}
        self.restarts: dict[str, int] = {}
        for plan in spec.node_specs(seed):
            role, node_spec, group = plan
            self._specs[node_spec.name] = plan
            node = self._build_node(role, node_spec, group)
            (self.prefill_nodes if role == "prefill" else self.decode_nodes).append(node)
            self.nodes[node.name] = node
        # The proxy <-> node connections (after the nodes: their links' seeds follow the stage links').
        for n in self.nodes:
            self.links.connect(n, self._new_link(spec.links.proxy))
        self.eos_token_id = self.decode_nodes[0].core.eos_token_id

    def _new_link(self, settings: LinkSettings) -> Link:
        self._link_seed += 1
        return Link(settings.to_spec(), seed=self._link_seed)

    def _kv_link(self, consumer: str, producer: str) -> Link:
        key = (consumer, producer)
        if key not in self._kv_links:
            self._kv_links[key] = self._new_link(self.spec.links.kv)
        return self._kv_links[key]

    def _log(self, *event: str | int | bool) -> None:
        self.trace.append((round(self.loop.now(), 9), *event))

    # -- what clients and servers use ------------------------------------------------------
    def submit(self, workload: Iterable[WorkloadRequest], max_concurrency: int | None = None) -> None:
        self.driver.submit(workload, max_concurrency)

    @property
    def records(self) -> dict[str, RequestRecord]:
        return self.client.records

    @property
    def touched(self) -> set[str] | None:
        """Serving: ids of requests whose record changed (`ClientRecords.touched`)."""
        return self.client.touched

    @touched.setter
    def touched(self, ids: set[str] | None) -> None:
        self.client.touched = ids

    @property
    def requests_aborted(self) -> int:
        return self.proxy.requests_aborted

    def abort(self, request_id: str) -> bool:
        """The client went away (`Proxy.abort`): the request ends with finish
        reason "abort" and is aborted in the engine of the node that has it; a
        prompt a prefill node still holds for it is released. False if it was
        already finished."""
        return self.proxy.abort(request_id)

    def forget(self, request_id: str) -> None:
        """Drop a finished request's record (a long-running server)."""
        self.client.forget(request_id)
        self.proxy.failures.pop(request_id, None)
        self.proxy.rerouted.pop(request_id, None)

    def trim_history(self, keep_steps: int) -> None:
        """A long-running server (`disagg-sim serve`): every live node keeps
        its last `keep_steps` step records and forgets finished requests
        (`NodeCore.trim_history`); KV transports forget their done reports."""
        in_flight = set(self.proxy.requests)
        for node in self.nodes.values():
            if node.alive:
                node.core.trim_history(keep_steps)
            kv = getattr(node, "kv", None)
            if isinstance(kv, InProcKVTransport):
                kv.forget_reports(in_flight)

    # -- nodes ------------------------------------------------------------------------------
    def _build_node(self, role: str, node_spec: NodeSpec, group: NodeGroup) -> NodeRole:
        """A node with its in-process ports: a fresh process, also when a chaos
        restart brings a killed node back."""
        stage_link = self._new_link(self.spec.links.stage) if group.pp_size > 1 else None
        executor = self._executors[node_spec.name] = VirtualPipelineExecutor(self.loop, group.pp_size, stage_link)
        ports = NodePorts(
            clock=self.loop,
            executor=executor,
            emit=partial(self.links.from_node, node_spec.name),
            sampler=self._sampler,
        )
        if role == "prefill":
            executor.serves_prefill = True
            producer = PrefillNode(node_spec, self._settings, ports, self._on_step, self._debug_invariants)
            producer.loop.on_failure = lambda reason, name=node_spec.name: self.loop.call_soon(
                self._node_failed, name, reason
            )
            producer.loop.keep_timings = False  # on the virtual clock every step takes its run time exactly
            producer.set_address(producer.name)  # in-process, a producer's address is its name
            self._producers[producer.name] = producer
            producer.core.engine.record_steps = self._keep_steps
            return producer
        kv = InProcKVTransport(
            node_spec.name,
            self.loop,
            self._producers,
            self._kv_link,
            self._settings.bytes_per_token,
            self._settings.kv_timing,
        )
        node = DecodeNode(node_spec, self._settings, ports, kv, self._on_step, self._debug_invariants)
        node.loop.on_failure = lambda reason, name=node_spec.name: self.loop.call_soon(self._node_failed, name, reason)
        node.loop.keep_timings = False  # on the virtual clock every step takes its run time exactly
        forwarder = SteadyDecodeForwarder(
            self.loop, self.links, self.driver, self.proxy, self._fast_forward_active, node, executor
        )
        self._forwarders.append(forwarder)
        node.loop.fast_forward = forwarder
        self._bulk_outputs(node, self.fast_forward_active)  # a node restarted mid-run
        node.core.engine.record_steps = self._keep_steps
        return node

    def _check_and_stream(self, batch: list[RequestRecord]) -> None:
        """A streamed batch: checked as the end of a run checks every record, then handed on."""
        sampler = self._sampler
        errors = check_requests(
            batch, sampler.token_at, sampler.eos_token_id, self.spec.decode.engine.max_model_len, ()
        )
        self._stream_errors.extend(errors)
        for rec in batch:
            sampler.forget(rec.request_id)  # its cached hash: recomputed should a node still ask
        assert self._stream is not None
        self._stream(batch)

    def _num_steps(self) -> int:
        """Steps scheduled by the nodes now running (a restarted node's count starts again)."""
        return sum(n.core.engine.num_steps for n in self.nodes.values())

    def _fast_forward_active(self) -> bool:
        return self.fast_forward_active

    @staticmethod
    def _bulk_outputs(node: NodeRole, on: bool) -> None:
        """A decode node's one-token outputs reach the proxy as one
        `SteadyTokens` per step, kept as token runs (proxy/token_runs.py), and its
        decode-only steps are scheduled in bulk (engine/bulk_step.py), while
        a batch run takes the fast paths (the paced `serve` driver reads
        records while time passes), and its prompts' hashes deferred past the
        first block. v1 only: v0 has its own outputs."""
        scheduler = node.core.scheduler
        if isinstance(scheduler, Scheduler):
            scheduler.bulk_token_outputs = on
            scheduler.sampler = node.core.sampler if on else None  # its bulk steps' (engine/bulk_step.py)
            # A prompt's blocks past its first cached with their hashes
            # deferred (engine/deferred_hashes.py, "Prompt blocks").
            scheduler.kv_cache_manager.defer_prompt_hashes = node.core.sampler.tokens_at if on else None

    # -- faults -----------------------------------------------------------------------------
    def _check_node(self, name: str) -> None:
        if name not in self.nodes:
            raise ValueError(f"node {name!r} is unknown; allowed: {', '.join(self.nodes)}")

    def kill_node_at(self, name: str, at: float) -> None:
        self._check_node(name)
        self.loop.at(at, self._kill, name, "was killed")

    def restart_node_at(self, name: str, at: float) -> None:
        self._check_node(name)
        self.loop.at(at, self._restart, name)

    def inject_chaos(self, config: ChaosConfig) -> list[Fault]:
        """Plan seeded random faults (`cluster.chaos`) and schedule them; the
        run's result then carries `extra["chaos"]`, the report."""
        self.chaos_faults = schedule_chaos(
            config,
            [n.name for n in self.prefill_nodes],
            [n.name for n in self.decode_nodes],
            self.kill_node_at,
            self.restart_node_at,
            self._kv_link,
            self._executors,
            self._log if self.trace_enabled else None,
        )
        return self.chaos_faults

    def _kill(self, name: str, why: str) -> None:
        """The node's process is gone (`why`: how the proxy learnt it): the
        proxy stops routing to it and moves or fails its requests."""
        node = self.nodes[name]
        if not node.alive:
            return
        node.kill()
        if self.trace_enabled:
            self._log("kill" if why == "was killed" else "disconnected", name)
        self.proxy.node_died(name, why)

    def _node_failed(self, name: str, reason: str) -> None:
        """The node's engine loop stopped on a failure (a broken stage link):
        it is gone to the run, as if killed, and the proxy moves or fails
        its requests with the reason."""
        if self.trace_enabled:
            self._log("failed", name)
        self.proxy.node_died(name, f"failed: {reason}")

    def _connection_broken(self, name: str) -> None:
        """The proxy's connection to a node broke: the node is gone to the run."""
        self._kill(name, "lost its proxy connection")

    def _restart(self, name: str) -> None:
        """A killed node's process comes back: empty pool, empty cache, the
        same address; the proxy routes to it again."""
        old = self.nodes[name]
        if old.alive:
            return
        role, node_spec, group = self._specs[name]
        node = self._build_node(role, node_spec, group)
        self.nodes[name] = node
        group_nodes = self.prefill_nodes if role == "prefill" else self.decode_nodes
        group_nodes[group_nodes.index(old)] = node
        self.restarts[name] = self.restarts.get(name, 0) + 1
        if self.trace_enabled:
            self._log("restart", name)
        self.proxy.node_restarted(name)

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
            self.proxy.flush_token_runs()
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
        streamed = self._stream is not None
        if streamed:
            self.client.flush_done()
        records = [self.records[r] for r in sorted(self.records, key=lambda r: (self.records[r].arrival_time, r))]
        sampler = self._sampler
        errors = check_requests(
            records, sampler.token_at, sampler.eos_token_id, self.spec.decode.engine.max_model_len, self.client.workload
        )
        if streamed:
            assert self._stream is not None
            errors = self._stream_errors + errors
            if records:  # those that never finished: counted, then gone too
                self._stream(records)
        node_errors = 0
        for report in reports.values():
            errors.extend(report.invariant_errors)
            node_errors += len(report.invariant_errors)
        # As on Ray (and in `vllm bench serve`), the run lasted until its last
        # request finished; the nodes' tail (freeing held blocks) is not in it.
        ends = [r.finish_time for r in records if r.finish_time is not None]
        done = len(ends) == len(records)
        if streamed:
            ends = [self.client.last_finish] if self.client.last_finish else []
            records = []
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
                "failures": dict(self.proxy.failures),
                "rerouted": dict(self.proxy.rerouted),
                "events_rejected": self.proxy.events_rejected,
                **(
                    {} if self._keep_steps else {"num_steps": sum(n.core.engine.num_steps for n in self.nodes.values())}
                ),
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
