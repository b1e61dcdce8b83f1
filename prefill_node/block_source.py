"""The producer's `BlockSource`: the blocks of a finished prompt that the
scheduler holds for a pull (`delay_free`), as deterministic payloads.

Before serving it reads its own shadow store (`NodeCore.blocks_for_pull`): a
block that no longer holds this request's KV — reused before the pull — is
counted as a failed read, as the in-process transport does.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from connector.payload import block_payload
from connector.transport import UnknownBlockError, UnknownRequestError
from engine.node_core import NodeCore


class HeldBlockSource:
    def __init__(self, core: NodeCore, bytes_per_token: int, now: Callable[[], float]) -> None:
        self.core = core
        self.bytes_per_token = bytes_per_token
        self.now = now
        self.blocks_served = 0
        self.reads_failed = 0

    def held_blocks(self, request_id: str) -> tuple[list[int], int]:
        """(block ids holding the prompt's KV, prompt length) of a held request."""
        scheduler = self.core.scheduler
        request = scheduler.requests.get(request_id)
        if request is None or not request.is_finished():
            raise UnknownRequestError(request_id)
        prompt_len = request.num_prompt_tokens
        n_blocks = -(-prompt_len // scheduler.block_size)
        return scheduler.kv_cache_manager.get_block_ids(request_id)[:n_blocks], prompt_len

    def get_blocks(self, request_id: str, block_ids: Sequence[int]) -> list[bytes]:
        held, prompt_len = self.held_blocks(request_id)
        position = {block_id: i for i, block_id in enumerate(held)}
        missing = [b for b in block_ids if b not in position]
        if missing:
            raise UnknownBlockError(f"request {request_id!r} holds no block(s) {missing}; it holds {held}")
        if not self.core.blocks_for_pull(request_id, held, prompt_len, self.now()):
            self.reads_failed += 1
        bs = self.core.scheduler.block_size
        out = []
        for block_id in block_ids:
            i = position[block_id]
            tokens = min(bs, prompt_len - i * bs)
            out.append(block_payload(request_id, i, tokens, self.bytes_per_token))
        self.blocks_served += len(out)
        return out
