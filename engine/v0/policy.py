"""The v0 scheduling policy abstraction (vLLM 0.5.3.post1 `vllm/core/policy.py`).

A registry whose only entry is `fcfs`, and no switch: the scheduler asks for
"fcfs" by name. Its only effect is to sort `running` and `swapped` by priority
`now - arrival_time` (descending, stable), i.e. by arrival time, oldest first.
`waiting` is never sorted: it is assumed to be in arrival order already.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

from engine.v0.sequence import SequenceGroup


class Policy:
    def get_priority(self, now: float, seq_group: SequenceGroup) -> float:
        raise NotImplementedError

    def sort_by_priority(self, now: float, seq_groups: Iterable[SequenceGroup]) -> deque[SequenceGroup]:
        # sorted(reverse=True) keeps equal priorities in their current order.
        return deque(sorted(seq_groups, key=lambda g: self.get_priority(now, g), reverse=True))


class FCFS(Policy):
    def get_priority(self, now: float, seq_group: SequenceGroup) -> float:
        return now - seq_group.arrival_time

    def sort_by_priority(self, now: float, seq_groups: Iterable[SequenceGroup]) -> deque[SequenceGroup]:
        # get_priority inlined: this runs over `running` every step. The key is
        # the same float expression, so ties (and the stable order) are vLLM's.
        return deque(sorted(seq_groups, key=lambda g: now - g.arrival_time, reverse=True))


class PolicyFactory:
    _POLICY_REGISTRY = {"fcfs": FCFS}

    @classmethod
    def get_policy(cls, policy_name: str) -> Policy:
        try:
            return cls._POLICY_REGISTRY[policy_name]()
        except KeyError:
            raise ValueError(
                f"policy_name={policy_name!r} is invalid; allowed: {sorted(cls._POLICY_REGISTRY)} "
                "(vLLM 0.5.3's v0 scheduler has no other policy)"
            ) from None
