"""Helpers for the gRPC loopback tests: everything binds to 127.0.0.1 only."""

from __future__ import annotations

import asyncio

from connector.payload import block_payload
from connector.transport import InMemoryBlockSource


def run(coro, timeout_s: float = 30.0):
    """Run one test body on a fresh event loop, bounded in time."""

    async def bounded():
        return await asyncio.wait_for(coro, timeout_s)

    return asyncio.run(bounded())


def add_request(
    source: InMemoryBlockSource,
    request_id: str,
    num_blocks: int,
    *,
    first_block_id: int = 0,
    tokens_per_block: int = 16,
    bytes_per_token: int = 64,
) -> dict[int, bytes]:
    """Give `source` a request of `num_blocks` blocks; returns block_id → bytes."""
    blocks = {
        first_block_id + i: block_payload(request_id, i, tokens_per_block, bytes_per_token) for i in range(num_blocks)
    }
    source.add(request_id, blocks)
    return blocks
