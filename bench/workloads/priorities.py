"""Request priorities. As in vLLM, a lower value is served first."""

from __future__ import annotations

from typing import Annotated, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, model_validator

Priority = Annotated[int, Field(ge=-(2**31), le=2**31 - 1)]


class FixedPriority(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["fixed"] = "fixed"
    value: Priority = 0

    def sample(self, rng: np.random.Generator, n: int) -> list[int]:
        return [self.value] * n


class ChoicePriority(BaseModel):
    """Each request draws one of `values`, with `weights` (uniform if omitted)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    kind: Literal["choice"] = "choice"
    values: list[Priority] = Field(min_length=1, max_length=10_000)
    weights: list[float] | None = None

    @model_validator(mode="after")
    def _check_weights(self):
        if self.weights is None:
            return self
        if len(self.weights) != len(self.values):
            raise ValueError(
                f"weights has {len(self.weights)} entries but values has {len(self.values)}; they must match"
            )
        if any(w < 0 for w in self.weights) or sum(self.weights) <= 0:
            raise ValueError("weights must be >= 0 with a positive sum")
        return self

    def sample(self, rng: np.random.Generator, n: int) -> list[int]:
        p = None
        if self.weights is not None:
            total = float(sum(self.weights))
            p = [w / total for w in self.weights]
        idx = rng.choice(len(self.values), size=n, p=p)
        return [self.values[int(i)] for i in idx]


PrioritySpec = Annotated[FixedPriority | ChoicePriority, Field(discriminator="kind")]
