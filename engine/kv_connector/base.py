"""The scheduler-side connector interface, with vLLM's hook names and return
shapes (`vllm/distributed/kv_transfer/kv_connector/v1/base.py`)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..config import KVTransferConfig
    from ..kv_cache_manager import KVCacheBlocks
    from ..outputs import KVConnectorOutput, SchedulerOutput
    from ..request import Request


class KVConnectorMetadata:
    """What the scheduler side tells the worker side each step."""


class KVConnectorBase:
    def __init__(self, kv_transfer_config: KVTransferConfig) -> None:
        self.kv_transfer_config = kv_transfer_config

    @property
    def requires_kv_delivery(self) -> bool:
        """A producer must deliver the prefill's KV: a preemption drops its
        in-flight output instead of finishing on freed blocks."""
        return self.kv_transfer_config.is_kv_producer

    def on_new_request(self, request: Request) -> None:
        pass

    def get_num_new_matched_tokens(self, request: Request, num_computed_tokens: int) -> tuple[int | None, bool]:
        """(external tokens, load asynchronously). None = not yet, ask again."""
        return 0, False

    def update_state_after_alloc(self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int) -> None:
        pass

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        return KVConnectorMetadata()

    def update_connector_output(self, connector_output: KVConnectorOutput) -> None:
        pass

    def request_finished(self, request: Request, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        """(delay_free, kv_transfer_params) — called once when a request finishes."""
        return False, None

    def has_pending_block_frees(self) -> bool:
        return False

    def has_pending_push_work(self) -> bool:
        return False

    def is_idle(self) -> bool:
        """Nothing queued for the next step's metadata (the steady-decode
        fast-forward, engine/steady_decode.py, builds no metadata)."""
        return True
