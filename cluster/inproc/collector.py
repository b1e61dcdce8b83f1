"""Python's cyclic garbage collector, paused while a batch run's event loop
runs (issue 15; docs/fast-paths.md), and made up for between runs.

A run keeps nearly everything it creates until it ends: requests, their
records and token lists, step records. The collector still scans those
objects over and over as they age through its generations, and finds next
to nothing. On W1 (10,000 requests, benchmarks/inproc_speed.py) its
collections took 0.32 s of a 3.4 s run and freed 679 objects. Reference
counting frees everything else as usual, paused or not.

When a pause ends, what was allocated during it moves straight to the oldest
generation (`gc.freeze`, then `gc.unfreeze`): the first collection after the
pause would otherwise scan every object of the run. But a finished run is
garbage with cycles in it (the cluster, its nodes and event loop refer to
each other, and through them to every record), and only a full collection
frees cycles. CPython starts one when the oldest generation has grown by a
quarter since the last, counting only objects that got there by surviving
collections — not the ones moved there by `unfreeze` — so it never would:
a process running one simulation after another (a scenario's variants and
repeats, a sweep, the test suite) kept every earlier run in memory (60
runs of 300 requests on 1P+1D: 55 MB -> 303 MB, +4 MB a run; one
`gc.collect()` then freed it, down to 122 MB).

So the collector is made up for at the start of a pause, outside a run:
when the objects the pauses since the last full collection moved to the
oldest generation exceed a quarter of what that collection left
(`GROWTH_FRACTION`), and `GROWTH_FLOOR`, a full collection runs first
(CPython's own rule, counting what it does not). The count costs nothing:
`gc.get_count()[0]` at the end of a pause is the tracked objects allocated,
net of those freed, since the last collection or freeze. A single run in a fresh process never pays for a
collection; the last run's garbage waits for the next pause (or the
process's end).
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager
from typing import ClassVar

# Growth in tracked objects (since the last full collection) below which no
# collection is made up for: a small run's garbage is not worth a full scan
# of the process each time. A W1 run of 10,000 requests (aggregated) leaves
# ~165,000; a full collection after two of them takes ~0.3 s.
GROWTH_FLOOR = 250_000
# ... and as a share of what the last full collection left (CPython's rule).
GROWTH_FRACTION = 0.25


class _Tracked:
    """Tracked objects left by the last full collection (`base`), and moved to
    the oldest generation by pauses since (`pending`)."""

    # ClassVar: mypyc (docs/compiled.md) compiles a plain class attribute as
    # an instance default, and this class is never instantiated.
    base: ClassVar[int] = 0
    pending: ClassVar[int] = 0


def _tracked_objects() -> int:
    # Moving every tracked object to the permanent generation and back is a
    # splice of two lists; counting them walks one.
    gc.freeze()
    n = gc.get_freeze_count()
    gc.unfreeze()
    return n


def collect_earlier_runs() -> bool:
    """A full collection if earlier runs' garbage is due one (see the module's
    docstring); True if it ran. `collector_paused` calls it on entry; a
    benchmark may call it before it starts timing."""
    if _Tracked.pending <= max(GROWTH_FLOOR, _Tracked.base * GROWTH_FRACTION):
        return False
    gc.collect()  # (runs whether or not the collector is enabled)
    _Tracked.base = _tracked_objects()
    _Tracked.pending = 0
    return True


@contextmanager
def collector_paused() -> Iterator[None]:
    collect_earlier_runs()
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        # Objects allocated while paused all count as young: the first
        # collection after the pause would scan every one of them. Moving
        # them to the oldest generation (freeze, then unfreeze) skips that
        # scan; cycles among them are found by the next full collection
        # (`collect_earlier_runs`). What is moved: the youngest generation's
        # count, which `freeze` resets.
        _Tracked.pending += max(gc.get_count()[0], 0)
        gc.freeze()
        gc.unfreeze()
        if was_enabled:
            gc.enable()
