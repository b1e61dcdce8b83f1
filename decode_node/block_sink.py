"""The consumer's check of every block a transport hands over (already
CRC-checked on the wire): it must be the deterministic payload of that
request's block at that position, so a block written into the wrong place or
for the wrong request is caught here too. A mismatch raises, which ends the
attempt with SINK_ERROR and fails the pull (the scheduler then recomputes or
fails the request). A transport that moves no bytes (in-process) never calls it."""

from __future__ import annotations

from connector.payload import block_payload


class BlockContentMismatch(ValueError):
    pass


class VerifyingBlockSink:
    def __init__(self, block_size: int, bytes_per_token: int) -> None:
        self.block_size = block_size
        self.bytes_per_token = bytes_per_token
        # Remote request id -> prompt length, registered before its pull starts.
        self.expected_tokens: dict[str, int] = {}
        self.blocks_verified = 0
        self.bytes_verified = 0
        self.mismatches = 0

    def expect(self, request_id: str, num_tokens: int) -> None:
        self.expected_tokens[request_id] = num_tokens

    def forget(self, request_id: str) -> None:
        self.expected_tokens.pop(request_id, None)

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
