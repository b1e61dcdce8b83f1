"""The producer role: an engine core in `kv_producer` role whose finished
prompts keep their blocks until the consumer has pulled them. Written once,
without I/O; both runtimes run this class.

- It serves those blocks to whichever KV transport the runtime runs (it is
  a `connector.transport.KVServeEndpoint`), and turns each consumer's done
  report into `finished_sending`, which frees the blocks through the
  scheduler's own path on the next step.
- A held request whose consumer never reports is released after the fault
  policy's `hold_timeout_s`, so a lost report cannot leak blocks; the proxy
  releases it at once when the decode node it went to is gone (`release`).
- Only the consumer the request was routed to may pull or report on it: a
  ticket in its `kv_transfer_params` is required, and binds the request to
  the first consumer that shows it (`node.access`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

from engine.node_core import NodeSpec
from engine.outputs import EngineCoreOutput, SteadyTokens
from engine.records import StepRecord
from node.access import TICKET_PARAM, AccessList
from node.ports import NodePorts, Timer
from node.role import NodeRole
from node.settings import NodeSettings

from .block_source import HeldBlockSource


class PrefillNode(NodeRole):
    role = "prefill"

    def __init__(
        self,
        spec: NodeSpec,
        settings: NodeSettings,
        ports: NodePorts,
        on_step: Callable[[StepRecord], None] | None = None,
        check_each_step: bool = False,
    ) -> None:
        if spec.kv_role not in ("kv_producer", "kv_both"):
            raise ValueError(
                f"{spec.name}: a prefill node needs kv_role 'kv_producer' or 'kv_both', got {spec.kv_role!r}"
            )
        super().__init__(spec, settings, ports, on_step, check_each_step)
        self.source = HeldBlockSource(self.core, settings.bytes_per_token, self.clock.now)
        # Request id -> (run time its blocks began to be held, its hold timer).
        self._held: dict[str, tuple[float, Timer]] = {}
        self.done_reports = 0
        self.failed_done_reports = 0
        self.late_done_reports = 0
        self.hold_timeouts = 0
        self.released_by_proxy = 0
        self.access = AccessList(settings.ticket_key)

    def set_address(self, address: str) -> None:
        """Where consumers reach this node's KV; it goes into every `kv_transfer_params`."""
        self.core.set_kv_address(address)

    # -- outputs: finished prompts begin to be held ------------------------------
    def _on_outputs(self, outputs: list[EngineCoreOutput | SteadyTokens]) -> None:
        now = self.clock.now()
        hold_s = self.settings.kv_policy.hold_timeout_s
        for out in outputs:
            # (`type(out) is EngineCoreOutput`: a prefill node's outputs are never `SteadyTokens`)
            if (
                type(out) is EngineCoreOutput
                and out.finished
                and out.kv_transfer_params
                and self.core.holds(out.request_id)
            ):
                timer = self.clock.call_at(now + hold_s, self._hold_expired, out.request_id, now)
                self._held[out.request_id] = (now, timer)
                out.kv_transfer_params[TICKET_PARAM] = self.access.grant(out.request_id)
        super()._on_outputs(outputs)

    # -- the KV handoff (KVServeEndpoint, KVAccessControl) --------------------------
    def authorize(self, request_id: str, ticket: str, consumer: str) -> None:
        """Before a pull or a done report: raises UnknownRequestError or KVAccessDenied."""
        self.access.check(request_id, ticket, consumer)

    def get_blocks(self, request_id: str, block_ids: Sequence[int]) -> list[bytes]:
        return self.source.get_blocks(request_id, block_ids)

    def iter_blocks(self, request_id: str, block_ids: Sequence[int]) -> Iterator[bytes]:
        return self.source.iter_blocks(request_id, block_ids)

    def check_blocks(self, request_id: str, block_ids: Sequence[int]) -> int:
        return self.source.check_blocks(request_id, block_ids)

    def on_done_report(self, request_id: str, success: bool) -> None:
        """The consumer is done with a request's blocks (`success` False: its pull failed)."""
        self.done_reports += 1
        if not success:
            self.failed_done_reports += 1
        held = self._held.pop(request_id, None)
        if held is None:
            self.late_done_reports += 1  # released already (hold timeout) or never held
            return
        held[1].cancel()
        self._release(request_id)

    def release(self, request_ids: list[str]) -> None:
        """The proxy gave these requests up (their decode node is gone): free their blocks now."""
        for request_id in request_ids:
            held = self._held.pop(request_id, None)
            if held is not None:
                held[1].cancel()
                self.released_by_proxy += 1
                self._release(request_id)

    def _hold_expired(self, request_id: str, held_since: float) -> None:
        held = self._held.get(request_id)
        if held is None or held[0] != held_since:
            return
        del self._held[request_id]
        self.hold_timeouts += 1
        self._release(request_id)

    def _release(self, request_id: str) -> None:
        self.access.release(request_id)
        if not self.alive:
            return
        self.core.mark_finished_sending(request_id)
        self.loop.wake()

    # -- reporting --------------------------------------------------------------------
    def busy(self) -> bool:
        """Work left: steps to schedule or in flight, or blocks held for a pull."""
        return self.alive and (super().busy() or bool(self._held))

    def extra_counters(self) -> dict[str, Any]:
        return {
            "kv_blocks_served": self.source.blocks_served,
            "kv_pull_reads_failed": self.source.reads_failed,
            "kv_done_reports": self.done_reports,
            "kv_failed_done_reports": self.failed_done_reports,
            "kv_late_done_reports": self.late_done_reports,
            "kv_hold_timeouts": self.hold_timeouts,
            "kv_released_by_proxy": self.released_by_proxy,
            "kv_access_denied": self.access.denied,
        }
