"""Progress of `disagg-sim run`, per run and within a run (and of
`validate-cost`, per point and within a point: `ItemProgress`).

A terminal gets rich's live bar (runs done, and within the current run the
requests finished and the run's clock). Anything else — a log file, CI, a
pipe — cannot redraw a bar, and rich prints nothing until the end there, so
it gets plain lines instead: one when a run starts and ends, and one every
few seconds of wall time while a run goes on, so a 5-minute Ray run is
never silent.
"""

from __future__ import annotations

import os
import time
from typing import Any, Self

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

# Seconds of wall time between two within-run lines when stdout is not a
# terminal; $DISAGG_SIM_PROGRESS_S sets it (0: a line per finished request).
PLAIN_INTERVAL_S = 5.0


def plain_interval() -> float:
    try:
        return max(0.0, float(os.environ.get("DISAGG_SIM_PROGRESS_S", PLAIN_INTERVAL_S)))
    except ValueError:
        return PLAIN_INTERVAL_S


class RunProgress:
    """`with RunProgress(...) as p:` around a scenario's runs; `starting`,
    `within` and `finished` report them."""

    def __init__(
        self, console: Console, title: str, total_runs: int, clock_label: str = "simulated", unit: str = "runs"
    ) -> None:
        self.console = console
        self.unit = unit
        self.title = title
        self.total = total_runs
        self.clock_label = clock_label
        self.live = console.is_terminal
        self.done = 0
        self._current = ""
        self._t0 = self._last_line = time.monotonic()
        self._bar: Progress | None = None
        self.interval = plain_interval()
        self._task: Any = None

    def __enter__(self) -> Self:
        if self.live:
            self._bar = Progress(
                TextColumn("[bold]{task.description}"),
                BarColumn(),
                TextColumn("{task.completed}/{task.total} " + self.unit),
                TimeElapsedColumn(),
                console=self.console,
                transient=False,
            )
            self._bar.__enter__()
            self._task = self._bar.add_task(self.title, total=self.total)
        return self

    def __exit__(self, *exc) -> None:
        if self._bar is not None:
            self._bar.__exit__(*exc)

    def _plain(self, text: str) -> None:
        self.console.print(text, markup=False, highlight=False, soft_wrap=True)

    def starting(self, variant: str, repeat: int) -> None:
        self._current = f"{variant} r{repeat}"
        self._t0 = self._last_line = time.monotonic()
        if self._bar is not None:
            self._bar.update(self._task, description=f"{self.title}: {self._current}")
        else:
            self._plain(f"run {self.done + 1}/{self.total}: {self._current} ...")

    def within(self, finished: int, total: int, clock_s: float) -> None:
        """Requests finished so far in the current run, and its clock (seconds)."""
        what = f"{finished}/{total} requests finished, {clock_s:.1f} s {self.clock_label}"
        if self._bar is not None:
            self._bar.update(self._task, description=f"{self.title}: {self._current}: {what}")
            return
        now = time.monotonic()
        if now - self._last_line >= self.interval:
            self._last_line = now
            self._plain(f"  {self._current}: {what}")

    def finished(self, result: dict) -> None:
        self.done += 1
        if self._bar is not None:
            self._bar.update(self._task, description=f"{self.title}: {self._current}")
            self._bar.advance(self._task)
            return
        # The run's own wall time (its results JSON's): with --jobs or on a
        # cluster it ran elsewhere, before this line.
        wall = float(result.get("extra", {}).get("wall_seconds", time.monotonic() - self._t0))
        self._plain(
            f"run {self.done}/{self.total}: {self._current} done in {wall:.1f} s: "
            f"{result.get('completed', '?')} completed, {result.get('failed', '?')} failed"
        )


class ItemProgress(RunProgress):
    """Progress over named items that are not runs of a scenario (`validate-cost`'s
    points): `start(name)`, `within(...)` while it runs, `finish(summary)`; plain
    lines "point 3/24: NAME ..." and "point 3/24: NAME done in 2.1 s: SUMMARY"
    when stdout is not a terminal, else the bar with each summary printed above it."""

    def __init__(self, console: Console, title: str, total: int, noun: str) -> None:
        super().__init__(console, title, total, unit=f"{noun}s")
        self.noun = noun

    def start(self, name: str) -> None:
        self._current = name
        self._t0 = self._last_line = time.monotonic()
        if self._bar is not None:
            self._bar.update(self._task, description=f"{self.title}: {name}")
        else:
            self._plain(f"{self.noun} {self.done + 1}/{self.total}: {name} ...")

    def finish(self, summary: str) -> None:
        self.done += 1
        wall = time.monotonic() - self._t0
        if self._bar is not None:
            self._bar.advance(self._task)
            self._plain(f"{self._current}: {summary}")
        else:
            self._plain(f"{self.noun} {self.done}/{self.total}: {self._current} done in {wall:.1f} s: {summary}")


class FinishWatch:
    """An in-process run's observer that counts finished requests for
    `RunProgress.within`, passing every hook on to the run's own observer
    (bench/observe.py's) when there is one. No step hook of its own: a call
    per step would cost the fast paths."""

    def __init__(self, inner: Any, total: int, report) -> None:
        self.inner = inner
        self.total = total
        self.report = report
        self.finished = 0
        self.on_step = inner.on_step if inner is not None else None

    def on_request_finished(self, node_name: str, rec) -> None:
        if self.inner is not None:
            self.inner.on_request_finished(node_name, rec)
        self.finished += 1
        self.report(self.finished, self.total, rec.finish_time or 0.0)
