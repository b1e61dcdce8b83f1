"""A KV connector for vLLM's real scheduler, written for the P/D conformance
harness against `KVConnectorBase_V1`'s scheduler API. It behaves like the
project's `engine/kv_connector/pd_connector.py` (`PDConnector`), whose
behaviour follows the NIXL connector's scheduler half without its transport,
handshakes or remote engine bookkeeping:

- consumer: a request whose `kv_transfer_params` say `do_remote_prefill` matches
  every prompt token not computed locally, loaded asynchronously; after the
  scheduler allocates, the blocks a local prefix hit did not provide (the
  unhashed ones) are announced as a load in the next metadata; one load per
  request (a re-admission recomputes);
- producer: a request with `do_remote_decode` that finishes length-capped holds
  its computed blocks (`delay_free`) and announces them as a send.

The worker side is the harness's fake worker (tests/conformance/pd_worker.py),
which reads `reqs_to_recv` / `reqs_to_send` from the metadata and reports
completions through `KVConnectorOutput`. Loaded by vLLM's connector factory
(`kv_connector_module_path`) inside the oracle venv; never imported by the
project.
"""

from __future__ import annotations

from typing import Any

from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
)
from vllm.v1.request import RequestStatus


class PDHarnessMetadata(KVConnectorMetadata):
    def __init__(self, reqs_to_recv: dict[str, list[int]], reqs_to_send: dict[str, list[int]]) -> None:
        self.reqs_to_recv = reqs_to_recv
        self.reqs_to_send = reqs_to_send


class PDHarnessConnector(KVConnectorBase_V1):
    def __init__(self, vllm_config, role, kv_cache_config=None) -> None:
        super().__init__(vllm_config, role, kv_cache_config)
        self._reqs_need_recv: dict[str, list[int]] = {}
        self._reqs_need_send: dict[str, list[int]] = {}

    # -- scheduler side: consumer -------------------------------------------
    def get_num_new_matched_tokens(self, request, num_computed_tokens: int) -> tuple[int | None, bool]:
        params = request.kv_transfer_params
        if params and params.get("do_remote_prefill"):
            count = request.num_prompt_tokens - num_computed_tokens
            if count > 0:
                return count, True
        return 0, False

    def update_state_after_alloc(self, request, blocks, num_external_tokens: int) -> None:
        params = request.kv_transfer_params
        if not params or not params.get("do_remote_prefill"):
            return
        if num_external_tokens > 0:
            self._reqs_need_recv[request.request_id] = blocks.get_unhashed_block_ids()
        params["do_remote_prefill"] = False

    # -- both -----------------------------------------------------------------
    def build_connector_meta(self, scheduler_output) -> PDHarnessMetadata:
        meta = PDHarnessMetadata(self._reqs_need_recv, self._reqs_need_send)
        self._reqs_need_recv = {}
        self._reqs_need_send = {}
        return meta

    # -- scheduler side: producer ---------------------------------------------
    def request_finished(self, request, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        params = request.kv_transfer_params
        if not params or not params.get("do_remote_decode"):
            return False, None
        if request.status != RequestStatus.FINISHED_LENGTH_CAPPED:
            return False, None
        delay_free = bool(block_ids)
        if delay_free:
            self._reqs_need_send[request.request_id] = list(block_ids)
        return delay_free, {"do_remote_prefill": True, "do_remote_decode": False, "remote_block_ids": list(block_ids)}

    # -- worker side: never used (the harness has no worker process) -----------
    def start_load_kv(self, forward_context, **kwargs) -> None:
        raise NotImplementedError

    def wait_for_layer_load(self, layer_name: str) -> None:
        raise NotImplementedError

    def save_kv_layer(self, layer_name, kv_layer, attn_metadata, **kwargs) -> None:
        raise NotImplementedError

    def wait_for_save(self) -> None:
        raise NotImplementedError
