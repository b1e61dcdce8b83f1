"""What a running `disagg-sim serve` says as it goes.

Start-up (a Ray cluster to launch, actors to place) can take many seconds:
each stage is a line on stderr, so stdout's first line stays the one that
names the URL (scripts read it). Once serving, every few seconds in which
something changed, what it has served: a redrawn status line on a terminal;
plain lines anywhere else (a log, CI, a pipe), as `run`'s progress does,
every `DISAGG_SIM_PROGRESS_S` seconds (5 by default; at least 0.1 here).
"""

from __future__ import annotations

import sys
from typing import Any

from rich.console import Console

from ..progress import plain_interval

# The shortest time between two polls of the server's counts.
MIN_INTERVAL_S = 0.1


def say_starting(what: str) -> None:
    print(f"starting: {what} ...", file=sys.stderr, flush=True)


def served_line(counts: dict[str, Any]) -> str:
    """One line from the front door's `counts` (ServeDriver.query)."""
    finished = counts["num_submitted"] - counts["in_flight"]
    return (
        f"served: {finished} finished, {counts['in_flight']} in flight, {counts['rejected_full']} refused (429), "
        f"{counts['client_aborts']} aborted by their client"
    )


class ServeActivity:
    """`report(counts)` each `interval` seconds; says something only when the counts changed."""

    def __init__(self, console: Console | None = None) -> None:
        self.console = console or Console()
        self.interval = max(MIN_INTERVAL_S, plain_interval())
        self._last: str | None = None
        self._status: Any = None

    def report(self, counts: dict[str, Any]) -> None:
        line = served_line(counts)
        if self._last is None and counts["num_submitted"] == 0 and counts["rejected_full"] == 0:
            return  # nothing yet: no line
        if line == self._last:
            return
        self._last = line
        if not self.console.is_terminal:
            print(line, flush=True)
        elif self._status is None:
            self._status = self.console.status(line)
            self._status.start()
        else:
            self._status.update(line)

    def close(self) -> None:
        if self._status is not None:
            self._status.stop()
            self._status = None
