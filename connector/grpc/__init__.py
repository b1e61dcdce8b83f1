"""The KV handoff over gRPC (`grpc.aio`), wall clock.

- `server`: the producer's `KVHandoffServer` (a gRPC-free handler behind a
  thin servicer) serving a `BlockSource`;
- `client`: the consumer's `KVPuller` — single attempts (`attempt`,
  `report`) and whole pulls under the shared retry policy (`pull`);
- `kv_transport`: `GrpcKVTransport`, the `KVTransport` port on a `KVPuller`;
- `pull_config`: `PullerConfig` and the gRPC status → `PullFailure` maps;
- `framing`: blocks ↔ BlockChunk bytes, CRC-checked reassembly;
- `link`: client interceptors that run calls through a `connector.link.Link`;
- `wire`: message limits, chunk sizes, channel and server options.
"""

from .client import KVPuller
from .kv_transport import GrpcKVTransport
from .pull_config import PullerConfig
from .server import KVHandoffServer

__all__ = ["GrpcKVTransport", "KVHandoffServer", "KVPuller", "PullerConfig"]
