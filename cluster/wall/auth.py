"""The run's shared secret on framed TCP (proxy channel, stage links): a
challenge-response handshake, so the secret never crosses the wire.

    server -> client: ["challenge", nonce]          16 random bytes
    client -> server: ["auth", who, proof]          proof = HMAC-SHA256(secret, nonce, who)

A peer that does not answer within `HANDSHAKE_TIMEOUT_S`, answers wrongly,
or sends a first frame over `HANDSHAKE_MAX_BYTES` is dropped before any of
its input is read as a message. The secret is created by the driver for one
run (`new_run_secret`) and handed to the actors in their constructor
arguments; it is never logged (see docs/security.md).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import logging
import secrets

from .frames import FrameConnection, FrameError

logger = logging.getLogger(__name__)

HANDSHAKE_TIMEOUT_S = 5.0
HANDSHAKE_MAX_BYTES = 1024
_NONCE_BYTES = 16


class AuthError(Exception):
    """The peer did not prove it knows the run's secret."""


def new_run_secret() -> bytes:
    return secrets.token_bytes(32)


def derive_key(secret: bytes, purpose: str) -> bytes:
    """A key for one use (`"kv-grpc"`, `"tickets/prefill-0"`, ...), so a key
    that leaks from one service opens no other."""
    return hmac.new(secret, b"disagg-sim\0" + purpose.encode(), hashlib.sha256).digest()


def _proof(secret: bytes, nonce: bytes, who: str) -> bytes:
    return hmac.new(secret, b"frame-auth\0" + nonce + b"\0" + who.encode(), hashlib.sha256).digest()


async def challenge(conn: FrameConnection, secret: bytes) -> str:
    """Server side: returns who the peer says it is once it proved the secret; raises AuthError."""
    nonce = secrets.token_bytes(_NONCE_BYTES)
    conn.send(["challenge", nonce])
    try:
        reply = await asyncio.wait_for(conn.recv(max_bytes=HANDSHAKE_MAX_BYTES), HANDSHAKE_TIMEOUT_S)
    except (TimeoutError, FrameError) as err:
        raise AuthError(f"no valid answer to the challenge ({type(err).__name__})") from None
    if not (
        isinstance(reply, list)
        and len(reply) == 3
        and reply[0] == "auth"
        and isinstance(reply[1], str)
        and len(reply[1]) <= 256
        and isinstance(reply[2], bytes)
    ):
        raise AuthError("malformed answer to the challenge")
    if not hmac.compare_digest(reply[2], _proof(secret, nonce, reply[1])):
        raise AuthError("wrong proof")
    return reply[1]


async def answer(conn: FrameConnection, secret: bytes, who: str) -> None:
    """Client side: answer the server's challenge."""
    try:
        frame = await asyncio.wait_for(conn.recv(max_bytes=HANDSHAKE_MAX_BYTES), HANDSHAKE_TIMEOUT_S)
    except (TimeoutError, FrameError) as err:
        raise AuthError(f"no challenge from the server ({type(err).__name__})") from None
    if not (isinstance(frame, list) and len(frame) == 2 and frame[0] == "challenge" and isinstance(frame[1], bytes)):
        raise AuthError("the server sent no challenge")
    conn.send(["auth", who, _proof(secret, frame[1], who)])
