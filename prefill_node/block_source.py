"""The producer's blocks for a pull: the blocks of a finished prompt that
the scheduler holds (`delay_free`), as deterministic payloads.

Before serving it reads its own shadow store (`NodeCore.blocks_for_pull`): a
block that no longer holds this request's KV — reused before the pull — is
counted as a failed read.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence

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

    def _read(self, request_id: str, block_ids: Sequence[int]) -> tuple[list[int], int]:
        """The prompt positions of `block_ids` and the prompt length, after the shadow read."""
        held = self.core.held_prompt_blocks(request_id)
        if held is None:
            raise UnknownRequestError(request_id)
        held_ids, prompt_len = held
        position = {block_id: i for i, block_id in enumerate(held_ids)}
        missing = [b for b in block_ids if b not in position]
        if missing:
            raise UnknownBlockError(f"request {request_id!r} holds no block(s) {missing[:8]}")
        if not self.core.blocks_for_pull(request_id, held_ids, prompt_len, self.now()):
            self.reads_failed += 1
        self.blocks_served += len(block_ids)
        return [position[b] for b in block_ids], prompt_len

    def check_blocks(self, request_id: str, block_ids: Sequence[int]) -> int:
        """The prompt tokens the blocks hold: a whole block each, but the
        prompt's last one (which may be part full), once per time it is named."""
        positions, prompt_len = self._read(request_id, block_ids)
        bs = self.core.block_size
        last = (prompt_len - 1) // bs  # positions index the prompt's blocks: none is past it
        return bs * len(positions) - (bs * (last + 1) - prompt_len) * positions.count(last)

    def get_blocks(self, request_id: str, block_ids: Sequence[int]) -> list[bytes]:
        return list(self.iter_blocks(request_id, block_ids))

    def iter_blocks(self, request_id: str, block_ids: Sequence[int]) -> Iterator[bytes]:
        """Checked now (raises as `get_blocks`); each block's bytes built only
        when asked for, so a stream holds one block at a time, not the prompt."""
        positions, prompt_len = self._read(request_id, block_ids)
        bs, bpt = self.core.block_size, self.bytes_per_token
        return (block_payload(request_id, i, min(bs, prompt_len - i * bs), bpt) for i in positions)
