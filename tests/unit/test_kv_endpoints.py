"""The two ends of the KV handoff inside the roles, without a transport:
the consumer's content check and the producer's held blocks."""

from __future__ import annotations

import pytest

from connector.payload import block_payload
from connector.transport import UnknownBlockError, UnknownRequestError
from decode_node.block_sink import BlockContentMismatch, VerifyingBlockSink
from engine.node_core import NodeCore
from engine.request import Request, SamplingParams
from prefill_node.block_source import HeldBlockSource
from tests.e2e_ray.conftest import make_spec


def test_the_sink_verifies_each_block_against_its_payload():
    sink = VerifyingBlockSink(16, 64)
    sink.expect("r", 40)  # 3 blocks: 16 + 16 + 8 tokens
    sink.write_block(10, "r", 2, block_payload("r", 2, 8, 64))
    sink.write_block(11, "r", 0, block_payload("r", 0, 16, 64))
    sink.write_block(12, "r", 1, block_payload("r", 1, 16, 64))
    assert sink.blocks_verified == 3
    sink.expect("s", 16)
    with pytest.raises(BlockContentMismatch):
        sink.write_block(13, "s", 0, block_payload("other", 0, 16, 64))
    with pytest.raises(BlockContentMismatch):
        sink.write_block(14, "unknown", 0, b"x")
    with pytest.raises(BlockContentMismatch):
        sink.write_block(15, "s", 1, block_payload("s", 1, 16, 64))  # past the prompt
    assert sink.mismatches == 3


def _producer_with_a_held_prompt(prompt_len=40):
    spec = make_spec()
    _, ns, _ = spec.node_specs()[0]
    core = NodeCore(ns)
    core.add_request(
        Request(
            "r",
            range(prompt_len),
            SamplingParams(max_tokens=1),
            eos_token_id=2,
            kv_transfer_params={"do_remote_decode": True},
        )
    )
    outputs = []
    while (plan := core.schedule_step(0.0)) is not None:
        outputs += core.process_oldest(core.finish_step(plan, 0.0))
    assert outputs[-1].finish_reason == "length"
    return core, outputs[-1].kv_transfer_params["remote_block_ids"]


def test_the_block_source_serves_held_blocks_and_refuses_anything_else():
    core, held = _producer_with_a_held_prompt(40)
    source = HeldBlockSource(core, 64, lambda: 0.0)
    blocks = source.get_blocks("r", [held[2], held[0]])
    assert blocks == [block_payload("r", 2, 8, 64), block_payload("r", 0, 16, 64)]
    assert source.check_blocks("r", [held[2], held[0]]) == 8 + 16  # the same blocks, no bytes built
    assert (source.blocks_served, source.reads_failed) == (4, 0)
    with pytest.raises(UnknownRequestError):
        source.get_blocks("nobody", [held[0]])
    with pytest.raises(UnknownBlockError):
        source.check_blocks("r", [max(held) + 1])


@pytest.mark.parametrize("prompt_len", [1, 15, 16, 17, 40, 48])
def test_the_block_source_counts_each_named_blocks_tokens_as_its_payload_holds_them(prompt_len):
    """`check_blocks` is the tokens of the payloads `get_blocks` would build:
    a whole block each but the prompt's last, in any order, repeats counted."""
    core, held = _producer_with_a_held_prompt(prompt_len)
    source = HeldBlockSource(core, 64, lambda: 0.0)
    for named in (held, held[::-1], held[-1:] * 3 + held[:1], held[:1]):
        payload_bytes = sum(len(b) for b in source.get_blocks("r", named))
        assert source.check_blocks("r", named) * 64 == payload_bytes
