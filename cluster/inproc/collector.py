"""Python's cyclic garbage collector, paused while a batch run's event loop
runs (issue 15; docs/fast-paths.md).

A run keeps nearly everything it creates until it ends: requests, their
records and token lists, step records. The collector still scans those
objects over and over as they age through its generations, and finds next
to nothing. On W1 (10,000 requests, benchmarks/inproc_speed.py) its
collections took 0.32 s of a 3.4 s run and freed 679 objects. The cycles
a run does make come from faults (a killed node's structures: ~12,000
objects per chaos run of 800 requests with two kills), so they are bounded
by the faults, not the requests, and the collector frees them as soon as it
runs again after the loop. Reference counting frees everything else as
usual, paused or not.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def collector_paused() -> Iterator[None]:
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        # Objects allocated while paused all count as young: the first
        # collection after the pause would scan every one of them. Moving
        # them to the oldest generation (freeze, then unfreeze) skips that
        # scan; cycles among them are still found by the next full collection.
        gc.freeze()
        gc.unfreeze()
        if was_enabled:
            gc.enable()
