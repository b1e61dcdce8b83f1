"""gRPC settings of the KV handoff: message limits, chunk sizes, channel and server options.

Measured on this machine, loopback gRPC streams 4 KiB messages at ~70 MB/s
but 256 KiB–1 MiB messages at ~1 GB/s, so KV bytes travel in chunks of that
size (framing in framing.py).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys
from typing import Any

KiB = 1024
MiB = 1024 * KiB

# gRPC's default receive cap is 4 MiB on both sides; set a deliberate cap
# instead: comfortably above the largest chunk, far below "unlimited".
MAX_MESSAGE_BYTES = 8 * MiB
DEFAULT_CHUNK_BYTES = 512 * KiB
MIN_CHUNK_BYTES = 4 * KiB
MAX_CHUNK_BYTES = 4 * MiB
# What the server accepts from a caller: the largest request it can serve is
# a pull of 65,536 uint32 block ids (5 bytes each at most, 320 KiB) plus its
# short strings. Anything larger is refused by gRPC core from the message's
# length prefix, so a stranger cannot make the server buffer megabytes
# (issue 34). `tests/unit/test_proto_chunks.py` checks the largest valid
# request fits.
MAX_REQUEST_BYTES = 384 * KiB


def _message_limits(max_send_bytes: int, max_receive_bytes: int) -> list[tuple[str, int]]:
    return [
        ("grpc.max_send_message_length", max_send_bytes),
        ("grpc.max_receive_message_length", max_receive_bytes),
    ]


# Connection hygiene of the server (docs/security.md): a client may ping
# every 10 s at most (more often is a strike; 2 strikes close the
# connection), the server pings idle clients every 30 s and drops those that
# do not answer in 10 s, closes connections idle for 5 min and any
# connection after 30 min (with 30 s of grace for calls in flight, after
# which the client simply reconnects), and allows 128 streams at once per
# connection.
KEEPALIVE_TIME_MS = 30_000
KEEPALIVE_TIMEOUT_MS = 10_000
MIN_CLIENT_PING_INTERVAL_MS = 10_000
MAX_PING_STRIKES = 2
MAX_CONNECTION_IDLE_MS = 5 * 60_000
MAX_CONNECTION_AGE_MS = 30 * 60_000
MAX_CONNECTION_AGE_GRACE_MS = 30_000
MAX_CONCURRENT_STREAMS = 128


def server_options(max_message_bytes: int = MAX_MESSAGE_BYTES) -> list[tuple[str, int]]:
    # No SO_REUSEPORT: a second server must not silently share a port, and a
    # stopped server's port must refuse connections.
    # The server sends chunks (up to `max_message_bytes`) and receives only
    # requests (`MAX_REQUEST_BYTES`).
    return _message_limits(max_message_bytes, MAX_REQUEST_BYTES) + [
        # Receive windows stay at HTTP/2's 64 KiB: the server only receives
        # small requests, and grown windows (BDP probing) would let callers
        # make it buffer megabytes per stream before anything is checked.
        ("grpc.http2.bdp_probe", 0),
        ("grpc.so_reuseport", 0),
        ("grpc.keepalive_time_ms", KEEPALIVE_TIME_MS),
        ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.min_ping_interval_without_data_ms", MIN_CLIENT_PING_INTERVAL_MS),
        ("grpc.http2.max_ping_strikes", MAX_PING_STRIKES),
        ("grpc.max_connection_idle_ms", MAX_CONNECTION_IDLE_MS),
        ("grpc.max_connection_age_ms", MAX_CONNECTION_AGE_MS),
        ("grpc.max_connection_age_grace_ms", MAX_CONNECTION_AGE_GRACE_MS),
        ("grpc.max_concurrent_streams", MAX_CONCURRENT_STREAMS),
    ]


def channel_options(max_message_bytes: int = MAX_MESSAGE_BYTES) -> list[tuple[str, int]]:
    # gRPC waits 1 s (growing to 120 s) before redialling a failed address;
    # a producer that restarts should be found again within a pull deadline.
    # Keepalive pings no more often than the server permits.
    return _message_limits(max_message_bytes, max_message_bytes) + [
        ("grpc.initial_reconnect_backoff_ms", 100),
        ("grpc.min_reconnect_backoff_ms", 100),
        ("grpc.max_reconnect_backoff_ms", 1000),
        ("grpc.keepalive_time_ms", KEEPALIVE_TIME_MS),
        ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
    ]


def tune_malloc_for_bulk_transfer(mmap_threshold: int = 32 * MiB, trim_threshold: int = 256 * MiB) -> bool:
    """Stop glibc from mapping and unmapping every large message buffer.

    Each 256 KiB–1 MiB message is allocated and freed several times on its
    way (the encoded chunk, gRPC's slices, the received bytes, the parsed
    message, the reassembled block), on more than one thread. Above glibc's
    mmap threshold every one of those is a fresh mmap whose pages are
    faulted in and zeroed, then unmapped: kernel time was about half the
    CPU time of benchmarks/kv_handoff.py. Raising the mmap and trim
    thresholds keeps freed buffers for reuse, at the cost of holding up to
    `trim_threshold` of freed heap. Measured on the shared 2-core box it
    raised the puller/raw ratio from 26–64 % to 49–69 % with the earlier
    protobuf-built chunks; with framing.py's encoder the gain is within
    the run-to-run noise there. Process-wide, optional: call it once at
    start-up of a process that moves KV blocks (a node, a benchmark).
    Returns False, changing nothing, where the C library is not glibc.
    """
    mallopt = _glibc_function("mallopt")
    if mallopt is None:
        return False
    m_trim_threshold, m_mmap_threshold = -1, -3  # from glibc's malloc.h
    return bool(mallopt(m_mmap_threshold, mmap_threshold)) and bool(mallopt(m_trim_threshold, trim_threshold))


def release_freed_memory() -> bool:
    """Give the heap's free pages back to the system (glibc `malloc_trim`).

    glibc raises its mmap threshold to the size of the largest block freed
    so far (up to 32 MiB), so after the first few MiB-sized chunks every
    later chunk lives on a heap arena and stays mapped after it is freed:
    100 stalled readers of 4 MiB chunks left a prefill actor at 1.26 GB
    once their streams had ended (issue 34). The server calls this when its
    last stream ends, so memory follows the streams. Returns False where the
    C library is not glibc.
    """
    trim = _glibc_function("malloc_trim")
    return trim is not None and bool(trim(0))


def _glibc_function(name: str) -> Any:
    """glibc's `name` through ctypes, or None where the C library is not glibc."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        return getattr(ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6"), name)
    except (OSError, AttributeError):
        return None


def validate_chunk_bytes(max_chunk_bytes: int) -> int:
    if isinstance(max_chunk_bytes, bool) or not isinstance(max_chunk_bytes, int):
        raise ValueError(f"max_chunk_bytes must be an int, got {max_chunk_bytes!r}")
    if not MIN_CHUNK_BYTES <= max_chunk_bytes <= MAX_CHUNK_BYTES:
        raise ValueError(
            f"max_chunk_bytes must be in [{MIN_CHUNK_BYTES}, {MAX_CHUNK_BYTES}] "
            f"(or 0 for the server default), got {max_chunk_bytes}"
        )
    return max_chunk_bytes
