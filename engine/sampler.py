"""A deterministic sampler: the token at a position depends only on (seed,
request id, position), so a recomputed request reproduces its tokens and the
client can check every token it receives."""

from __future__ import annotations

import hashlib

EOS_TOKEN_ID = 2
VOCAB_SIZE = 32000


class DeterministicSampler:
    def __init__(self, seed: int = 0, stop_probability: float = 0.0, eos_token_id: int = EOS_TOKEN_ID) -> None:
        if not 0.0 <= stop_probability <= 1.0:
            raise ValueError(f"stop_probability={stop_probability!r} is invalid; allowed: a probability in [0, 1]")
        self.seed = seed
        self.stop_probability = stop_probability
        self.eos_token_id = eos_token_id
        self._threshold = int(stop_probability * (1 << 64))

    def token_at(self, request_id: str, position: int) -> int:
        digest = hashlib.blake2b(f"{self.seed}/{request_id}/{position}".encode(), digest_size=16).digest()
        if int.from_bytes(digest[:8], "little") < self._threshold:
            return self.eos_token_id
        # Never collide with EOS by accident.
        return 3 + int.from_bytes(digest[8:], "little") % (VOCAB_SIZE - 3)
