"""A P/D connector modelled on vLLM's NIXL connector (scheduler side).

Producer (prefill node): a request submitted with `do_remote_decode` finishes
after its one token; `request_finished` then holds its blocks (`delay_free`)
and returns the params the decode node needs to pull them.

Consumer (decode node): a request submitted with `do_remote_prefill` reports
its whole prompt as externally matched with an async load; after the
scheduler allocates blocks, the load is announced to the worker side in the
next `build_connector_meta`. The worker side (a transport) reports
`finished_recving` / `finished_sending` through `KVConnectorOutput`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..request import Request, RequestStatus
from .base import KVConnectorBase, KVConnectorMetadata

if TYPE_CHECKING:
    from ..config import KVTransferConfig
    from ..kv_cache_manager import KVCacheBlocks
    from ..outputs import SchedulerOutput


@dataclass
class RecvSpec:
    """One load for the worker side: pull `remote_block_ids` from the producer
    at `remote_address` into `local_block_ids`."""

    request_id: str
    local_block_ids: list[int]
    remote_block_ids: list[int]
    remote_request_id: str
    remote_engine_id: str
    remote_address: str
    num_tokens: int
    # The prompt position (in blocks) of the first pulled block: a local
    # prefix-cache hit covers the blocks before it, which are not pulled.
    first_block_index: int = 0


@dataclass
class PDConnectorMetadata(KVConnectorMetadata):
    reqs_to_recv: dict[str, RecvSpec] = field(default_factory=dict)
    # Producer side: requests whose blocks are now held for a pull.
    reqs_to_send: dict[str, list[int]] = field(default_factory=dict)


class PDConnector(KVConnectorBase):
    def __init__(self, kv_transfer_config: KVTransferConfig, engine_address: str = "") -> None:
        super().__init__(kv_transfer_config)
        self.engine_id = kv_transfer_config.engine_id
        self.engine_address = engine_address
        self._reqs_need_recv: dict[str, tuple[Request, list[int]]] = {}
        self._reqs_need_send: dict[str, list[int]] = {}

    # -- consumer ----------------------------------------------------------
    def get_num_new_matched_tokens(self, request: Request, num_computed_tokens: int) -> tuple[int | None, bool]:
        params = request.kv_transfer_params
        if params and params.get("do_remote_prefill"):
            # Pull every prompt token; the scheduler recomputes the last one
            # (num_computed_tokens = num_tokens - 1 at promotion) to sample.
            count = request.num_prompt_tokens - num_computed_tokens
            if count > 0:
                return count, True
        return 0, False

    def update_state_after_alloc(self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int) -> None:
        params = request.kv_transfer_params
        if not params or not params.get("do_remote_prefill"):
            return
        if num_external_tokens > 0:
            # As vLLM's NIXL connector: only the blocks a local prefix-cache
            # hit did not provide are loaded.
            self._reqs_need_recv[request.request_id] = (request, blocks.get_unhashed_block_ids())
        # Load once: a later re-admission (after preemption) recomputes.
        params["do_remote_prefill"] = False

    # -- both --------------------------------------------------------------
    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> PDConnectorMetadata:
        meta = PDConnectorMetadata()
        for req_id, (request, local_ids) in self._reqs_need_recv.items():
            params = request.kv_transfer_params or {}
            remote_ids = list(params.get("remote_block_ids", []))
            skipped = max(0, len(remote_ids) - len(local_ids))
            meta.reqs_to_recv[req_id] = RecvSpec(
                request_id=req_id,
                local_block_ids=local_ids,
                remote_block_ids=remote_ids[skipped:],
                remote_request_id=params.get("remote_request_id", req_id),
                remote_engine_id=params.get("remote_engine_id", ""),
                remote_address=params.get("remote_address", ""),
                num_tokens=request.num_prompt_tokens,
                first_block_index=skipped,
            )
        meta.reqs_to_send = self._reqs_need_send
        self._reqs_need_recv = {}
        self._reqs_need_send = {}
        return meta

    def is_idle(self) -> bool:
        return not self._reqs_need_recv and not self._reqs_need_send

    # -- producer ----------------------------------------------------------
    def request_finished(self, request: Request, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        params = request.kv_transfer_params
        if not params or not params.get("do_remote_decode"):
            return False, None
        if request.status != RequestStatus.FINISHED_LENGTH_CAPPED:
            # Aborted or errored prefill: nothing to hand over.
            return False, None
        delay_free = bool(block_ids)
        if delay_free:
            self._reqs_need_send[request.request_id] = list(block_ids)
        return delay_free, {
            "do_remote_prefill": True,
            "do_remote_decode": False,
            "remote_block_ids": list(block_ids),
            "remote_engine_id": self.engine_id,
            "remote_address": self.engine_address,
            "remote_request_id": request.request_id,
        }
