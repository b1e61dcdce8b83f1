"""The consumer's `BlockSink`: every block the puller hands over (already
CRC-checked against the producer's checksum) is compared once more with the
deterministic payload it must hold, so a block written into the wrong place
or for the wrong request is caught here too. A mismatch raises, which fails
the pull (the scheduler then recomputes or fails the request).

The sink also knows when a request's last block has arrived: `on_landed`
fires then, before the puller's ReportDone round trip to the producer, so
the consumer reports `finished_recving` when the data is there (as vLLM's
NIXL connector does; the producer is told in the background)."""

from __future__ import annotations

from typing import Callable

from connector.payload import block_payload


class BlockContentMismatch(ValueError):
    pass


class VerifyingBlockSink:
    def __init__(self, block_size: int, bytes_per_token: int,
                 on_landed: Callable[[str], None] = lambda request_id: None) -> None:
        self.block_size = block_size
        self.bytes_per_token = bytes_per_token
        self.on_landed = on_landed
        # Request id -> prompt length, registered before its pull starts.
        self.expected_tokens: dict[str, int] = {}
        # Request id -> block indices still to arrive.
        self._missing: dict[str, set[int]] = {}
        self.blocks_verified = 0
        self.bytes_verified = 0
        self.mismatches = 0

    def expect(self, request_id: str, num_tokens: int) -> None:
        self.expected_tokens[request_id] = num_tokens
        self._missing[request_id] = set(range(-(-num_tokens // self.block_size)))

    def forget(self, request_id: str) -> None:
        self.expected_tokens.pop(request_id, None)
        self._missing.pop(request_id, None)

    def write_block(self, local_block_id: int, request_id: str, block_index: int, data: bytes) -> None:
        num_tokens = self.expected_tokens.get(request_id)
        if num_tokens is None:
            self.mismatches += 1
            raise BlockContentMismatch(f"block for {request_id!r}, which this node is not loading")
        tokens = min(self.block_size, num_tokens - block_index * self.block_size)
        if tokens <= 0 or data != block_payload(request_id, block_index, tokens, self.bytes_per_token):
            self.mismatches += 1
            raise BlockContentMismatch(
                f"{request_id!r} block {block_index} (local block {local_block_id}): content differs from its payload"
            )
        self.blocks_verified += 1
        self.bytes_verified += len(data)
        missing = self._missing.get(request_id)
        if missing is not None:
            missing.discard(block_index)
            if not missing:
                del self._missing[request_id]
                self.on_landed(request_id)
