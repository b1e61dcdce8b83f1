"""What the proxy and the nodes send each other, typed. Each message has
`to_wire()` (plain lists and dicts: cheap for msgpack and Ray to carry, no
code) and `from_wire()`, which checks the shape and raises `MessageError`
naming what is wrong.

    proxy -> node: RequestMessage            one per request
    node -> proxy: OutputEvent | KVEvent     in order, batched by the outbox

Times are run seconds.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from engine.outputs import EngineCoreOutput
from engine.request import Request, SamplingParams


class MessageError(ValueError):
    """A message does not have the shape its type requires."""


def _fields(kind: str, wire: Any, n: int) -> list:
    if not isinstance(wire, (list, tuple)) or len(wire) != n + 1 or wire[0] != kind:
        shown = repr(wire)
        raise MessageError(f"expected a {kind!r} message of {n} fields, got {shown[:120]}")
    return list(wire[1:])


class RequestMessage(NamedTuple):
    request_id: str
    prompt_len: int
    max_tokens: int
    arrival_time: float
    priority: int = 0
    kv_transfer_params: dict | None = None
    ignore_eos: bool = False

    def to_wire(self) -> list:
        return ["req", *self]

    @classmethod
    def from_wire(cls, wire: Any) -> RequestMessage:
        rid, prompt_len, max_tokens, arrival, priority, params, ignore_eos = _fields("req", wire, 7)
        if not isinstance(rid, str) or not rid:
            raise MessageError(f"request_id={rid!r} is invalid; allowed: a non-empty string")
        for name, value in (("prompt_len", prompt_len), ("max_tokens", max_tokens), ("priority", priority)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise MessageError(f"{rid}: {name}={value!r} is invalid; allowed: an integer")
        if params is not None and not isinstance(params, dict):
            raise MessageError(f"{rid}: kv_transfer_params must be a mapping or null")
        return cls(rid, prompt_len, max_tokens, float(arrival), priority, params, bool(ignore_eos))

    def to_request(self, eos_token_id: int) -> Request:
        return Request(
            self.request_id,
            range(self.prompt_len),
            SamplingParams(max_tokens=self.max_tokens, ignore_eos=self.ignore_eos),
            eos_token_id=eos_token_id,
            arrival_time=self.arrival_time,
            priority=self.priority,
            kv_transfer_params=dict(self.kv_transfer_params) if self.kv_transfer_params else None,
        )


class OutputEvent(NamedTuple):
    """New tokens of a request, and its finish if it finished."""

    request_id: str
    new_token_ids: list[int]
    finish_reason: str | None
    kv_transfer_params: dict | None
    num_preemptions: int
    first_scheduled_time: float | None

    def to_wire(self) -> list:
        return ["out", *self]

    @classmethod
    def from_core(cls, out: EngineCoreOutput, first_scheduled_time: float | None) -> OutputEvent:
        return cls(
            out.request_id,
            list(out.new_token_ids),
            out.finish_reason,
            out.kv_transfer_params,
            out.num_preemptions,
            first_scheduled_time,
        )

    @classmethod
    def rejected(cls, request_id: str, error: Exception) -> OutputEvent:
        """A request the node refused to take: it finishes with "error" at once."""
        return cls(request_id, [], "error", {"rejected": str(error)}, 0, None)


class KVEvent(NamedTuple):
    """A KV load of a request started or ended (ok: it landed)."""

    request_id: str
    phase: str  # "start" | "end"
    time: float
    ok: bool

    def to_wire(self) -> list:
        return ["kv", *self]


NodeEvent = OutputEvent | KVEvent


def event_from_wire(wire: Any) -> NodeEvent:
    kind = wire[0] if isinstance(wire, (list, tuple)) and wire else None
    if kind == "out":
        rid, tokens, reason, params, preemptions, first = _fields("out", wire, 6)
        return OutputEvent(rid, list(tokens), reason, params, preemptions, first)
    if kind == "kv":
        rid, phase, t, ok = _fields("kv", wire, 4)
        return KVEvent(rid, phase, t, ok)
    raise MessageError(f"unknown node event {str(wire)[:80]!r}; allowed kinds: 'out', 'kv'")
