"""What a step computes, as every cost model sees it (the linear models of
engine/cost_model.py and the roofline of engine/roofline.py)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class StepShape:
    """What a step computes, as the cost model sees it. Not frozen: a frozen
    dataclass sets each field through `object.__setattr__`, which made
    building one ~4x slower, and the steady-decode fast-forward builds one per
    forwarded step (issue 15). Nothing changes a shape once built."""

    prefill_tokens: int = 0
    decode_tokens: int = 0
    context_tokens: int = 0
    batch_size: int = 0
    # The detail the roofline needs: context of the decode rows alone (the K/V
    # they read), and the prefill rows' (query, key) pairs under causal
    # attention (n new tokens after `start` cached ones: n*start + n(n+1)/2).
    decode_context_tokens: int = 0
    prefill_attention_pairs: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prefill_tokens + self.decode_tokens
