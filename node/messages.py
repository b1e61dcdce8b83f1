"""What the proxy and the nodes send each other, typed. Each message has
`to_wire()` (plain lists and dicts: cheap for msgpack and Ray to carry, no
code) and `from_wire()`, which checks the shape and raises `MessageError`
naming what is wrong.

    proxy -> node: RequestMessage            one per request
                   ReleaseMessage            give up requests' held KV blocks
                   AbortMessage              clients went away: abort these requests
    node -> proxy: OutputEvent | KVEvent     in order, batched by the outbox

Times are run seconds.
"""

from __future__ import annotations

import math
import reprlib
from typing import Any, NamedTuple

from engine.outputs import EngineCoreOutput
from engine.prompt import PromptTokens
from engine.request import Request, SamplingParams


class MessageError(ValueError):
    """A message does not have the shape its type requires."""


# Error messages show at most this much of what came in: a peer's input is
# never echoed whole (a 1 MiB request id must not come back in a log line).
_repr = reprlib.Repr()
_repr.maxstring = _repr.maxother = 40
_repr.maxlist = _repr.maxtuple = _repr.maxdict = 4
_repr.maxlevel = 2
MAX_REQUEST_ID_CHARS = 256
MAX_STOP_TOKEN_IDS = 1024


def short(value: Any) -> str:
    """A bounded repr of untrusted input, for error messages."""
    return _repr.repr(value)


def _fields(kind: str, wire: Any, n: int) -> list[Any]:
    if not isinstance(wire, (list, tuple)) or len(wire) != n + 1 or wire[0] != kind:
        raise MessageError(f"expected a {kind!r} message of {n} fields, got {short(wire)}")
    return list(wire[1:])


def _request_id(rid: Any) -> str:
    if not isinstance(rid, str) or not rid or len(rid) > MAX_REQUEST_ID_CHARS:
        raise MessageError(f"request_id={short(rid)} is invalid; allowed: a string of 1..{MAX_REQUEST_ID_CHARS} chars")
    return rid


def _time(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise MessageError(f"{name}={short(value)} is invalid; allowed: a finite number")
    return float(value)


class RequestMessage(NamedTuple):
    request_id: str
    prompt_len: int
    max_tokens: int
    arrival_time: float
    priority: int = 0
    kv_transfer_params: dict[str, Any] | None = None
    ignore_eos: bool = False
    # The prompt's content as (segment key, length) pairs (`engine/prompt.py`),
    # when it shares segments with other prompts; None: content of its own.
    prompt_segments: list[Any] | None = None
    # Sampling a client asked for (the OpenAI front door, `bench/serve/`).
    min_tokens: int = 0
    stop_token_ids: list[int] | None = None

    def to_wire(self) -> list[Any]:
        return ["req", *self]

    @classmethod
    def from_wire(cls, wire: Any) -> RequestMessage:
        fields = _fields("req", wire, 10)
        rid, prompt_len, max_tokens, arrival, priority, params, ignore_eos, segments, min_tokens, stop_ids = fields
        rid = _request_id(rid)
        for name, value in (
            ("prompt_len", prompt_len),
            ("max_tokens", max_tokens),
            ("priority", priority),
            ("min_tokens", min_tokens),
        ):
            if isinstance(value, bool) or not isinstance(value, int):
                raise MessageError(f"{rid}: {name}={short(value)} is invalid; allowed: an integer")
        if params is not None and not isinstance(params, dict):
            raise MessageError(f"{rid}: kv_transfer_params must be a mapping or null")
        if segments is not None and not (
            isinstance(segments, list)
            and all(
                isinstance(s, (list, tuple)) and len(s) == 2 and all(type(x) is int for x in s) and s[1] >= 1
                for s in segments
            )
            and sum(s[1] for s in segments) == prompt_len
        ):
            raise MessageError(f"{rid}: prompt_segments must be [key, length >= 1] pairs summing to prompt_len")
        if stop_ids is not None and not (
            isinstance(stop_ids, list) and len(stop_ids) <= MAX_STOP_TOKEN_IDS and all(type(x) is int for x in stop_ids)
        ):
            raise MessageError(f"{rid}: stop_token_ids must be a list of at most {MAX_STOP_TOKEN_IDS} integers or null")
        return cls(
            rid,
            prompt_len,
            max_tokens,
            _time("arrival_time", arrival),
            priority,
            params,
            bool(ignore_eos),
            [tuple(s) for s in segments] if segments is not None else None,
            min_tokens,
            list(stop_ids) if stop_ids is not None else None,
        )

    def prompt(self) -> PromptTokens:
        """The prompt's tokens: its segments, or content no other prompt shares."""
        return PromptTokens.of(self.request_id, self.prompt_len, self.prompt_segments)

    def to_request(self, eos_token_id: int) -> Request:
        return Request(
            self.request_id,
            self.prompt(),
            SamplingParams(
                max_tokens=self.max_tokens,
                ignore_eos=self.ignore_eos,
                min_tokens=self.min_tokens,
                stop_token_ids=list(self.stop_token_ids or ()),
            ),
            eos_token_id=eos_token_id,
            arrival_time=self.arrival_time,
            priority=self.priority,
            kv_transfer_params=dict(self.kv_transfer_params) if self.kv_transfer_params else None,
        )


class ReleaseMessage(NamedTuple):
    """To a prefill node: the proxy gave these requests up (the decode node
    they went to is gone); free their held blocks now."""

    request_ids: list[str]

    def to_wire(self) -> list[Any]:
        return ["rel", list(self.request_ids)]

    @classmethod
    def from_wire(cls, wire: Any) -> ReleaseMessage:
        (ids,) = _fields("rel", wire, 1)
        if not isinstance(ids, list):
            raise MessageError("release: request_ids must be a list of strings")
        return cls([_request_id(i) for i in ids])


class AbortMessage(NamedTuple):
    """To the node that has these requests: their clients went away; abort
    them in the engine (vLLM's `abort_requests`: blocks freed, finish reason
    "abort"). Ids the node does not know (finished, or never delivered) are
    ignored."""

    request_ids: list[str]

    def to_wire(self) -> list[Any]:
        return ["abort", list(self.request_ids)]

    @classmethod
    def from_wire(cls, wire: Any) -> AbortMessage:
        (ids,) = _fields("abort", wire, 1)
        if not isinstance(ids, list):
            raise MessageError("abort: request_ids must be a list of strings")
        return cls([_request_id(i) for i in ids])


ProxyMessage = RequestMessage | ReleaseMessage | AbortMessage


def proxy_message_from_wire(wire: Any) -> ProxyMessage:
    kind = wire[0] if isinstance(wire, (list, tuple)) and wire else None
    if kind == "rel":
        return ReleaseMessage.from_wire(wire)
    if kind == "abort":
        return AbortMessage.from_wire(wire)
    return RequestMessage.from_wire(wire)


class OutputEvent(NamedTuple):
    """New tokens of a request, and its finish if it finished."""

    request_id: str
    new_token_ids: list[int]
    finish_reason: str | None
    kv_transfer_params: dict[str, Any] | None
    num_preemptions: int
    first_scheduled_time: float | None

    def to_wire(self) -> list[Any]:
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

    def to_wire(self) -> list[Any]:
        return ["kv", *self]


NodeEvent = OutputEvent | KVEvent


def event_from_wire(wire: Any) -> NodeEvent:
    """A node's event as it came off the wire, checked field by field (a
    node's connection is authenticated, but its input is still not trusted
    to be well formed)."""
    kind = wire[0] if isinstance(wire, (list, tuple)) and wire else None
    if kind == "out":
        rid, tokens, reason, params, preemptions, first = _fields("out", wire, 6)
        rid = _request_id(rid)
        if not isinstance(tokens, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in tokens):
            raise MessageError(f"{rid}: new_token_ids must be a list of integers")
        if reason is not None and not isinstance(reason, str):
            raise MessageError(f"{rid}: finish_reason={short(reason)} is invalid; allowed: a string or null")
        if params is not None and not isinstance(params, dict):
            raise MessageError(f"{rid}: kv_transfer_params must be a mapping or null")
        if isinstance(preemptions, bool) or not isinstance(preemptions, int):
            raise MessageError(f"{rid}: num_preemptions={short(preemptions)} is invalid; allowed: an integer")
        return OutputEvent(rid, tokens, reason, params, preemptions, None if first is None else _time("first", first))
    if kind == "kv":
        rid, phase, t, ok = _fields("kv", wire, 4)
        if phase not in ("start", "end"):
            raise MessageError(f"kv event phase={short(phase)} is invalid; allowed: 'start', 'end'")
        return KVEvent(_request_id(rid), phase, _time("time", t), bool(ok))
    raise MessageError(f"unknown node event {short(wire)}; allowed kinds: 'out', 'kv'")
