"""Ray's token authentication for the clusters this project launches.

Without it, any process that can reach the cluster's ports — another user on
the machine included — could attach, list the run's named actors, run code
in one through `__ray_call__` and read the run secret there (issue 34). Ray
2.60 turns token auth on for a new local cluster, but keeps the token in
`~/.ray/auth_token`, written with the process umask and shared by every
cluster the user ever starts. So a launch here uses a token of its own:
32 random bytes, hex, in a file readable by this user only (0600 in a 0700
directory), named to Ray by `RAY_AUTH_TOKEN_PATH` before `ray.init`. Ray's
processes inherit the environment, so the raylet, the GCS and the workers
check it; a driver or CLI without it is refused.

One token per driver process: Ray's token loader caches the token it read
first, so every cluster this process launches uses the same one. The file
is removed at exit.

A user's own choices win: with `RAY_AUTH_TOKEN` or `RAY_AUTH_TOKEN_PATH`
set, their token is used; `RAY_AUTH_MODE=disabled` leaves the cluster open
(and says so). Attaching to a running cluster (`--address`) is Ray's
business: start it with `RAY_AUTH_MODE=token` and give the driver the same
token (docs/security.md).
"""

from __future__ import annotations

import atexit
import logging
import os
import secrets
import shutil
import tempfile

logger = logging.getLogger(__name__)

MODE_ENV = "RAY_AUTH_MODE"
TOKEN_ENV = "RAY_AUTH_TOKEN"
TOKEN_PATH_ENV = "RAY_AUTH_TOKEN_PATH"

_token_path: str | None = None


def _private_token_file() -> str:
    global _token_path
    if _token_path is None:
        directory = tempfile.mkdtemp(prefix="dsr-auth-")  # 0700
        path = os.path.join(directory, "auth_token")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as out:
            out.write(secrets.token_hex(32))
        atexit.register(shutil.rmtree, directory, True)
        _token_path = path
    return _token_path


def use_private_token_auth() -> bool:
    """Before launching a local cluster: token auth on with this process's
    private token. Returns False (and warns) when the user disabled it."""
    if os.environ.get(MODE_ENV, "token").lower() == "disabled":
        logger.warning(
            "%s=disabled: the Ray cluster launched now has no authentication; any process that reaches "
            "127.0.0.1 can attach and read the run secret (docs/security.md)",
            MODE_ENV,
        )
        return False
    # RAY_AUTH_MODE stays as it is: unset, `ray.init` turns token mode on for
    # a new cluster itself and refreshes its cached config (setting it here,
    # after `import ray`, would leave the driver's config saying "disabled").
    if not os.environ.get(TOKEN_ENV) and not os.environ.get(TOKEN_PATH_ENV):
        os.environ[TOKEN_PATH_ENV] = _private_token_file()
    return True


def require_ray_auth() -> None:
    """Attached to a cluster (which may span machines): Ray's token
    authentication must be on, or anyone who reaches a node could attach
    and read the run secret from an actor (docs/security.md)."""
    problem = ray_auth_problem()
    if problem:
        raise ValueError(problem)


def ray_auth_problem() -> str | None:
    """Why a run may not attach to a cluster from this process, or None."""
    if os.environ.get(MODE_ENV, "").lower() == "disabled":
        return (
            f"{MODE_ENV}=disabled while attaching to a Ray cluster: a run on a cluster needs Ray's token "
            f"authentication; allowed: {MODE_ENV}=token with the cluster's token ({TOKEN_ENV} or {TOKEN_PATH_ENV}), "
            "or the local default (no --address)"
        )
    return None
