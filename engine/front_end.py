"""vLLM's API server as a FIFO single-server queue, per request.

The OpenAI-compatible server is one process (one asyncio loop, the GIL, and
tokenization on a single-thread executor), in front of the engine core:
- on arrival a request is parsed, its chat template applied and its prompt
  tokenized (`request_ms` + `prompt_token_us` x prompt tokens), then sent
  to the engine core (`ipc_ms`);
- every batch of tokens the engine core emits for a request crosses back
  (`ipc_ms`) and is detokenized and streamed as an SSE chunk
  (`output_token_us` per token).
All of that work is served one item at a time, first come first served: at
1,000 requests at once the 1,000th prompt waits for 999 tokenizations,
which is part of why a simulation without it has TTFT far too short on such
runs. IPC is a latency (ZMQ and msgpack on other threads), not served by the
queue. The numbers and their sources: engine/data/front_end.json and
docs/cost-model.md, "The front end".

Plain and deterministic: no clock of its own; the caller passes `now` and
gets back when the work is done. The proxy calls it on both runtimes: the
request side (`FrontEnd.request_ready_at`) on the one server, the token side
on one `OutputStream` per node (`FrontEnd.output_stream`): the output path
of the API server in front of that node's engine, fed that node's output
batches in the order they reach the proxy. (`FrontEnd.tokens_visible_at`,
one queue for both sides, is what `validate-cost`'s replay uses.)
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
from functools import cache
from typing import Any

from .model_shape import DATA_DIR
from .setting import check_declared, setting

# A term's bound (ms or us): an hour.
MAX_TERM_MS = 3_600_000

FRONT_END_FILE = "front_end.json"
# What a scenario gets unless it says otherwise: the preset fitted on
# published vLLM 0.11 runs (docs/validation.md).
DEFAULT_FRONT_END = "vllm-0.11"


@dataclass(frozen=True)
class FrontEndParams:
    """The API server's per-request and per-token CPU time, and the IPC hop."""

    # Declared here (engine/setting.py); the scenario's `cluster.front_end`
    # overrides a preset's values of them, and the schema validates those;
    # values read from a file (a preset, a fitted set) go through `checked_front_end`.
    request_ms: float = setting(
        0.0, doc="Parse, validate, chat template, stream set-up: per request.", ge=0, le=MAX_TERM_MS
    )
    prompt_token_us: float = setting(0.0, doc="Tokenization: per prompt token.", ge=0, le=MAX_TERM_MS)
    output_token_us: float = setting(0.0, doc="Detokenization and SSE: per output token.", ge=0, le=MAX_TERM_MS)
    ipc_ms: float = setting(
        0.0, doc="API server <-> engine core, one way (a latency, not queued).", ge=0, le=MAX_TERM_MS
    )

    def scaled(self, time_scale: float) -> FrontEndParams:
        """The same terms in run seconds on a wall clock that sleeps
        `time_scale` seconds per modelled second."""
        if time_scale == 1.0:
            return self
        return FrontEndParams(**{f.name: getattr(self, f.name) * time_scale for f in fields(self)})

    @property
    def is_off(self) -> bool:
        return not any(asdict(self).values())


PARAM_NAMES = tuple(f.name for f in fields(FrontEndParams))


def checked_front_end(values: dict[str, Any]) -> FrontEndParams:
    """Terms read from a file (a shipped preset, a fitted set), checked
    against their declarations; the scenario's own go through its schema."""
    for name, value in values.items():
        check_declared(FrontEndParams, name, value, "front_end")
    return FrontEndParams(**values)


@cache
def shipped_front_ends() -> dict[str, dict[str, Any]]:
    """Presets by name (engine/data/front_end.json), each with its `source`."""
    import json

    with open(DATA_DIR / FRONT_END_FILE, encoding="utf-8") as f:
        return {k: v for k, v in json.load(f).items() if not k.startswith("_")}


def front_end_params(preset: str = "off", **overrides: float) -> FrontEndParams:
    """A preset's terms, with any of them overridden; "off" is all zeros."""
    presets = shipped_front_ends()
    if preset not in presets:
        raise ValueError(f"front_end preset={preset!r} is unknown; allowed: {sorted(presets)}")
    unknown = set(overrides) - set(PARAM_NAMES)
    if unknown:
        raise ValueError(f"front_end: unknown field(s) {sorted(unknown)}; allowed: {sorted(PARAM_NAMES)}")
    base = {k: v for k, v in presets[preset].items() if k in PARAM_NAMES}
    return replace(checked_front_end(base), **overrides)


class FrontEnd:
    """One API server. Calls may come in any order of `now`; each item is
    served after every item handed in before it (FIFO), from `now` on."""

    def __init__(self, params: FrontEndParams) -> None:
        self.params = params
        # In seconds, once: the replay of a run calls these per token.
        self._off = params.is_off
        self._request_s = params.request_ms / 1e3
        self._prompt_token_s = params.prompt_token_us / 1e6
        self._output_token_s = params.output_token_us / 1e6
        self._ipc_s = params.ipc_ms / 1e3
        self._free_at = 0.0  # when the server finishes the work it holds
        self.busy_s = 0.0  # total service time handed out (for utilisation)

    def _serve(self, arrives: float, service_s: float) -> float:
        start = arrives if arrives > self._free_at else self._free_at
        self._free_at = start + service_s
        self.busy_s += service_s
        return self._free_at

    def request_ready_at(self, now: float, prompt_len: int) -> float:
        """When the engine gets a request that reached the server at `now`:
        parsed, templated and tokenized in turn, then one IPC hop."""
        if self._off:
            return now
        return self._serve(now, self._request_s + self._prompt_token_s * prompt_len) + self._ipc_s

    def output_stream(self) -> OutputStream:
        """A fresh output side for one node (the proxy keeps one per node)."""
        return OutputStream(self.params)

    def tokens_visible_at(self, now: float, num_tokens: int) -> float:
        """When the client sees `num_tokens` tokens of one request the engine
        emitted at `now`: one IPC hop, then detokenized and streamed in turn."""
        if self._off:
            return now
        return self._serve(now + self._ipc_s, self._output_token_s * num_tokens)


class OutputStream:
    """One node's API server, output side: each batch of outputs its engine
    core emits crosses back (`ipc_ms`), waits for the batches before it, and
    is detokenized and streamed (`output_token_us` per token, every token of
    the batch); the client sees each of the batch's tokens when the batch is
    done (vLLM's output handler detokenizes an engine-core batch before the
    streams it fed write their chunks). One call per batch, in time order:
    the visible time depends only on the batches before it, so the proxy's
    lazy token runs can compute it ahead, at the batch's own receipt."""

    __slots__ = ("is_off", "_ipc_s", "_output_token_s", "_free_at", "pending")

    def __init__(self, params: FrontEndParams) -> None:
        self.is_off = params.output_token_us == 0 and params.ipc_ms == 0
        self._ipc_s = params.ipc_ms / 1e3
        self._output_token_s = params.output_token_us / 1e6
        self._free_at = 0.0
        # Batches served ahead (a bulk receipt that knew of outputs coming
        # as separate events at the same time): receipt time -> visible time.
        self.pending: dict[float, float] = {}

    def batch_visible_at(self, now: float, num_tokens: int) -> float:
        """When the client sees the tokens of a batch of `num_tokens` the
        node's outputs brought to the proxy at `now`. An empty batch changes
        nothing (no tokens: nothing to stream)."""
        if self.is_off or num_tokens <= 0:
            return now
        arrives = now + self._ipc_s
        start = arrives if arrives > self._free_at else self._free_at
        self._free_at = start + self._output_token_s * num_tokens
        return self._free_at

    def batches_visible_at(self, times: list[float], sizes: list[int]) -> list[float]:
        """`batch_visible_at` of each batch in turn (time, tokens), in one
        call: the lazy token runs' form, one per receipt of many steps."""
        if self.is_off:
            return list(times)
        ipc, per_token, free = self._ipc_s, self._output_token_s, self._free_at
        out = []
        for now, n in zip(times, sizes):
            if n <= 0:
                out.append(now)
                continue
            arrives = now + ipc
            free = (arrives if arrives > free else free) + per_token * n
            out.append(free)
        self._free_at = free
        return out
