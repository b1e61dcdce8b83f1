"""The committed generated code matches the .proto, and the contract's shape is pinned."""

import re

from protos.disagg import kv_handoff_pb2 as pb
from protos.generate import PROTO_FILES, REPO_ROOT, generate, generated_paths

# The stamps of the tools' own versions: a fresh machine installs the newest grpcio-tools that
# pyproject.toml allows (1.85.1 wrote the committed code, 1.85.4 was current on 2026-12-07), and a
# patch release changes only these lines. The committed stamps are the floor the runtime must meet.
VERSION_STAMPS = (
    re.compile(rb"^GRPC_GENERATED_VERSION = .*$", re.M),
    re.compile(rb"^# Protobuf Python Version: .*$", re.M),
    re.compile(rb"ValidateProtobufRuntimeVersion\([^)]*\)"),
)


def without_version_stamps(code: bytes) -> bytes:
    for stamp in VERSION_STAMPS:
        code = stamp.sub(b"<version>", code)
    return code


def test_a_tools_patch_release_changes_only_the_stamps():
    committed = (REPO_ROOT / "protos/disagg/kv_handoff_pb2_grpc.py").read_bytes()
    bumped = committed.replace(b"GRPC_GENERATED_VERSION = '1.85.1'", b"GRPC_GENERATED_VERSION = '1.85.4'")
    assert bumped != committed
    assert without_version_stamps(bumped) == without_version_stamps(committed)
    edited = committed.replace(b"PullBlocks", b"PullBlock")
    assert without_version_stamps(edited) != without_version_stamps(committed)


def test_committed_generated_code_is_fresh(tmp_path):
    written = generate(tmp_path)
    assert len(written) == 3 * len(PROTO_FILES)
    stale = []
    for proto in PROTO_FILES:
        for rel in generated_paths(proto):
            fresh = without_version_stamps((tmp_path / rel).read_bytes())
            committed = REPO_ROOT / rel
            if not committed.exists() or without_version_stamps(committed.read_bytes()) != fresh:
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
