"""The in-process runtime: prefill and decode nodes, the proxy in front of
them, the KV transport between them and the load driver, all on one virtual
clock. Deterministic: the same spec, workload and seed give the same trace."""

from __future__ import annotations

from typing import Iterable

from connector.inproc_transport import InProcKVTransport
from connector.link import Link
from engine.outputs import EngineCoreOutput
from engine.records import RequestRecord, WorkloadRequest
from engine.request import Request, SamplingParams

from .des import EventLoop
from .inproc_node import InProcNode
from .invariants import check_run
from .router import Router
from .run_result import RunResult
from .spec import ClusterSpec
from engine.node_core import NodeCore


class InProcCluster:
    def __init__(self, spec: ClusterSpec, seed: int = 0, debug_invariants: bool = False, trace: bool = False,
                 observer=None) -> None:
        """`observer` (optional) gets `on_step(StepRecord)` for every step of
        every node and `on_request_finished(node_name, RequestRecord)`."""
        self.spec = spec
        self.observer = observer
        self.seed = seed
        self.loop = EventLoop()
        self.cost_model = spec.cost()
        self.trace_enabled = trace
        self.trace: list[tuple] = []
        self._link_seed = seed * 1000
        self.nodes: dict[str, InProcNode] = {}
        self.prefill_nodes: list[InProcNode] = []
        self.decode_nodes: list[InProcNode] = []
        for role, node_spec, group in spec.node_specs():
            node_spec.sampler_seed = spec.sampler.seed + seed
            stage_link = self._new_link(spec.links.stage) if group.pp_size > 1 else None
            node = InProcNode(NodeCore(node_spec), self.loop, self.cost_model, stage_link, self._on_outputs, debug_invariants)
            self.nodes[node.name] = node
            (self.prefill_nodes if role == "prefill" else self.decode_nodes).append(node)
        self._kv_links: dict[tuple[str, str], Link] = {}
        self._proxy_links: dict[str, Link] = {n: self._new_link(spec.links.proxy) for n in self.nodes}
        self.transport = InProcKVTransport(
            self.loop.at,
            lambda: self.loop.now,
            self._kv_link,
            self.nodes,
            spec.bytes_per_token,
            spec.kv_pull_timeout_s,
            spec.kv_pull_deadline_s,
        )
        self.transport.on_pull_end = self._on_pull_end
        for node in self.decode_nodes:
            node.start_pull = lambda rs, node=node: self._start_pull(node, rs)
        self.prefill_router = (
            Router(self.prefill_nodes, spec.routing, InProcNode.load) if self.prefill_nodes else None
        )
        self.decode_router = Router(self.decode_nodes, spec.routing, InProcNode.load)
        if observer is not None:
            for node in self.nodes.values():
                node.core.engine.on_step = observer.on_step
        self.records: dict[str, RequestRecord] = {}
        self._workload: dict[str, WorkloadRequest] = {}
        self._decode_node_of: dict[str, InProcNode] = {}
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
            self.trace.append((round(self.loop.now, 9),) + event)

    # -- the load driver ---------------------------------------------------------
    def submit(self, workload: Iterable[WorkloadRequest], max_concurrency: int | None = None) -> None:
        self.max_concurrency = max_concurrency
        for w in workload:
            if w.request_id in self._workload:
                raise ValueError(f"duplicate request id {w.request_id!r} in the workload")
            self._workload[w.request_id] = w
            self.loop.at(w.arrival_time, self._arrive, w)

    def _arrive(self, w: WorkloadRequest) -> None:
        if self.max_concurrency is not None and self._in_flight >= self.max_concurrency:
            self._backlog.append(w)
            return
        self._in_flight += 1
        now = self.loop.now
        self.records[w.request_id] = RequestRecord(w.request_id, now, w.prompt_len, w.output_len, w.priority)
        self._log("arrive", w.request_id)
        if self.prefill_nodes and self.prefill_router is None:
            self._finish(w.request_id, "error")  # every prefill node is gone
            return
        if self.prefill_router is not None:
            node = self.prefill_router.pick()
            self._send(node, self._make_request(w, max_tokens=1, params={"do_remote_decode": True}))
        else:
            node = self.decode_router.pick()
            self._decode_node_of[w.request_id] = node
            self._send(node, self._make_request(w, max_tokens=w.output_len, params=None))

    def _make_request(self, w: WorkloadRequest, max_tokens: int, params: dict | None) -> Request:
        sp = SamplingParams(max_tokens=max_tokens, ignore_eos=self.spec.sampler.ignore_eos)
        node_any = next(iter(self.nodes.values()))
        return Request(
            w.request_id,
            range(w.prompt_len),
            sp,
            eos_token_id=node_any.core.sampler.eos_token_id,
            arrival_time=self.records[w.request_id].arrival_time,
            priority=w.priority,
            kv_transfer_params=params,
        )

    def _send(self, node: InProcNode, request: Request) -> None:
        arrival = self._proxy_links[node.name].transit(self.loop.now, 512)
        self.loop.at(arrival if arrival is not None else self.loop.now, self._deliver, node, request)

    def _deliver(self, node: InProcNode, request: Request) -> None:
        if not node.alive:
            self._finish(request.request_id, "error")
            return
        try:
            node.add_request(request)
        except ValueError as exc:
            # Rejected at the door (e.g. a prompt longer than max_model_len), as
            # vLLM's front end rejects it: the request fails, the node serves on.
            self._log("rejected", request.request_id, str(exc))
            self._finish(request.request_id, "error")

    # -- outputs back through the proxy -------------------------------------------
    def _on_outputs(self, node: InProcNode, outputs: list[EngineCoreOutput]) -> None:
        link = self._proxy_links[node.name]
        now = self.loop.now
        arrival = link.transit(now, 64 * len(outputs), "reverse")
        self.loop.at(arrival if arrival is not None else now, self._proxy_receive, node, outputs)

    def _proxy_receive(self, node: InProcNode, outputs: list[EngineCoreOutput]) -> None:
        now = self.loop.now
        for out in outputs:
            rec = self.records.get(out.request_id)
            if rec is None or rec.finish_reason is not None:
                continue
            if node in self.prefill_nodes:
                if rec.first_scheduled_time is None:
                    rec.first_scheduled_time = node.core.engine.first_scheduled.get(out.request_id)
                if out.finished:
                    if out.kv_transfer_params and out.finish_reason == "length":
                        w = self._workload[out.request_id]
                        dnode = self.decode_router.pick()
                        self._decode_node_of[out.request_id] = dnode
                        self._log("to_decode", out.request_id, dnode.name)
                        self._send(dnode, self._make_request(w, w.output_len, dict(out.kv_transfer_params)))
                    else:
                        # The prompt's first token already ended it (EOS): no
                        # handoff; the client gets that token from the prefill.
                        if out.finish_reason == "stop":
                            rec.output_token_ids.extend(out.new_token_ids)
                            rec.token_times.extend([now] * len(out.new_token_ids))
                        self._finish(out.request_id, out.finish_reason or "error")
                continue
            if rec.first_scheduled_time is None:
                rec.first_scheduled_time = node.core.engine.first_scheduled.get(out.request_id)
            rec.output_token_ids.extend(out.new_token_ids)
            rec.token_times.extend([now] * len(out.new_token_ids))
            if out.finished:
                rec.num_preemptions = out.num_preemptions
                self._finish(out.request_id, out.finish_reason)

    def _finish(self, request_id: str, reason: str) -> None:
        rec = self.records[request_id]
        if rec.finish_reason is not None:
            return
        rec.finish_time = self.loop.now
        rec.finish_reason = reason
        self._log("finish", request_id, reason, len(rec.output_token_ids))
        if self.observer is not None:
            node = self._decode_node_of.get(request_id)
            self.observer.on_request_finished(node.name if node else "proxy", rec)
        self._in_flight -= 1
        if self._backlog:
            self._arrive(self._backlog.pop(0))

    def _start_pull(self, node: InProcNode, recv_spec) -> None:
        rec = self.records.get(recv_spec.request_id)
        if rec is not None:
            rec.remote_kv_wait_start = self.loop.now
        self._log("pull_start", recv_spec.request_id, node.name)
        self.transport.start_pull(node, recv_spec)

    def _on_pull_end(self, request_id: str, landed_at: float, ok: bool) -> None:
        rec = self.records.get(request_id)
        if rec is not None:
            rec.remote_kv_wait_end = landed_at
        self._log("pull_end", request_id, ok)

    # -- faults ----------------------------------------------------------------------
    def kill_node_at(self, name: str, at: float) -> None:
        self.loop.at(at, self._kill, name)

    def _kill(self, name: str) -> None:
        node = self.nodes[name]
        node.kill()
        self._log("kill", name)
        # The proxy stops routing to it (it notices the dead connection).
        live_prefill = [n for n in self.prefill_nodes if n.alive]
        live_decode = [n for n in self.decode_nodes if n.alive]
        self.prefill_router = Router(live_prefill, self.spec.routing, InProcNode.load) if live_prefill else None
        if live_decode:
            self.decode_router = Router(live_decode, self.spec.routing, InProcNode.load)
        # Requests in the middle of a prefill there are lost to the proxy: fail them.
        for req_id in list(node.core.scheduler.requests):
            rec = self.records.get(req_id)
            if rec is not None and rec.finish_reason is None and self._decode_node_of.get(req_id) in (None, node):
                self._finish(req_id, "error")

    # -- run ---------------------------------------------------------------------------
    def run(self, until: float | None = None, max_events: int | None = 50_000_000) -> RunResult:
        self.loop.run(until=until, max_events=max_events)
        steps = [s for n in self.nodes.values() for s in n.core.engine.step_records]
        steps.sort(key=lambda s: (s.time, s.node))
        node_counters = {name: n.core.counters() for name, n in self.nodes.items()}
        for name, n in self.nodes.items():
            node_counters[name]["transport_retries"] = self.transport.stats.retries if n in self.decode_nodes else 0
        violations = [
            {"node": name, **v.to_dict()}
            for name, n in self.nodes.items()
            if n.core.shadow is not None
            for v in n.core.shadow.violations
        ]
        records = [self.records[r] for r in sorted(self.records, key=lambda r: (self.records[r].arrival_time, r))]
        # Requests the driver never released (closed loop) are not lost: they
        # are reported as never started.
        result = RunResult(
            clock="virtual",
            duration=self.loop.now,
            requests=records,
            steps=steps,
            node_counters=node_counters,
            violations=violations,
            trace=self.trace,
            extra={"num_events": self.loop.num_events, "kv_pulls": vars(self.transport.stats).copy()},
        )
        result.invariant_errors = check_run(self, result)
        return result


def run_inproc(spec: ClusterSpec, workload: list[WorkloadRequest], seed: int = 0, max_concurrency: int | None = None,
               debug_invariants: bool = False, trace: bool = False) -> RunResult:
    cluster = InProcCluster(spec, seed=seed, debug_invariants=debug_invariants, trace=trace)
    cluster.submit(workload, max_concurrency)
    return cluster.run()
