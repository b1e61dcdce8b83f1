"""Faults on the in-process runtime: node kills and restarts, the proxy
noticing a node is gone (its prompts fail, its decode requests move to a
live decode node), and chaos mode's seeded plan (`cluster/chaos.py`) applied
to the nodes and links. A mixin of `InProcCluster`, kept apart from the
load driver and the proxy it acts on."""

from __future__ import annotations

from typing import TYPE_CHECKING

from node.messages import RequestMessage
from node.role import NodeRole

from ..chaos import ChaosConfig, Fault, plan_faults

if TYPE_CHECKING:
    from .cluster import InProcCluster


class FaultsMixin:
    # `self` is an InProcCluster: the attributes used here are its own.
    def restart_node_at(self: InProcCluster, name: str, at: float) -> None:
        if name not in self.nodes:
            raise ValueError(f"node {name!r} is unknown; allowed: {', '.join(self.nodes)}")
        self.loop.at(at, self._restart, name)

    def _restart(self: InProcCluster, name: str) -> None:
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
        self._log("restart", name)
        self._rebuild_routers()

    def kill_node_at(self: InProcCluster, name: str, at: float) -> None:
        if name not in self.nodes:
            raise ValueError(f"node {name!r} is unknown; allowed: {', '.join(self.nodes)}")
        self.loop.at(at, self._kill, name)

    def inject_chaos(self: InProcCluster, config: ChaosConfig) -> list[Fault]:
        """Plan seeded random faults (`cluster.chaos`) and schedule them; the
        run's result then carries `extra["chaos"]`, the report."""
        faults = plan_faults(config, [n.name for n in self.prefill_nodes], [n.name for n in self.decode_nodes])
        for fault in faults:
            end = fault.at + fault.duration
            if fault.kind == "kill":
                self.kill_node_at(fault.target, fault.at)
            elif fault.kind == "restart":
                self.restart_node_at(fault.target, fault.at)
            elif fault.kind in ("partition", "loss_burst"):
                consumer, producer = fault.target.split(">")
                link = self._kv_link(consumer, producer)
                for line in (link.forward, link.reverse):
                    line.add_fault(fault.at, end, fault.loss)
            elif fault.kind == "slow_stage":
                self._executors[fault.target].slow_windows.append((fault.at, end, fault.factor))
            self._log("chaos", fault.kind, fault.target, fault.at, fault.duration)
        self.chaos_faults = faults
        return faults

    def _kill(self: InProcCluster, name: str) -> None:
        node = self.nodes[name]
        if not node.alive:
            return
        node.kill()
        self._log("kill", name)
        self._node_gone(node, "was killed")

    def _connection_broken(self: InProcCluster, name: str) -> None:
        """The proxy's connection to a node broke: the node is gone to the run."""
        node = self.nodes[name]
        if node.alive:
            node.kill()
            self._log("disconnected", name)
            self._node_gone(node, "lost its proxy connection")

    def _node_gone(self: InProcCluster, node: NodeRole, why: str) -> None:
        self._token_runs.close_node(node.name)
        # The proxy stops routing to it (it notices the dead connection).
        self._rebuild_routers()
        lost = [r for r, at in self._node_of.items() if at is node and self.records[r].finish_reason is None]
        for req_id in lost:
            if node.role == "decode" and self.decode_router is not None:
                self._reroute(req_id)
            else:
                # A prompt being prefilled there is lost with it (or no decode node is left).
                self._release_at_prefill(req_id)
                self._finish(req_id, "error", f"{node.name} {why}")

    def _reroute(self: InProcCluster, request_id: str) -> None:
        """A request whose decode node died goes to a live one, computed there
        from scratch: its prompt plus the tokens the client already has, for
        the tokens still to come (sampling is per position, so they continue
        the stream exactly). The prefill node's blocks for it are released."""
        assert self.decode_router is not None
        self._release_at_prefill(request_id)
        w, rec = self._workload[request_id], self.records[request_id]
        delivered = len(rec.output_token_ids)
        if delivered >= w.output_len:
            self._finish(request_id, "error", "its decode node died after the last token")
            return
        self.rerouted[request_id] = self.rerouted.get(request_id, 0) + 1
        dnode = self._pick(self.decode_router, self._workload[request_id])
        self._log("reroute", request_id, dnode.name, delivered)
        message = RequestMessage(
            request_id,
            w.prompt_len + delivered,
            w.output_len - delivered,
            rec.arrival_time,
            w.priority,
            None,
            self.spec.sampler.ignore_eos,
        )
        self._send(dnode, message)
