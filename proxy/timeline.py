"""The proxy's side of the P/D timeline (vLLM's disaggregated proxy,
docs/cost-model.md "The P/D hand-off"): the HTTP legs it spends between a
client's request and the decode node's first token, and where the API
server's front end plugs in.

    arrival -> front end ready     `FrontEnd.request_ready_at` (parse, template, tokenize, IPC)
            -> prefill request     `prefill_request_s`: the prompt-only request
                                   (`max_tokens=1`, `do_remote_decode`) to a
                                   prefill instance's HTTP server
    prefill output at the proxy
            -> decode request      `prefill_reply_s` (the prefill's response with
                                   `kv_transfer_params` back through the proxy) +
                                   `decode_request_s` (the second request, with
                                   those params, to a decode instance)

A delay is an event the runtime schedules (`ProxyPorts.call_later`, run
seconds: the wall-clock runtime hands the proxy its timeline `scaled` by
`time_scale`); with every term 0 the proxy acts at once, as before the model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from engine.front_end import FrontEndParams, OutputStream
from engine.setting import MAX_TERM_S, setting


@dataclass(frozen=True)
class ProxyTimeline:
    """The legs, declared here (engine/setting.py); the scenario's
    `cluster.kv_transfer` overrides a preset's values of them."""

    prefill_request_s: float = setting(
        0.0, doc="The proxy's HTTP leg: the prompt-only request to a prefill instance.", ge=0, le=MAX_TERM_S
    )
    prefill_reply_s: float = setting(
        0.0, doc="The prefill's reply with kv_transfer_params, back through the proxy.", ge=0, le=MAX_TERM_S
    )
    decode_request_s: float = setting(
        0.0, doc="The second request, with those params, to a decode instance.", ge=0, le=MAX_TERM_S
    )

    def scaled(self, time_scale: float) -> ProxyTimeline:
        """The same legs in run seconds on a wall clock that sleeps
        `time_scale` seconds per modelled second."""
        return ProxyTimeline(
            self.prefill_request_s * time_scale, self.prefill_reply_s * time_scale, self.decode_request_s * time_scale
        )

    @property
    def handoff_s(self) -> float:
        """From the prefill's output at the proxy to the decode request leaving it."""
        return self.prefill_reply_s + self.decode_request_s


class FrontEnd(Protocol):
    """The API server's time (`engine/front_end.py`): when a request that
    reached the server at `now` is ready to route (parse, chat template,
    tokenization, IPC), and, per node, the output side that says when the
    tokens of a batch of that node's outputs reach the client
    (IPC, detokenization, SSE)."""

    def request_ready_at(self, now: float, prompt_len: int) -> float: ...

    def output_stream(self) -> OutputStream: ...


class NoFrontEnd:
    """No API-server time: the engine gets a request when it is submitted,
    the client a token when it reaches the proxy."""

    def request_ready_at(self, now: float, prompt_len: int) -> float:
        return now

    def output_stream(self) -> OutputStream:
        return OutputStream(FrontEndParams())
