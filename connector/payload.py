"""Deterministic KV block content and its checksum.

No model runs here, so a KV block's bytes are synthesised: every token slot
gets bytes derived only from (request_id, block_index, slot). Anyone holding
the request id can recompute what a block must contain, so a block that was
corrupted, truncated, or written into the wrong place is detectable — by the
checksum on the wire, and again by a shadow store comparing contents.

The bytes come from SHAKE-128, an extendable-output hash: the stream for one
block is fixed by (request, block_index), and token slot s owns bytes
[s * bytes_per_token, (s + 1) * bytes_per_token) of it. A partially filled
block is therefore a prefix of the full block, and block_index plus slot is
the token position for a fixed block size.
"""

from __future__ import annotations

import hashlib
import zlib

DEFAULT_BYTES_PER_TOKEN = 64


def kv_bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, dtype_bytes: int) -> int:
    """KV cache bytes one token occupies: K and V, per layer, per KV head."""
    for name, value in (
        ("num_layers", num_layers),
        ("num_kv_heads", num_kv_heads),
        ("head_dim", head_dim),
        ("dtype_bytes", dtype_bytes),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"kv_bytes_per_token: {name} must be an int >= 1, got {value!r}")
    return 2 * num_layers * num_kv_heads * head_dim * dtype_bytes


# Llama-3-8B (meta-llama/Meta-Llama-3-8B config.json): num_hidden_layers=32,
# num_key_value_heads=8 (GQA), head_dim = hidden_size 4096 / 32 heads = 128;
# fp16 = 2 bytes. 2 * 32 * 8 * 128 * 2 = 131072 B = 128 KiB per token, so a
# 16-token vLLM block is 2 MiB.
LLAMA3_8B_FP16_BYTES_PER_TOKEN = kv_bytes_per_token(num_layers=32, num_kv_heads=8, head_dim=128, dtype_bytes=2)

BYTES_PER_TOKEN_PRESETS: dict[str, int] = {
    "tiny": DEFAULT_BYTES_PER_TOKEN,
    "llama-3-8b-fp16": LLAMA3_8B_FP16_BYTES_PER_TOKEN,
}


def resolve_bytes_per_token(value: int | str) -> int:
    """Accept a positive int or a preset name from BYTES_PER_TOKEN_PRESETS."""
    if isinstance(value, str):
        try:
            return BYTES_PER_TOKEN_PRESETS[value]
        except KeyError:
            raise ValueError(
                f"bytes_per_token: unknown preset {value!r}; allowed: {sorted(BYTES_PER_TOKEN_PRESETS)} or an int >= 1"
            ) from None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"bytes_per_token must be an int >= 1 or a preset name, got {value!r}")
    return value


def block_payload(
    request_id: str,
    block_index: int,
    num_tokens: int,
    bytes_per_token: int = DEFAULT_BYTES_PER_TOKEN,
) -> bytes:
    """The content of block `block_index` of `request_id` holding `num_tokens` tokens."""
    if not isinstance(request_id, str) or not request_id:
        raise ValueError(f"block_payload: request_id must be a non-empty str, got {request_id!r}")
    if isinstance(block_index, bool) or not isinstance(block_index, int) or block_index < 0:
        raise ValueError(f"block_payload: block_index must be an int >= 0, got {block_index!r}")
    if isinstance(num_tokens, bool) or not isinstance(num_tokens, int) or num_tokens < 0:
        raise ValueError(f"block_payload: num_tokens must be an int >= 0, got {num_tokens!r}")
    bytes_per_token = resolve_bytes_per_token(bytes_per_token)
    # Length-prefix the id so ("a1", 2) and ("a", 12) can never share a key.
    key = f"disagg-sim/kv/v1|{len(request_id)}|{request_id}|{block_index}".encode()
    return hashlib.shake_128(key).digest(num_tokens * bytes_per_token)


def checksum(data: bytes | bytearray | memoryview) -> int:
    """CRC-32 of `data` as an unsigned 32-bit int (the wire's `crc32` field).

    CRC-32 catches every single-byte error and every burst up to 32 bits, runs
    at about 1 GB/s here, and is what the wire carries; it is not a defence
    against deliberate tampering, which is not the threat in a simulator.
    """
    return zlib.crc32(data) & 0xFFFFFFFF


def verify(data: bytes | bytearray | memoryview, expected_crc32: int) -> bool:
    return checksum(data) == expected_crc32
