"""The virtual-clock event loop: same-time order, cancelled timers,
`first_live` (what the steady-decode fast-forward reads of the queue), and
events scheduled in bulk (`at_each`) running where one by one they would."""

from __future__ import annotations

import random

from cluster.inproc.clock import EventLoop


def test_events_due_at_one_time_run_in_scheduling_order():
    loop = EventLoop()
    ran: list[str] = []
    loop.at(1.0, ran.append, "b")
    loop.at(0.5, ran.append, "a")
    loop.at(1.0, ran.append, "c")
    loop.run()
    assert ran == ["a", "b", "c"]
    assert loop.now() == 1.0


def test_a_cancelled_timer_neither_runs_nor_moves_the_clock():
    loop = EventLoop()
    ran: list[str] = []
    loop.at(1.0, ran.append, "x")
    loop.call_at(5.0, ran.append, "never").cancel()
    loop.run()
    assert ran == ["x"]
    assert loop.now() == 1.0
    assert loop.num_events == 1


def test_first_live_passes_over_cancelled_timers_and_keeps_the_queue():
    loop = EventLoop()
    timers = [loop.call_at(t, print) for t in (0.1, 0.2, 0.3, 0.4)]
    loop.at(0.25, print, "a")
    loop.at(0.5, print, "b")
    for timer in timers[:3]:
        timer.cancel()
    live = loop.first_live(4)
    assert [e[0] for e in live] == [0.25, 0.4, 0.5]  # fewer than 4 live events exist
    assert loop.pending == 6
    assert [e[0] for e in loop.first_live(1)] == [0.25]
    assert EventLoop().first_live(4) == []


def test_first_live_is_the_order_the_loop_runs_them_in():
    for seed in range(30):
        rng = random.Random(seed)
        loop = EventLoop()
        for _ in range(rng.randint(0, 60)):
            t = rng.choice([0.0, 1.0, 2.0]) if rng.random() < 0.3 else rng.uniform(0, 3)
            if rng.random() < 0.5:
                timer = loop.call_at(t, print)
                if rng.random() < 0.6:
                    timer.cancel()
            else:
                loop.at(t, print)
            if rng.random() < 0.1:
                loop.at_each([rng.uniform(0, 3) for _ in range(3)], print, [(), (), ()])
        queued = list(loop._heap) + list(loop._sorted)
        expected = sorted(e for e in queued if e[2] is not loop._fire or not e[3][0].cancelled)
        for k in (1, 4, 10):
            assert loop.first_live(k) == expected[:k], seed


def _scripted(bulk: bool, seed: int) -> tuple[list, list]:
    """One random script of events, with the arrivals scheduled in bulk or one by one."""
    rng = random.Random(seed)
    loop = EventLoop()
    ran: list = []
    seen: list = []

    def handler(label: str, depth: int) -> None:
        ran.append((label, loop.now()))
        # (Not `pending`: it counts cancelled timers until they are dropped, which may differ.)
        seen.append((loop.next_time(), [e[0] for e in loop.first_live(3)]))
        if depth < 2 and rng.random() < 0.7:  # events scheduled while running, ties included
            t = loop.now() + rng.choice([0.0, 0.0, 0.5, rng.uniform(0, 2)])
            loop.at(t, handler, f"{label}.{depth}", depth + 1)
        if rng.random() < 0.2:
            loop.call_at(loop.now() + rng.uniform(0, 1), handler, f"{label}.t", 2).cancel()

    loop.at(0.0, handler, "first", 0)
    times = [rng.choice([0.0, 1.0, 1.5]) if rng.random() < 0.4 else rng.uniform(0, 4) for _ in range(25)]
    labels = [(f"arrival{i}", 0) for i in range(len(times))]
    if bulk:
        loop.at_each(times, handler, labels)
    else:
        for t, label in zip(times, labels):
            loop.at(t, handler, *label)
    loop.at(1.0, handler, "after", 0)
    loop.run(until=2.0)
    loop.run()
    return ran, seen


def test_events_scheduled_in_bulk_run_where_one_by_one_they_would():
    for seed in range(40):
        assert _scripted(True, seed) == _scripted(False, seed), seed


def test_a_heap_of_mostly_cancelled_timers_drops_them_and_runs_the_same():
    loop = EventLoop()
    ran: list = []
    timers = [loop.call_at(100.0 + i, ran.append, ("timer", i)) for i in range(300)]
    loop.at(1.0, ran.append, ("event", 1))
    for i, timer in enumerate(timers):
        if i % 10:
            timer.cancel()  # 270 of 300: most of the heap
    assert loop.pending < 100  # they went
    assert [e[0] for e in loop.first_live(3)] == [1.0, 100.0, 110.0]
    timers[0].cancel()
    loop.run()
    assert ran == [("event", 1)] + [("timer", i) for i in range(10, 300, 10)]


def test_events_scheduled_in_bulk_from_a_running_event_run_once_in_that_run():
    loop = EventLoop()
    ran: list = []
    loop.at_each([1.0, 3.0], ran.append, [(1.0,), (3.0,)])
    loop.at(2.0, lambda: loop.at_each([2.5], ran.append, [(2.5,)]))
    loop.run()
    assert ran == [1.0, 2.5, 3.0] and loop.pending == 0


def test_run_until_stops_before_later_events_of_either_queue_and_resumes_them():
    loop = EventLoop()
    ran: list[str] = []
    loop.at_each([1.0, 3.0], ran.append, [("bulk-1",), ("bulk-3",)])
    loop.at(2.0, ran.append, "heap-2")
    loop.at(4.0, ran.append, "heap-4")
    loop.run(until=2.0)  # an event at exactly `until` runs
    assert ran == ["bulk-1", "heap-2"]
    assert loop.now() == 2.0 and loop.num_events == 2
    loop.advance_to(3.5)
    assert ran == ["bulk-1", "heap-2", "bulk-3"]
    assert loop.now() == 3.5
    loop.run()
    assert ran[-1] == "heap-4" and loop.num_events == 4


def test_the_event_budget_stops_a_run_that_does_not_converge_and_counts_what_ran():
    loop = EventLoop()

    def again() -> None:
        loop.call_soon(again)

    loop.call_soon(again)
    try:
        loop.run(max_events=25)
    except RuntimeError as err:
        assert "event budget of 25 exhausted" in str(err)
    else:
        raise AssertionError("the budget did not stop the run")
    assert loop.num_events == 25


def test_an_event_that_raises_leaves_the_count_at_the_events_that_completed():
    loop = EventLoop()
    loop.at(1.0, lambda: None)

    def boom() -> None:
        raise ValueError("handler failed")

    loop.at(2.0, boom)
    loop.at(3.0, lambda: None)
    try:
        loop.run()
    except ValueError:
        pass
    assert loop.num_events == 1 and loop.now() == 2.0
    loop.run()  # the rest of the queue runs on
    assert loop.num_events == 2 and loop.now() == 3.0
