"""A deterministic sampler: the token at a position depends only on (seed,
request id, position), so a recomputed request reproduces its tokens, every
process agrees on them, and the client can check every token it receives.

The request id is hashed once (blake2b, stable across processes); each
position then goes through a splitmix64 finaliser, which is cheap enough for
the per-token hot path."""

from __future__ import annotations

import hashlib
from functools import cache
from typing import Any

EOS_TOKEN_ID = 2
VOCAB_SIZE = 32000
_MASK64 = (1 << 64) - 1
# `tokens_each` draws a batch this large or larger with numpy: below it, the
# arrays' fixed cost is more than the plain loop (~0.7 µs a token).
_NUMPY_BATCH = 24


class DeterministicSampler:
    def __init__(self, seed: int = 0, stop_probability: float = 0.0, eos_token_id: int = EOS_TOKEN_ID) -> None:
        if not 0.0 <= stop_probability <= 1.0:
            raise ValueError(f"stop_probability={stop_probability!r} is invalid; allowed: a probability in [0, 1]")
        self.seed = seed
        self.stop_probability = stop_probability
        self.eos_token_id = eos_token_id
        self._threshold = int(stop_probability * (1 << 64))
        self._bases: dict[str, int] = {}
        self._prefix = f"{seed}/".encode()  # hashed with the request id: f"{seed}/{request_id}"

    def _base(self, request_id: str) -> int:
        base = self._bases.get(request_id)
        if base is None:
            digest = hashlib.blake2b(self._prefix + request_id.encode(), digest_size=8).digest()
            base = self._bases[request_id] = int.from_bytes(digest, "little")
        return base

    def token_at(self, request_id: str, position: int) -> int:
        base = self._bases.get(request_id)
        if base is None:
            base = self._base(request_id)
        z = (base + (position + 1) * 0x9E3779B97F4A7C15) & _MASK64
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
        z ^= z >> 31
        if z < self._threshold:
            return self.eos_token_id
        # Never collide with EOS by accident.
        return 3 + (z >> 16) % (VOCAB_SIZE - 3)

    def tokens_at(self, request_id: str, first: int, n: int) -> list[int]:
        """`token_at` at positions `first` .. `first + n - 1` (a block's worth
        of ids to hash: engine/block_hash.py)."""
        token_at = self.token_at
        return [token_at(request_id, p) for p in range(first, first + n)]

    def token_windows(self, windows: list[tuple[str, int, int]]) -> list[list[int]]:
        """`tokens_at(*w)` for each window `w` (request id, first position,
        count), computed together with 64-bit numpy arithmetic (the same
        splitmix64 steps, wrapping as the masks do): one pass for the blocks
        a fast-forward caches."""
        if not windows:
            return []
        np = _numpy_constants()[0]
        width = max(n for _, _, n in windows)
        bases = np.array([self._base(rid) for rid, _, _ in windows], dtype=np.uint64)
        firsts = np.array([first for _, first, _ in windows], dtype=np.uint64)
        rows = self._numpy_tokens(bases[:, None], firsts[:, None] + np.arange(width, dtype=np.uint64)).tolist()
        return [row if n == width else row[:n] for row, (_, _, n) in zip(rows, windows)]

    def tokens_each(self, request_ids: list[str], positions: list[int]) -> list[int]:
        """`token_at(r, p)` for each pair (a bulk step's one token per
        request: engine/bulk_step.py), with numpy for a large batch."""
        if len(request_ids) < _NUMPY_BATCH:
            token_at = self.token_at
            return [token_at(r, p) for r, p in zip(request_ids, positions)]
        np = _numpy_constants()[0]
        bases_of, base = self._bases, self._base
        bases = np.array([b if (b := bases_of.get(r)) is not None else base(r) for r in request_ids], dtype=np.uint64)
        tokens: list[int] = self._numpy_tokens(bases, np.array(positions, dtype=np.uint64)).tolist()
        return tokens

    def _numpy_tokens(self, bases: Any, positions: Any) -> Any:
        """`token_at`'s splitmix64 steps on uint64 arrays (broadcast), wrapping
        as its masks do."""
        np, golden, mix1, mix2, s16, s27, s30, s31, three, span = _numpy_constants()
        # (numpy's stubs widen uint64 arithmetic with a scalar to float64; it stays uint64.)
        z: Any = bases + (positions + np.uint64(1)) * golden  # position + 1, as `token_at`
        z = (z ^ (z >> s30)) * mix1
        z = (z ^ (z >> s27)) * mix2
        z ^= z >> s31
        tokens = three + (z >> s16) % span
        if self._threshold >= 1 << 64:
            tokens[...] = self.eos_token_id
        elif self._threshold > 0:
            tokens = np.where(z < np.uint64(self._threshold), np.uint64(self.eos_token_id), tokens)
        return tokens

    def can_sample(self, token_id: int) -> bool:
        """Whether `token_at` can ever return `token_id` (EOS only with a stop probability)."""
        if token_id == self.eos_token_id and self._threshold > 0:
            return True
        return 3 <= token_id < VOCAB_SIZE

    def forget(self, request_id: str) -> None:
        """Drop a finished request's cached hash (long runs, many requests)."""
        self._bases.pop(request_id, None)


@cache
def _numpy_constants() -> tuple[Any, ...]:
    """numpy and `token_at`'s constants as uint64 scalars, for
    `token_windows` (imported on first use: most processes never need it)."""
    import numpy as np

    u = np.uint64
    return (
        np,
        u(0x9E3779B97F4A7C15),
        u(0xBF58476D1CE4E5B9),
        u(0x94D049BB133111EB),
        u(16),
        u(27),
        u(30),
        u(31),
        u(3),
        u(VOCAB_SIZE - 3),
    )
