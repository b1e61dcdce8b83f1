"""Deterministic KV block content and its checksum."""

import pytest

from connector.payload import (
    BYTES_PER_TOKEN_PRESETS,
    DEFAULT_BYTES_PER_TOKEN,
    LLAMA3_8B_FP16_BYTES_PER_TOKEN,
    block_payload,
    checksum,
    kv_bytes_per_token,
    resolve_bytes_per_token,
    verify,
)


def test_content_is_a_pure_function_of_request_block_and_size():
    a = block_payload("req-1", 3, 16, 64)
    assert a == block_payload("req-1", 3, 16, 64)
    assert len(a) == 16 * 64
    assert a != block_payload("req-2", 3, 16, 64)
    assert a != block_payload("req-1", 4, 16, 64)
    # the id is length-prefixed: no collision between ("a1", 2) and ("a", 12)
    assert block_payload("a1", 2, 4) != block_payload("a", 12, 4)


def test_the_format_is_pinned():
    # Known answer: changing how content is derived must be a deliberate act
    # (recorded runs and shadow stores compare against it).
    block = block_payload("req-0", 0, 16, 64)
    assert block[:8].hex() == "cb84b0282a4b43f0"
    assert checksum(block) == 0x6FA084FD


def test_each_token_slot_owns_its_bytes_so_a_partial_block_is_a_prefix():
    full = block_payload("req-1", 0, 16, 64)
    assert block_payload("req-1", 0, 5, 64) == full[: 5 * 64]
    assert block_payload("req-1", 0, 0, 64) == b""


def test_default_and_realistic_sizes():
    assert DEFAULT_BYTES_PER_TOKEN == 64
    # Llama-3-8B fp16: K+V * 32 layers * 8 KV heads * head_dim 128 * 2 bytes
    assert LLAMA3_8B_FP16_BYTES_PER_TOKEN == 2 * 32 * 8 * 128 * 2 == 131072
    assert kv_bytes_per_token(num_layers=32, num_kv_heads=8, head_dim=128, dtype_bytes=2) == 131072
    assert BYTES_PER_TOKEN_PRESETS == {"tiny": 64, "llama-3-8b-fp16": 131072}
    assert len(block_payload("r", 0, 16, "llama-3-8b-fp16")) == 2 * 1024 * 1024


def test_checksum_detects_every_single_flipped_byte():
    block = block_payload("req-9", 1, 16, 64)
    crc = checksum(block)
    assert verify(block, crc)
    for i in range(len(block)):
        for flip in (0x01, 0x80, 0xFF):
            damaged = bytearray(block)
            damaged[i] ^= flip
            assert not verify(damaged, crc), (i, flip)
    assert not verify(block[:-1], crc)  # truncation too


def test_checksum_is_unsigned_32_bit():
    values = [checksum(block_payload("r", i, 1)) for i in range(200)]
    assert all(0 <= v < 2**32 for v in values)
    assert any(v >= 2**31 for v in values)


@pytest.mark.parametrize(
    "args, message",
    [
        (("", 0, 1, 64), "request_id must be a non-empty str"),
        (("r", -1, 1, 64), "block_index must be an int >= 0"),
        (("r", 0, -2, 64), "num_tokens must be an int >= 0"),
        (("r", 0, 1, 0), "bytes_per_token must be an int >= 1"),
        (("r", 0, 1, "llama-70b"), "unknown preset 'llama-70b'"),
    ],
)
def test_bad_arguments_are_named(args, message):
    with pytest.raises(ValueError, match=message):
        block_payload(*args)


def test_resolve_bytes_per_token():
    assert resolve_bytes_per_token(128) == 128
    assert resolve_bytes_per_token("tiny") == 64
    with pytest.raises(ValueError, match="bytes_per_token"):
        resolve_bytes_per_token(True)
    with pytest.raises(ValueError, match="num_kv_heads must be an int >= 1"):
        kv_bytes_per_token(32, 0, 128, 2)
