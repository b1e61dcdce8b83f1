"""What nodes and the proxy send each other, as plain tuples and dicts (cheap
to pickle through Ray), and the outbox that batches a node's events.

Proxy -> node, one dict per request (`request_to_wire` / `request_from_wire`).
Node -> proxy, a list of events per flush (`proxy_channel.py` carries both):

    ("out", request_id, new_token_ids, finish_reason, kv_transfer_params,
            num_preemptions, first_scheduled_time)
    ("kv",  request_id, "start" | "end", time, ok)

Times are run seconds (see `wall_clock.RunClock`). On the wire tuples
become lists; readers index, never compare with tuples.
"""

from __future__ import annotations

import asyncio
from typing import Callable

from engine.engine_core import EngineCore
from engine.outputs import EngineCoreOutput
from engine.request import Request, SamplingParams


def request_to_wire(request_id: str, prompt_len: int, max_tokens: int, arrival_time: float,
                    priority: int = 0, kv_transfer_params: dict | None = None, ignore_eos: bool = False) -> dict:
    return {
        "request_id": request_id,
        "prompt_len": prompt_len,
        "max_tokens": max_tokens,
        "arrival_time": arrival_time,
        "priority": priority,
        "kv_transfer_params": kv_transfer_params,
        "ignore_eos": ignore_eos,
    }


def request_from_wire(wire: dict, eos_token_id: int) -> Request:
    params = wire.get("kv_transfer_params")
    return Request(
        wire["request_id"],
        range(wire["prompt_len"]),
        SamplingParams(max_tokens=wire["max_tokens"], ignore_eos=wire.get("ignore_eos", False)),
        eos_token_id=eos_token_id,
        arrival_time=wire["arrival_time"],
        priority=wire.get("priority", 0),
        kv_transfer_params=dict(params) if params else None,
    )


def output_events(engine: EngineCore, outputs: list[EngineCoreOutput]) -> list[tuple]:
    first = engine.first_scheduled
    return [
        ("out", o.request_id, list(o.new_token_ids), o.finish_reason, o.kv_transfer_params,
         o.num_preemptions, first.get(o.request_id))
        for o in outputs
    ]


def rejection_events(wire: dict, error: Exception) -> list[tuple]:
    """A request the node refused to take: it finishes with "error" at once."""
    return [("out", wire["request_id"], [], "error", {"rejected": str(error)}, 0, None)]


class Outbox:
    """Collects a node's events and hands them to `send` once per event-loop
    pass, so the steps that finish together cost one message, in order."""

    def __init__(self, send: Callable[[list[tuple]], None]) -> None:
        self.send = send
        self._pending: list[tuple] = []
        self._scheduled = False
        self.num_messages = 0

    def put(self, events: list[tuple]) -> None:
        if not events:
            return
        self._pending.extend(events)
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self.flush)

    def flush(self) -> None:
        self._scheduled = False
        if self._pending:
            events, self._pending = self._pending, []
            self.num_messages += 1
            self.send(events)
