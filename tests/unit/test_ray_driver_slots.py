"""The Ray load driver's closed loop (cluster/ray/driver.py), without Ray: a
finished request's slot frees at its stamped time — when its client sees the
finish, after the API server streamed the last chunk — not when the event
reaches the driver; the in-process runtime does the same
(cluster/inproc/records.py)."""

from __future__ import annotations

import asyncio

from cluster.ray.driver import LoadDriver
from cluster.wall.clock import RunClock
from engine.records import WorkloadRequest
from proxy.client import Arrived, Finished


def _workload(n: int) -> list[WorkloadRequest]:
    return [WorkloadRequest(f"r{i}", 0.0, 8, 2) for i in range(n)]


def test_a_slot_frees_when_the_client_sees_the_finish():
    async def scenario() -> list[list[str]]:
        submitted: list[list[str]] = []
        driver = LoadDriver(
            lambda batch: submitted.append([s.request_id for s in batch]),
            _workload(3),
            RunClock.starting_now(),
            max_concurrency=1,
        )
        await driver.release_all()
        assert submitted == [["r0"]]
        now = driver.clock.now()
        # r0's finish reached the driver now, but its client sees it 0.3 s later.
        driver.handle([Arrived("r0", now), Finished("r0", "length", now + 0.3, 0, "decode-0")])
        assert driver.finished == 1 and driver.in_flight == 1
        await asyncio.sleep(0.1)
        assert submitted == [["r0"]]  # still held: its client has not seen the finish
        await asyncio.sleep(0.4)
        assert submitted == [["r0"], ["r1"]] and driver.in_flight == 1
        # A finish already seen frees its slot at once.
        now = driver.clock.now()
        driver.handle([Arrived("r1", now), Finished("r1", "length", now, 0, "decode-0")])
        assert submitted == [["r0"], ["r1"], ["r2"]]
        return submitted

    asyncio.run(scenario())


def test_an_open_loop_counts_a_finish_at_once():
    driver = LoadDriver(lambda batch: None, _workload(1), RunClock.starting_now())
    driver.in_flight = 1
    driver.handle([Arrived("r0", 0.0), Finished("r0", "length", driver.clock.now() + 5.0, 0, "decode-0")])
    assert driver.in_flight == 0 and driver.finished == 1
