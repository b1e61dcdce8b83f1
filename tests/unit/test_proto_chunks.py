"""Wire framing (encoding blocks into BlockChunks, reassembly) and the producer handler, no network."""

import asyncio
from types import SimpleNamespace

import pytest

from connector.grpc.framing import (
    BlockAssembler,
    ChecksumMismatch,
    ProtocolError,
    WireBlock,
    encode_chunks,
)
from connector.grpc.server import (
    InvalidPullError,
    KVHandoffHandler,
    _KVHandoffServicer,
    kv_handoff_rpc_handlers,
)
from connector.grpc.wire import MAX_CHUNK_BYTES, MIN_CHUNK_BYTES, validate_chunk_bytes
from connector.payload import block_payload, checksum
from connector.transport import InMemoryBlockSource, UnknownBlockError, UnknownRequestError
from protos.disagg import kv_handoff_pb2 as pb

KiB = 1024


def wire_blocks(sizes: list[int]) -> list[WireBlock]:
    out = []
    for i, size in enumerate(sizes):
        data = block_payload("req", i, size, 1)
        out.append(WireBlock(block_id=100 + i, data=data, crc32=checksum(data)))
    return out


def pack_chunks(blocks: list[WireBlock], max_chunk_bytes: int) -> list[pb.BlockChunk]:
    """What the consumer sees: the encoder's bytes decoded by the generated code."""
    return [pb.BlockChunk.FromString(raw) for raw in encode_chunks(blocks, max_chunk_bytes)]


def reference_chunks(blocks: list[WireBlock], max_chunk_bytes: int) -> list[bytes]:
    """The same framing built from protobuf messages and serialised by protobuf."""
    chunks, chunk, room = [], pb.BlockChunk(), max_chunk_bytes
    for index, (block_id, data, crc32) in enumerate(blocks):
        offset = 0
        while True:
            take = min(room, len(data) - offset)
            chunk.pieces.add(
                block_id=block_id,
                block_index=index,
                block_bytes=len(data),
                crc32=crc32,
                offset=offset,
                data=data[offset : offset + take],
            )
            offset, room = offset + take, room - take
            if room == 0:
                chunks.append(chunk.SerializeToString())
                chunk, room = pb.BlockChunk(), max_chunk_bytes
            if offset >= len(data):
                break
    if chunk.pieces:
        chunks.append(chunk.SerializeToString())
    return chunks


def test_encoder_writes_exactly_what_protobuf_serialises():
    cases = [
        ([1 * KiB] * 10, 4 * KiB),
        ([10 * KiB], 4 * KiB),
        ([3000, 9000, 0, 100, 4096, 5000, 1], 4096),
        ([300_000, 5, 70_000], 128 * KiB),  # multi-byte varints for sizes and offsets
    ]
    for sizes, cap in cases:
        blocks = wire_blocks(sizes)
        assert list(encode_chunks(blocks, cap)) == reference_chunks(blocks, cap), (sizes, cap)
    # zero-valued fields are left off the wire, as proto3 does
    zero = [WireBlock(block_id=0, data=b"abc", crc32=0), WireBlock(block_id=2**32 - 1, data=b"", crc32=0)]
    assert list(encode_chunks(zero, 4096)) == reference_chunks(zero, 4096)


def test_encoder_accepts_a_lazy_iterable():
    blocks = wire_blocks([5000, 5000])
    assert list(encode_chunks(iter(blocks), 4096)) == reference_chunks(blocks, 4096)


def test_the_servicer_registers_every_rpc_of_the_service():
    service = pb.DESCRIPTOR.services_by_name["KVHandoff"]
    handlers = kv_handoff_rpc_handlers(_KVHandoffServicer(make_handler()))
    for method in service.methods:
        call = SimpleNamespace(method=f"/{service.full_name}/{method.name}")
        assert handlers.service(call) is not None, f"{method.name} is not served"


def layout(chunks: list[pb.BlockChunk]) -> list[list[tuple[int, int, int]]]:
    """Per chunk: (block_id, offset, len(data)) of each piece."""
    return [[(p.block_id, p.offset, len(p.data)) for p in c.pieces] for c in chunks]


def reassemble(blocks: list[WireBlock], chunks: list[pb.BlockChunk]) -> dict[int, bytes]:
    assembler = BlockAssembler([b.block_id for b in blocks])
    out = {}
    for chunk in chunks:
        for piece in chunk.pieces:
            done = assembler.feed(piece)
            if done is not None:
                out[done[0]] = done[1]
    assert not assembler.has_partial_block
    return out


def test_small_blocks_share_chunks():
    blocks = wire_blocks([1 * KiB] * 10)
    chunks = list(pack_chunks(blocks, 4 * KiB))
    assert [len(c.pieces) for c in chunks] == [4, 4, 2]
    assert all(p.offset == 0 and len(p.data) == 1 * KiB for c in chunks for p in c.pieces)


def test_a_large_block_is_split_into_consecutive_pieces():
    blocks = wire_blocks([10 * KiB])
    chunks = list(pack_chunks(blocks, 4 * KiB))
    assert layout(chunks) == [[(100, 0, 4096)], [(100, 4096, 4096)], [(100, 8192, 2048)]]
    assert all(p.block_bytes == 10 * KiB and p.crc32 == blocks[0].crc32 for c in chunks for p in c.pieces)


def test_mixed_sizes_fill_every_chunk_to_the_cap_and_round_trip():
    sizes = [3000, 9000, 0, 100, 4096, 5000, 1]
    blocks = wire_blocks(sizes)
    chunks = list(pack_chunks(blocks, 4096))
    payloads = [sum(len(p.data) for p in c.pieces) for c in chunks]
    assert payloads[:-1] == [4096] * (len(chunks) - 1)  # all full but the last
    assert sum(payloads) == sum(sizes)
    got = reassemble(blocks, chunks)
    assert got == {i: b.data for i, b in enumerate(blocks)}
    indices = [p.block_index for c in chunks for p in c.pieces]
    assert indices == sorted(indices)


def test_chunk_size_bounds():
    assert validate_chunk_bytes(MIN_CHUNK_BYTES) == MIN_CHUNK_BYTES
    assert validate_chunk_bytes(MAX_CHUNK_BYTES) == MAX_CHUNK_BYTES
    for bad in (MIN_CHUNK_BYTES - 1, MAX_CHUNK_BYTES + 1, 0):
        with pytest.raises(ValueError, match="max_chunk_bytes must be in"):
            validate_chunk_bytes(bad)


def test_assembler_reports_a_corrupt_block_and_carries_on():
    blocks = wire_blocks([1000, 1000, 1000])
    bad = bytearray(blocks[1].data)
    bad[500] ^= 0x10
    blocks_on_wire = [blocks[0], blocks[1]._replace(data=bytes(bad)), blocks[2]]
    assembler = BlockAssembler([b.block_id for b in blocks])
    pieces = [p for c in pack_chunks(blocks_on_wire, 4096) for p in c.pieces]
    assert assembler.feed(pieces[0]) == (0, blocks[0].data)
    with pytest.raises(ChecksumMismatch, match="block 101 \\(index 1\\)") as caught:
        assembler.feed(pieces[1])
    assert (caught.value.block_index, caught.value.block_id) == (1, 101)
    assert assembler.feed(pieces[2]) == (2, blocks[2].data)


def piece(block_id, index, offset, data, block_bytes):
    return pb.BlockPiece(
        block_id=block_id,
        block_index=index,
        offset=offset,
        data=data,
        block_bytes=block_bytes,
        crc32=0,
    )


@pytest.mark.parametrize(
    "pieces, message",
    [
        ([piece(9, 0, 0, b"x", 1)], "not requested"),
        ([piece(1, 5, 0, b"x", 1)], "not requested"),
        ([piece(1, 0, 4, b"x", 8)], "starts at offset 4"),
        ([piece(1, 0, 0, b"xx", 8), piece(1, 0, 3, b"x", 8)], "offset 3, expected 2"),
        ([piece(1, 0, 0, b"xx", 8), piece(2, 1, 0, b"x", 1)], "interleaved"),
        ([piece(1, 0, 0, b"xxx", 2)], "more than 2 bytes"),
    ],
)
def test_assembler_rejects_broken_framing(pieces, message):
    assembler = BlockAssembler([1, 2])
    with pytest.raises(ProtocolError, match=message):
        for p in pieces:
            assembler.feed(p)


def test_assembler_rejects_a_block_sent_twice():
    data = b"abc"
    good = pb.BlockPiece(block_id=1, block_index=0, offset=0, data=data, block_bytes=3, crc32=checksum(data))
    assembler = BlockAssembler([1])
    assert assembler.feed(good) == (0, data)
    with pytest.raises(ProtocolError, match="sent twice"):
        assembler.feed(good)


# -- the producer's handler ----------------------------------------------------


def make_handler(**kwargs):
    source = InMemoryBlockSource()
    source.add("r1", {5: b"five", 6: b"six"})
    return KVHandoffHandler(source, **kwargs)


def test_handler_checksums_before_the_fault_hook_runs():
    handler = make_handler(corrupt=lambda rid, bid, data: data.upper() if bid == 6 else data)
    blocks = list(handler.blocks_for_pull("r1", [6, 5]))
    assert blocks == [WireBlock(6, b"SIX", checksum(b"six")), WireBlock(5, b"five", checksum(b"five"))]


def test_handler_rejects_bad_pulls():
    handler = make_handler()
    with pytest.raises(UnknownRequestError):
        handler.blocks_for_pull("r2", [5])
    with pytest.raises(UnknownBlockError, match="no block 7"):
        handler.blocks_for_pull("r1", [5, 7])
    with pytest.raises(InvalidPullError, match="no block_ids"):
        handler.blocks_for_pull("r1", [])
    with pytest.raises(InvalidPullError, match="duplicate block_ids"):
        handler.blocks_for_pull("r1", [5, 5])
    with pytest.raises(InvalidPullError, match="max_chunk_bytes"):
        handler.chunk_bytes_for(10)
    assert handler.chunk_bytes_for(0) == handler.default_chunk_bytes


def test_handler_passes_each_done_report_on_once():
    calls = []
    handler = make_handler(on_done=lambda rid, ok: calls.append((rid, ok)))

    async def run():
        return [
            await handler.report_done("r1", True),
            await handler.report_done("r1", True),
            await handler.report_done("r2", False),
        ]

    assert asyncio.run(run()) == [True, False, True]
    assert calls == [("r1", True), ("r2", False)]


def test_handler_awaits_an_async_done_callback():
    calls = []

    async def on_done(rid, ok):
        await asyncio.sleep(0)
        calls.append(rid)

    handler = make_handler(on_done=on_done)
    assert asyncio.run(handler.report_done("r1", True)) is True
    assert calls == ["r1"]


def test_message_size_limits_are_deliberate_and_set_on_both_sides():
    from connector.grpc.wire import MAX_MESSAGE_BYTES, MAX_REQUEST_BYTES, channel_options, server_options

    assert MAX_MESSAGE_BYTES == 8 * 1024 * 1024 > MAX_CHUNK_BYTES
    client, server = dict(channel_options()), dict(server_options())
    assert client["grpc.max_send_message_length"] == client["grpc.max_receive_message_length"] == MAX_MESSAGE_BYTES
    assert server["grpc.max_send_message_length"] == MAX_MESSAGE_BYTES
    # The server receives requests only: KiB, not MiB (issue 34).
    assert server["grpc.max_receive_message_length"] == MAX_REQUEST_BYTES == 384 * 1024


def test_the_largest_request_the_server_serves_fits_its_receive_limit():
    from connector.grpc.server import MAX_BLOCKS_PER_PULL, MAX_ID_CHARS, MAX_REASON_CHARS, MAX_TICKET_CHARS
    from connector.grpc.wire import MAX_REQUEST_BYTES

    largest_pull = pb.PullRequest(
        request_id="r" * MAX_ID_CHARS,
        block_ids=[2**32 - 1 - i for i in range(MAX_BLOCKS_PER_PULL)],
        max_chunk_bytes=2**32 - 1,
        consumer_id="c" * MAX_ID_CHARS,
        attempt=2**32 - 1,
        ticket="t" * MAX_TICKET_CHARS,
    )
    largest_done = pb.DoneRequest(
        request_id="r" * MAX_ID_CHARS, consumer_id="c" * MAX_ID_CHARS, reason="x" * MAX_REASON_CHARS, ticket="t" * 128
    )
    assert largest_pull.ByteSize() < MAX_REQUEST_BYTES
    assert largest_done.ByteSize() < MAX_REQUEST_BYTES
