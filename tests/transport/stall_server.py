"""A KV server in its own process, for the memory tests: serves one 16 MiB
request built block by block, prints its port, then answers each line on
stdin with its peak resident set size in bytes, the streams it serves now,
the most it served at once, the streams its bound cut off, its resident
set size now and the calls its token gate refused.

    python -m tests.transport.stall_server MAX_STREAM_S [TOKEN]
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from connector.grpc import KVHandoffServer
from connector.grpc.security import KVSecurity


class LazySource:
    """One request of 64 blocks x 256 KiB = 16 MiB, built block by block."""

    BLOCK = 256 * 1024

    def get_blocks(self, request_id, block_ids):
        return list(self.iter_blocks(request_id, block_ids))

    def iter_blocks(self, request_id, block_ids):
        return (bytes([b % 251]) * self.BLOCK for b in block_ids)


def status_bytes(field: str) -> int:
    """VmHWM (the high-water mark, so a stream that ends before it is
    sampled still counts) or VmRSS (now)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


async def main(max_stream_s: float, token: str | None) -> None:
    security = KVSecurity(auth_token=token)
    async with KVHandoffServer(LazySource(), max_stream_s=max_stream_s, security=security) as server:
        print(server.address, flush=True)
        loop = asyncio.get_running_loop()
        while await loop.run_in_executor(None, sys.stdin.readline):
            handler = server.handler
            state = (
                status_bytes("VmHWM"),
                handler.active_pulls,
                handler.peak_active_pulls,
                handler.pulls_cut_at_bound,
                status_bytes("VmRSS"),
                server.gate.refused,
            )
            print(*state, flush=True)


if __name__ == "__main__":
    asyncio.run(main(float(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else None))
