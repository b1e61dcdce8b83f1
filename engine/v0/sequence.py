"""`Sequence` and `SequenceGroup` as vLLM 0.5.3.post1's v0 scheduler sees them
(`vllm/sequence.py`).

Only n=1 is modelled: a group holds exactly one sequence (no beam search, no
best_of forking), which is what every request of the simulator is. Tokens are
kept as ids because stop checks read them; the prompt may be a range of ids.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence as Seq

from engine.request import Request, SamplingParams


class SequenceStatus(enum.IntEnum):
    """vLLM 0.5.3's values: everything above SWAPPED is finished."""

    WAITING = 0
    RUNNING = 1
    SWAPPED = 2
    FINISHED_STOPPED = 3
    FINISHED_LENGTH_CAPPED = 4
    FINISHED_ABORTED = 5
    FINISHED_IGNORED = 6

    @staticmethod
    def is_finished(status: SequenceStatus) -> bool:
        return status > SequenceStatus.SWAPPED

    @staticmethod
    def get_finished_reason(status: SequenceStatus) -> str | None:
        # An ignored prompt exceeded a length limit, so OpenAI's "length".
        return {
            SequenceStatus.FINISHED_STOPPED: "stop",
            SequenceStatus.FINISHED_LENGTH_CAPPED: "length",
            SequenceStatus.FINISHED_ABORTED: "abort",
            SequenceStatus.FINISHED_IGNORED: "length",
        }.get(status)


class SequenceStage(enum.Enum):
    PREFILL = enum.auto()
    DECODE = enum.auto()


class Sequence:
    """One token sequence with its computed-token cursor (`SequenceData` folded in)."""

    def __init__(
        self, seq_id: int, prompt_token_ids: Seq[int], block_size: int, eos_token_id: int | None = None
    ) -> None:
        if len(prompt_token_ids) == 0:
            raise ValueError(f"sequence {seq_id}: the prompt must hold at least one token")
        self.seq_id = seq_id
        self.prompt_token_ids = prompt_token_ids
        self.output_token_ids: list[int] = []
        self.block_size = block_size
        self.eos_token_id = eos_token_id
        self.status = SequenceStatus.WAITING
        self.stop_reason: int | None = None
        self._num_computed_tokens = 0
        self._stage = SequenceStage.PREFILL
        # Kept current on every append: the scheduler reads the length (and the
        # block count derived from it) for every running sequence every step.
        self._len = len(prompt_token_ids)

    # -- lengths -------------------------------------------------------------
    def get_len(self) -> int:
        return self._len

    def get_prompt_len(self) -> int:
        return len(self.prompt_token_ids)

    def get_output_len(self) -> int:
        return len(self.output_token_ids)

    @property
    def n_blocks(self) -> int:
        """Logical blocks the whole sequence (prompt + outputs) occupies."""
        return -(-self._len // self.block_size)

    def get_last_token_id(self) -> int:
        return self.output_token_ids[-1] if self.output_token_ids else self.prompt_token_ids[-1]

    def append_token_id(self, token_id: int) -> None:
        self.output_token_ids.append(token_id)
        self._len += 1

    # -- computed-token cursor -----------------------------------------------
    def get_num_computed_tokens(self) -> int:
        return self._num_computed_tokens

    def get_num_uncomputed_tokens(self) -> int:
        # The length, not the prompt length: a recomputed victim prefills its outputs too.
        return self._len - self._num_computed_tokens

    def update_num_computed_tokens(self, num_new_computed_tokens: int) -> None:
        computed = self._num_computed_tokens = self._num_computed_tokens + num_new_computed_tokens
        if computed >= self._len:
            if computed > self._len:
                raise AssertionError(f"sequence {self.seq_id}: computed {computed} > length {self._len}")
            self._stage = SequenceStage.DECODE

    def reset_state_for_recompute(self) -> None:
        self._num_computed_tokens = 0
        self._stage = SequenceStage.PREFILL

    def get_num_new_tokens(self) -> int:
        """1 for a decode, else the tokens still to prefill."""
        if self._stage == SequenceStage.DECODE:
            return 1
        return self.get_num_uncomputed_tokens()

    def is_prefill(self) -> bool:
        return self._stage == SequenceStage.PREFILL

    def is_finished(self) -> bool:
        return SequenceStatus.is_finished(self.status)

    def __repr__(self) -> str:
        return (
            f"Sequence(seq_id={self.seq_id}, status={self.status.name}, "
            f"num_blocks={self.n_blocks}, len={self.get_len()})"
        )


class SequenceGroup:
    """A request: one sequence (n=1), its sampling parameters and timings."""

    def __init__(self, request_id: str, seq: Sequence, arrival_time: float, sampling_params: SamplingParams) -> None:
        self.request_id = request_id
        self.seqs = [seq]
        self.arrival_time = arrival_time
        self.sampling_params = sampling_params
        self.first_scheduled_time: float | None = None
        self.first_token_time: float | None = None
        self.finished_time: float | None = None
        # Simulator extras kept by the v1-shaped adapter, here rather than in
        # dicts keyed by request id because they are read every step: the v1
        # `Request` this group mirrors, and how many of its blocks the worker knows.
        self.request: Request | None = None
        self.num_known_blocks = 0

    @property
    def seq(self) -> Sequence:
        return self.seqs[0]

    def get_seqs(self, status: SequenceStatus | None = None) -> list[Sequence]:
        seq = self.seqs[0]  # n=1; these three run for every group every step
        if status is None or seq.status == status:
            return [seq]
        return []

    def num_seqs(self, status: SequenceStatus | None = None) -> int:
        return 1 if status is None or self.seqs[0].status == status else 0

    def get_max_num_running_seqs(self) -> int:
        # n=1, best_of=1: the number of unfinished sequences (vLLM's non-beam branch).
        return 0 if self.seqs[0].status > SequenceStatus.SWAPPED else 1

    def update_num_computed_tokens(self, num_new_computed_tokens: int) -> None:
        for s in self.seqs:
            if not s.is_finished():
                s.update_num_computed_tokens(num_new_computed_tokens)

    def get_num_uncomputed_tokens(self) -> int:
        return sum(s.get_num_uncomputed_tokens() for s in self.seqs if not s.is_finished())

    def is_finished(self) -> bool:
        # n=1: the group is finished when its one sequence is (hot: scanned every step).
        return self.seqs[0].status > SequenceStatus.SWAPPED

    def is_prefill(self) -> bool:
        return self.seqs[0].is_prefill()

    def maybe_set_first_scheduled_time(self, now: float) -> None:
        if self.first_scheduled_time is None:
            self.first_scheduled_time = now

    def __repr__(self) -> str:
        return f"SequenceGroup(request_id={self.request_id!r}, num_seqs={len(self.seqs)})"
