"""What an in-process run tells a live observer (bench's metrics and stats
logger), as it happens: every step of every node, every finished request."""

from __future__ import annotations

from typing import Protocol

from engine.records import RequestRecord, StepRecord


class RunObserver(Protocol):
    def on_step(self, step: StepRecord) -> None: ...

    def on_request_finished(self, node: str, record: RequestRecord) -> None:
        """`node`: where the request finished ("proxy" if it never reached one)."""
        ...
