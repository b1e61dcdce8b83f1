"""Plain records that every runtime emits and every report reads.

Times are in seconds on the runtime's clock (virtual in-process, wall in Ray);
`clock` on the run says which. Both runtimes fill the same fields so reports
do not care where a run came from.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field, fields
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


@dataclass
class RequestRecord:
    request_id: str
    arrival_time: float
    prompt_len: int
    max_tokens: int
    priority: int = 0
    # The first time a scheduler admitted the request (prefill node for P/D).
    first_scheduled_time: float | None = None
    # Time the consumer started / finished waiting for remote KV (P/D only).
    remote_kv_wait_start: float | None = None
    remote_kv_wait_end: float | None = None
    # Arrival time of every output token at the client, in order.
    token_times: list[float] = field(default_factory=list)
    output_token_ids: list[int] | TokenIds = field(default_factory=list)  # TokenIds: runs (in-process)
    finish_time: float | None = None
    finish_reason: str | None = None  # "stop", "length", "abort", "error", or None while running
    num_preemptions: int = 0
    # The TTFT in parts (proxy/breakdown.py PARTS), run seconds; None before the first token.
    ttft_breakdown: dict[str, float] | None = None

    @property
    def ttft(self) -> float | None:
        return self.token_times[0] - self.arrival_time if self.token_times else None

    @property
    def e2el(self) -> float | None:
        return self.finish_time - self.arrival_time if self.finish_time is not None else None

    @property
    def queue_time(self) -> float | None:
        if self.first_scheduled_time is None:
            return None
        return self.first_scheduled_time - self.arrival_time

    @property
    def remote_kv_wait(self) -> float | None:
        if self.remote_kv_wait_start is None or self.remote_kv_wait_end is None:
            return None
        return self.remote_kv_wait_end - self.remote_kv_wait_start

    @property
    def succeeded(self) -> bool:
        return self.finish_reason in ("stop", "length") and bool(self.token_times)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(slots=True)
class StepRecord:
    """One scheduled step of one node."""

    node: str
    time: float  # when the step was scheduled
    step_index: int
    batch_size: int
    num_scheduled_tokens: int
    num_prefill_tokens: int
    num_decode_tokens: int
    num_running: int
    num_waiting: int
    num_waiting_for_remote_kvs: int
    num_free_blocks: int
    num_deferred_blocks: int
    num_total_blocks: int
    batches_in_flight: int
    num_preemptions_total: int
    num_zero_progress_preemptions_total: int
    duration: float = 0.0  # modelled step time
    # The step's shape beyond the token counts (engine/cost_model.py StepShape):
    # what `disagg-sim calibrate` fits a cost model on.
    context_tokens: int = 0
    decode_context_tokens: int = 0
    prefill_attention_pairs: int = 0

    @property
    def kv_usage(self) -> float:
        usable = self.num_total_blocks
        return 0.0 if usable == 0 else 1.0 - self.num_free_blocks / usable

    def to_dict(self) -> dict[str, Any]:
        # Every field is a plain scalar: read them directly. (`dataclasses.asdict`
        # deep-copies each value; for the ~60,000 steps of a 10,000-request run
        # that took longer than the run itself, benchmarks/cli_speed.py.)
        d = {name: getattr(self, name) for name in STEP_FIELDS}
        d["kv_usage"] = self.kv_usage
        return d


# A step record's field names, in order (its dict and JSON line: bench/results.py).
STEP_FIELDS = tuple(f.name for f in fields(StepRecord))


@dataclass(frozen=True)
class WorkloadRequest:
    """One request a workload releases: what the load driver hands a runtime."""

    request_id: str
    arrival_time: float
    prompt_len: int
    output_len: int
    priority: int = 0
    # Ids of the prompt's prefix blocks (Mooncake traces).
    hash_ids: tuple[int, ...] = ()
    # The prompt's content as (segment key, length) pairs (`engine/prompt.py`)
    # when it shares segments with other prompts; empty: content of its own.
    prompt_segments: tuple[tuple[int, int], ...] = ()
    # Per-request sampling (the OpenAI front door); None: the cluster's sampler setting.
    ignore_eos: bool | None = None
    min_tokens: int = 0
    stop_token_ids: tuple[int, ...] = ()
