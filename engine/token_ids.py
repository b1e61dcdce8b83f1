"""A request's output token ids, kept as runs where they are the
deterministic sampler's (`TokenIds`; `RequestRecord.output_token_ids` in
engine/records.py). A module of its own so that the records can be compiled
(docs/compiled.md) while this `Sequence` subclass stays interpreted."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any, overload


class TokenIds(Sequence[int]):
    """A request's output token ids as the client received them, in order,
    with runs kept as (first output index, count) instead of one int per
    token where the ids are the deterministic sampler's (token ids depend only
    on (request, position): `engine/sampler.py`). It reads like a list (len,
    index, slice, iteration, == with a list) and is built on first read.

    Ids that arrive explicitly (`extend`) are kept as given; a run added with
    `add_run` names the output indices it covers, so a gap, a repeat or a
    reorder is still visible to the end-of-run check (`check`)."""

    __slots__ = ("_pieces", "_len", "_source", "_list")

    def __init__(self, ids: Iterable[int] = ()) -> None:
        # Each piece: a list of explicit ids, or a (first output index, count) run.
        self._pieces: list[Any] = []
        self._len = 0
        # (token_at, request id, prompt length) for the runs.
        self._source: tuple[Callable[[str, int], int], str, int] | None = None
        self._list: list[int] | None = None  # built on first read
        self.extend(ids)

    def extend(self, ids: Iterable[int]) -> None:
        ids = list(ids)
        if not ids:
            return
        self._list = None
        if self._pieces and type(self._pieces[-1]) is list:
            self._pieces[-1].extend(ids)
        else:
            self._pieces.append(ids)
        self._len += len(ids)

    def append(self, token_id: int) -> None:
        self.extend((token_id,))

    def add_run(
        self, token_at: Callable[[str, int], int], request_id: str, prompt_len: int, first: int, n: int
    ) -> None:
        """The ids of output indices [first, first + n): token_at(request_id, prompt_len + index)."""
        if n <= 0:
            return
        self._source = (token_at, request_id, prompt_len)
        self._list = None
        last = self._pieces[-1] if self._pieces else None
        if type(last) is tuple and last[0] + last[1] == first:
            self._pieces[-1] = (last[0], last[1] + n)
        else:
            self._pieces.append((first, n))
        self._len += n

    def _ids(self) -> list[int]:
        if self._list is None:
            out: list[int] = []
            for piece in self._pieces:
                if type(piece) is list:
                    out.extend(piece)
                else:
                    assert self._source is not None
                    token_at, rid, prompt_len = self._source
                    first, n = piece
                    out.extend(token_at(rid, prompt_len + i) for i in range(first, first + n))
            self._list = out
        return self._list

    def check(
        self, token_at: Callable[[str, int], int], request_id: str, prompt_len: int
    ) -> tuple[int, int, int] | None:
        """The first output index whose token is not the sampler's, as (index,
        got, expected), or None. Explicit ids are checked one by one; a run by
        its indices (it must start where the tokens before it end)."""
        k = 0
        for piece in self._pieces:
            if type(piece) is list:
                for tok in piece:
                    want = token_at(request_id, prompt_len + k)
                    if tok != want:
                        return k, tok, want
                    k += 1
            else:
                first, n = piece
                if first != k:
                    return k, token_at(request_id, prompt_len + first), token_at(request_id, prompt_len + k)
                k += n
        return None

    @property
    def has_runs(self) -> bool:
        return self._source is not None

    def __len__(self) -> int:
        return self._len

    @overload
    def __getitem__(self, i: int) -> int: ...
    @overload
    def __getitem__(self, i: slice) -> list[int]: ...
    def __getitem__(self, i: int | slice) -> int | list[int]:
        return self._ids()[i]

    def __iter__(self) -> Iterator[int]:
        return iter(self._ids())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, TokenIds):
            return self._ids() == other._ids()
        if isinstance(other, list):
            return self._ids() == other
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return repr(self._ids())

    # A copy is a plain list. A pickle keeps the runs (and the sampler they
    # are drawn from, once per pickle however many records name it): a
    # sweep's worker processes send whole runs back (bench/parallel_runs.py),
    # and drawing every id to send it took about as long as the run.
    def __copy__(self) -> list[int]:
        return list(self._ids())

    def __deepcopy__(self, memo: dict[int, Any]) -> list[int]:
        return list(self._ids())

    def __reduce__(self) -> tuple[Callable[[list[Any], int, Any], TokenIds], tuple[list[Any], int, Any]]:
        return (_restore_token_ids, (self._pieces, self._len, self._source))


def _restore_token_ids(pieces: list[Any], length: int, source: Any) -> TokenIds:
    ids = TokenIds()
    ids._pieces, ids._len, ids._source = pieces, length, source
    return ids
