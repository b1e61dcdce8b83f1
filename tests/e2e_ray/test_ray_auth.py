"""Ray's own door is shut (issue 34, finding 2): the cluster the project
launches runs with token authentication, its token in a file only this
user can read; a driver without the token cannot attach, and the GCS
answers nobody who does not show it. All on 127.0.0.1."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import grpc
import pytest

from cluster.ray.env import ray

pytestmark = [pytest.mark.ray, pytest.mark.timeout(180)]

ATTACH = "import sys, ray; ray.init(address=sys.argv[1]); print('ATTACHED', len(ray.nodes()))"
KV_KEYS = "/ray.rpc.InternalKVGcsService/InternalKVKeys"


def stranger_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    """This machine, but none of the run's Ray credentials: no token in the
    environment, a home without ~/.ray/auth_token."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
    env["HOME"] = str(tmp_path)
    env.update(extra)
    return env


def attach(gcs: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", ATTACH, gcs], env=env, capture_output=True, text=True, timeout=120)


def test_the_token_file_is_private_to_the_user(ray_cluster):
    path = Path(os.environ["RAY_AUTH_TOKEN_PATH"])
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert len(path.read_text()) == 64  # 32 random bytes, hex


def test_a_driver_without_the_token_cannot_attach(ray_cluster, tmp_path):
    gcs = ray.get_runtime_context().gcs_address
    refused = attach(gcs, stranger_env(tmp_path))
    assert refused.returncode != 0 and "ATTACHED" not in refused.stdout
    assert "Authentication token is missing or incorrect" in refused.stderr
    # The same driver with the token gets in: the refusal was the token's.
    token_path = os.environ["RAY_AUTH_TOKEN_PATH"]
    admitted = attach(gcs, stranger_env(tmp_path, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=token_path))
    assert admitted.returncode == 0, admitted.stderr[-500:]
    assert "ATTACHED 1" in admitted.stdout


def test_the_gcs_answers_nobody_without_the_token(ray_cluster):
    """What another user did to the unauthenticated cluster: read the GCS's
    internal KV keys with a plain gRPC call."""
    from ray.core.generated import gcs_service_pb2 as gcs_pb

    gcs = ray.get_runtime_context().gcs_address
    token = Path(os.environ["RAY_AUTH_TOKEN_PATH"]).read_text()
    request = gcs_pb.InternalKVKeysRequest(prefix=b"", namespace=b"").SerializeToString()
    with grpc.insecure_channel(gcs) as channel:
        keys = channel.unary_unary(KV_KEYS)
        with pytest.raises(grpc.RpcError) as refused:
            keys(request, timeout=10)
        assert refused.value.code() is grpc.StatusCode.UNAUTHENTICATED
        with pytest.raises(grpc.RpcError) as wrong:
            keys(request, timeout=10, metadata=(("authorization", "Bearer " + "0" * 64),))
        assert wrong.value.code() is grpc.StatusCode.UNAUTHENTICATED
        reply = gcs_pb.InternalKVKeysReply.FromString(
            keys(request, timeout=10, metadata=(("authorization", "Bearer " + token),))
        )
    assert reply.status.code == 0 and reply.results
