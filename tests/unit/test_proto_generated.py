"""The committed generated code matches the .proto, and the contract's shape is pinned."""

from protos.disagg import kv_handoff_pb2 as pb
from protos.generate import PROTO_FILES, REPO_ROOT, generate, generated_paths


def test_committed_generated_code_is_fresh(tmp_path):
    written = generate(tmp_path)
    assert len(written) == 3 * len(PROTO_FILES)
    stale = []
    for proto in PROTO_FILES:
        for rel in generated_paths(proto):
            fresh = (tmp_path / rel).read_bytes()
            committed = REPO_ROOT / rel
            if not committed.exists() or committed.read_bytes() != fresh:
                stale.append(rel)
    assert not stale, f"stale generated code {stale}: run `python -m protos.generate`"


def test_generated_grpc_module_imports_its_messages_package_qualified():
    text = (REPO_ROOT / "protos/disagg/kv_handoff_pb2_grpc.py").read_text()
    assert "from protos.disagg import kv_handoff_pb2" in text


def test_service_shape():
    service = pb.DESCRIPTOR.services_by_name["KVHandoff"]
    assert pb.DESCRIPTOR.package == "disagg"
    shape = {
        m.name: (m.input_type.name, m.output_type.name, m.client_streaming, m.server_streaming) for m in service.methods
    }
    assert shape == {
        "PullBlocks": ("PullRequest", "BlockChunk", False, True),
        "ReportDone": ("DoneRequest", "DoneAck", False, False),
        "Check": ("HealthCheckRequest", "HealthCheckResponse", False, False),
    }


def test_messages_round_trip():
    chunk = pb.BlockChunk(
        pieces=[pb.BlockPiece(block_id=7, block_index=0, block_bytes=3, crc32=0xFFFFFFFF, offset=0, data=b"abc")]
    )
    again = pb.BlockChunk.FromString(chunk.SerializeToString())
    assert again == chunk and again.pieces[0].crc32 == 0xFFFFFFFF
    request = pb.PullRequest(request_id="r", block_ids=[3, 1, 2], max_chunk_bytes=1 << 20, attempt=2)
    assert list(pb.PullRequest.FromString(request.SerializeToString()).block_ids) == [3, 1, 2]
