"""What every wall-clock node does with the proxy's requests: turn each wire
request into a `Request` for its engine loop, and answer one it cannot take
(e.g. a prompt longer than max_model_len) with a rejection, as vLLM's front
end does — the request fails, the node serves on. Shared by the decode and
the prefill node."""

from __future__ import annotations

from .events import rejection_events, request_from_wire


class ProxyIntakeMixin:
    # Provided by the node: its NodeCore, EngineLoop and Outbox.
    core: object
    loop: object
    outbox: object

    def add_request(self, wire: dict) -> None:
        self.loop.add_request(request_from_wire(wire, self.core.sampler.eos_token_id))

    def _on_requests(self, wires: list[dict]) -> None:
        for wire in wires:
            try:
                self.add_request(wire)
            except ValueError as err:
                self.outbox.put(rejection_events(wire, err))
