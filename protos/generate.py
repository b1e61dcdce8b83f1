"""Regenerate the committed gRPC/protobuf code: `python -m protos.generate`.

protoc runs from the repository root (-I<root>) so the generated modules
import each other as `protos.disagg.kv_handoff_pb2` — a path this project
installs. (With -Iprotos the import would read `from disagg import ...`, which
only resolves if protos/ itself is put on sys.path, and then the same
descriptors could be imported under two module names.)
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
PROTO_FILES = ("protos/disagg/kv_handoff.proto",)
GENERATED_SUFFIXES = ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py")


def generated_paths(proto: str) -> list[str]:
    """Paths (relative to an output root) of the modules generated from `proto`."""
    stem = proto.removesuffix(".proto")
    return [stem + suffix for suffix in GENERATED_SUFFIXES]


def generate(out_root: Path = REPO_ROOT) -> list[Path]:
    """Run protoc into `out_root` (the repo root by default); return the files written."""
    from grpc_tools import protoc  # build-time tool, kept out of import time

    out_root = Path(out_root)
    args = [
        "grpc_tools.protoc",
        f"-I{REPO_ROOT}",
        f"--python_out={out_root}",
        f"--pyi_out={out_root}",
        f"--grpc_python_out={out_root}",
        *(str(REPO_ROOT / proto) for proto in PROTO_FILES),
    ]
    status = protoc.main(args)
    if status != 0:
        raise RuntimeError(f"protoc failed with status {status}: {' '.join(args)}")
    return [out_root / path for proto in PROTO_FILES for path in generated_paths(proto)]


if __name__ == "__main__":
    for path in generate():
        print(path.relative_to(REPO_ROOT))
    sys.exit(0)
