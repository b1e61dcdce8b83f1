"""Prompt content without materialising it: a prompt is a list of segments,
each `length` tokens drawn deterministically from a 64-bit `key`. Requests
that share a segment key at the same place share those tokens — a system
prompt, a conversation's earlier turns, a Mooncake trace's `hash_ids` — so
prefix caching sees exactly the sharing the workload describes, and nothing
else (every other segment has its own key).

A block that lies inside one segment is described by (key, offset, length)
for hashing (`block_key`), which stands for its tokens: the same key and
offset always give the same tokens. Reading tokens one by one
(`__getitem__`) works too, for what needs real ids.
"""

from __future__ import annotations

import hashlib
from bisect import bisect_right
from collections.abc import Iterable, Sequence
from typing import Any, overload

_MASK = (1 << 64) - 1
# Prompt token ids are drawn from a vocabulary of this size.
VOCAB_SIZE = 32000


def segment_key(name: str) -> int:
    """A stable 64-bit key for a named segment (the same in every process)."""
    return int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "big")


def _mix(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & _MASK
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _MASK
    return x ^ (x >> 31)


class PromptTokens(Sequence[int]):
    # `segments` of a `unique` prompt is left unset until read (`__getattr__`):
    # its key is a hash of the request id, which most runs never need
    # (prefix caching off, no shadow store content checks).
    __slots__ = ("segments", "_starts", "_len", "_unique_name")
    _unique_name: str

    def __init__(self, segments: Iterable[tuple[int, int]]) -> None:
        """`segments`: (key, length) pairs, in order; lengths >= 1."""
        self.segments = [(int(k), int(n)) for k, n in segments]
        self._starts = []
        pos = 0
        for key, n in self.segments:
            if n < 1:
                raise ValueError(f"prompt segment {key}: length={n} is invalid; allowed: >= 1")
            self._starts.append(pos)
            pos += n
        self._len = pos

    @classmethod
    def unique(cls, name: str, length: int) -> PromptTokens:
        """A prompt that shares nothing with any other (its own key)."""
        if length < 1:
            raise ValueError(f"prompt segment {name!r}: length={length} is invalid; allowed: >= 1")
        prompt = object.__new__(cls)
        prompt._unique_name = name
        prompt._starts = [0]
        prompt._len = int(length)
        return prompt

    def __getattr__(self, attr: str) -> Any:
        # Only for slots never set: a `unique` prompt's segments, on first read.
        if attr == "segments":
            try:
                name = self._unique_name
            except AttributeError:
                pass
            else:
                self.segments = [(segment_key(name), self._len)]
                return self.segments
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {attr!r}")

    @classmethod
    def of(cls, request_id: str, length: int, segments: Iterable[tuple[int, int]] | None) -> PromptTokens:
        """A request's prompt: its shared segments, or content of its own."""
        return cls(segments) if segments else cls.unique(request_id, length)

    def __len__(self) -> int:
        return self._len

    def _token(self, pos: int) -> int:
        i = bisect_right(self._starts, pos) - 1
        key = self.segments[i][0]
        return _mix(key ^ _mix(pos - self._starts[i])) % VOCAB_SIZE

    @overload
    def __getitem__(self, index: int) -> int: ...
    @overload
    def __getitem__(self, index: slice) -> list[int]: ...
    def __getitem__(self, index: int | slice) -> int | list[int]:
        if isinstance(index, slice):
            return [self._token(p) for p in range(*index.indices(self._len))]
        if index < 0:
            index += self._len
        if not 0 <= index < self._len:
            raise IndexError(index)
        return self._token(index)

    def single_key(self) -> int | None:
        """The key of a prompt of one segment (then `block_key(start, end)` is
        `(key, start, end - start)`), else None."""
        return self.segments[0][0] if len(self._starts) == 1 else None

    def block_key(self, start: int, end: int) -> tuple[Any, ...]:
        """What stands for the tokens [start, end) when hashing a block."""
        i = bisect_right(self._starts, start) - 1
        parts = []
        pos = start
        while pos < end:
            key, n = self.segments[i]
            seg_start = self._starts[i]
            stop = min(end, seg_start + n)
            parts.append((key, pos - seg_start, stop - pos))
            pos = stop
            i += 1
        return parts[0] if len(parts) == 1 else tuple(parts)

    def __repr__(self) -> str:
        return f"PromptTokens({len(self.segments)} segment(s), {self._len} tokens)"
