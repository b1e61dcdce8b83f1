"""The node classes are plain: a prefill node, a decode node (with its
pipeline stage workers) and the proxy run here in one event loop, over real
gRPC and framed TCP on 127.0.0.1, without Ray. Fast, and it pins what the
Ray actors only forward."""

from __future__ import annotations

import asyncio
import time

import pytest

from cluster.invariants import check_tokens
from cluster.ray.driver import LoadDriver
from cluster.ray.proxy import ProxyServer
from cluster.wall.clock import RunClock
from cluster.wall.node_host import WallNodeHost, WallNodeSettings
from cluster.wall.stage_worker import StageStreamExecutor, StageWorker
from engine.sampler import DeterministicSampler

from .conftest import make_spec, workload

pytestmark = pytest.mark.timeout(60)


async def run_local(spec, wl, seed=0, use_stage_workers=False):
    """The Ray runtime's topology in one process, the node hosts the Ray
    actors wrap; returns (driver, {name: host})."""
    names = [(role, ns) for role, ns, _ in spec.node_specs(seed)]
    settings = WallNodeSettings(
        node=spec.node_settings(spec.time_scale), stage_link=spec.links.stage.to_spec(), kv_link=spec.links.kv.to_spec()
    )
    nodes, stages = {}, []
    for role, ns in names:
        runner = None
        if role == "decode" and use_stage_workers:
            pp = ns.pipeline_parallel_size
            workers = [StageWorker(i, pp, ns.sampler_seed, link_to_next=settings.stage_link) for i in range(pp)]
            addresses = [await w.serve() for w in workers]
            for i in range(pp - 1):
                await workers[i].connect_next(*addresses[i + 1])
            stages.extend(workers)
            runner = StageStreamExecutor(addresses[0], addresses[-1], pp)
        host = WallNodeHost(role, ns, settings, runner=runner)
        await host.start()
        nodes[ns.name] = host
    start_wall = time.time() + 0.05
    events: list = []
    server = ProxyServer(
        spec,
        seed,
        RunClock.from_wall_start(start_wall),
        [ns.name for r, ns in names if r == "prefill"],
        [ns.name for r, ns in names if r == "decode"],
        events.extend,
    )
    address = await server.start("127.0.0.1")
    for worker in stages:
        worker.begin(start_wall)
    for node in nodes.values():
        await node.begin(start_wall, address)
    driver = LoadDriver(server.submit, wl, RunClock.from_wall_start(start_wall))
    release = asyncio.ensure_future(driver.release_all())
    while driver.finished < len(wl):
        await asyncio.sleep(0.01)
        batch, events[:] = list(events), []
        driver.handle(batch)
    release.cancel()
    for node in nodes.values():
        while node.busy():
            await asyncio.sleep(0.01)
    for node in nodes.values():
        await node.close()
    for worker in stages:
        await worker.close()
    await server.close()
    return driver, nodes


def _check(driver, nodes, spec, seed, n):
    sampler = DeterministicSampler(spec.sampler.seed + seed)
    records = list(driver.records.values())
    assert len(records) == n and {r.finish_reason for r in records} == {"length"}
    for rec in records:
        assert check_tokens(rec, sampler.token_at, sampler.eos_token_id) == []
    for host in nodes.values():
        report = host.report()
        assert report.invariant_errors == []  # blocks conserved, all returned, nothing held or deferred
        assert report.counters["kv_corruptions_detected"] == 0


@pytest.mark.parametrize("pp_size, stage_workers", [(1, False), (1, True), (2, True)])
def test_prefill_and_decode_nodes_serve_requests_without_ray(pp_size, stage_workers):
    spec = make_spec(
        decode={"count": 1, "pp_size": pp_size, "engine": {"num_gpu_blocks": 1000, "async_scheduling": True}},
        links={"kv": {"delay_ms": 1.0}, "stage": {"delay_ms": 0.5}},
        time_scale=0.05,
    )
    wl = workload(8, 70, 12, gap_s=0.01)
    driver, nodes = asyncio.run(asyncio.wait_for(run_local(spec, wl, seed=2, use_stage_workers=stage_workers), 45))
    _check(driver, nodes, spec, 2, len(wl))
    decode, prefill = nodes["decode-0"].report(), nodes["prefill-0"].report()
    assert decode.counters["kv_blocks_verified"] == 8 * 5  # ceil(70 / 16) blocks per prompt
    assert decode.counters["kv_blocks_pulled"] == 8 * 5
    assert decode.counters["stage_token_mismatches"] == 0
    assert prefill.counters["kv_done_reports"] == 8
    # Steps were modelled, and slept scaled: each step record carries its modelled duration.
    assert all(s.duration >= 0 for s in decode.steps) and any(s.duration > 0 for s in decode.steps)
    assert any(t.run_s == pytest.approx(t.modelled_s * 0.05) and t.modelled_s > 0 for t in decode.timings)
