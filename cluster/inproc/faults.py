"""Chaos mode on the in-process runtime: a seeded plan of faults
(`cluster/chaos.py`) scheduled on the nodes and links. Kills and restarts
are the cluster's (`InProcCluster.kill_node_at`, `restart_node_at`); what the
proxy does when a node is gone is the proxy role's (`Proxy.node_died`)."""

from __future__ import annotations

from collections.abc import Callable

from connector.link import Link

from ..chaos import ChaosConfig, Fault, plan_faults
from .executor import VirtualPipelineExecutor


def schedule_chaos(
    config: ChaosConfig,
    prefill: list[str],
    decode: list[str],
    kill_at: Callable[[str, float], None],
    restart_at: Callable[[str, float], None],
    kv_link: Callable[[str, str], Link],
    executors: dict[str, VirtualPipelineExecutor],
    log: Callable[..., None] | None,
) -> list[Fault]:
    """Plan the faults and schedule them: kills and restarts of nodes,
    partitions and loss bursts on the KV links (consumer>producer), slow
    pipeline stages."""
    faults = plan_faults(config, prefill, decode)
    for fault in faults:
        end = fault.at + fault.duration
        if fault.kind == "kill":
            kill_at(fault.target, fault.at)
        elif fault.kind == "restart":
            restart_at(fault.target, fault.at)
        elif fault.kind in ("partition", "loss_burst"):
            consumer, producer = fault.target.split(">")
            link = kv_link(consumer, producer)
            for line in (link.forward, link.reverse):
                line.add_fault(fault.at, end, fault.loss)
        elif fault.kind == "slow_stage":
            executors[fault.target].slow_windows.append((fault.at, end, fault.factor))
        if log is not None:
            log("chaos", fault.kind, fault.target, fault.at, fault.duration)
    return faults
