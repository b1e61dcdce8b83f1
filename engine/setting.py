"""One declaration per setting.

A setting a scenario may give (`max_num_seqs`, a link's `delay_ms`, ...) is
declared once, on the plain frozen dataclass that uses it (`SchedulerConfig`,
`LinkSpec`, `NodeSettings`, ...): its name, type, default, bounds and doc,
through `setting()`. The scenario schema (pydantic, `cluster/settings_base.py`
`from_setting`) reads that declaration to build its field, and is the only
place a value is validated; the dataclasses trust what they are given and
check nothing again. So a new setting is one `setting(...)` line here and one
`from_setting(...)` line in the schema, and a bound or a doc changes in one
place (docs/architecture.md, "Adding a setting").

Plain Python on purpose: the engine knows nothing of pydantic.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# Upper bounds on sizes and times. They are far above anything a simulation
# of one serving cluster needs and low enough that a typo (an extra few zeros,
# `1e12`, `inf`) is refused at load instead of exhausting memory or stalling
# the event queue mid-run.
MAX_BLOCKS = 1_000_000  # KV blocks per node (an 80 GB GPU holds ~30k 16-token blocks of an 8B model)
MAX_TOKENS = 10_000_000  # max_model_len, token budgets, thresholds
MAX_SEQS = 65_536
MAX_PP = 64
MAX_RUN_S = 86_400.0  # a day of run time for timeouts, deadlines, holds
MAX_SEED = 2**32 - 1  # numpy's SeedSequence and the link seeds take non-negative ints
MAX_TERM_S = 3600.0  # one term of the P/D hand-off: an hour is far beyond any real one

# The key of a setting's declaration in a dataclass field's metadata.
SETTING_KEY = "disagg_sim.setting"


@dataclass(frozen=True)
class Setting:
    """What a setting allows and means, besides its type and default."""

    doc: str
    ge: float | None = None
    gt: float | None = None
    le: float | None = None
    lt: float | None = None
    # A rule beyond bounds (e.g. a known release): raises ValueError with the allowed values.
    check: Callable[[Any], None] | None = None

    def bounds(self) -> dict[str, float]:
        return {k: v for k, v in (("ge", self.ge), ("gt", self.gt), ("le", self.le), ("lt", self.lt)) if v is not None}


def setting(
    default: Any = dataclasses.MISSING,
    *,
    doc: str,
    ge: float | None = None,
    gt: float | None = None,
    le: float | None = None,
    lt: float | None = None,
    check: Callable[[Any], None] | None = None,
) -> Any:
    """A dataclass field that declares a setting (use as the field's default)."""
    return dataclasses.field(default=default, metadata={SETTING_KEY: Setting(doc, ge, gt, le, lt, check)})


def declared_settings(cls: type) -> dict[str, dataclasses.Field[Any]]:
    """The fields of dataclass `cls` that declare a setting, by name."""
    return {f.name: f for f in dataclasses.fields(cls) if SETTING_KEY in f.metadata}


def declaration(cls: type, name: str) -> tuple[Any, Setting]:
    """The default and the `Setting` of `cls.name`; a KeyError names what `cls` declares."""
    fields = declared_settings(cls)
    if name not in fields:
        raise KeyError(f"{cls.__name__} declares no setting {name!r}; it declares {sorted(fields)}")
    f = fields[name]
    return f.default, f.metadata[SETTING_KEY]


def check_declared(owner: type, name: str, value: Any, label: str) -> None:
    """Checks a value that does not come through the scenario schema (a
    programmatic API, e.g. the gRPC puller's own config) against the one
    declaration of the setting: its bounds and rule."""
    _, declared = declaration(owner, name)
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if declared.bounds() and not (number and value == value and abs(value) != float("inf")):
        raise ValueError(f"{label}.{name}={value!r} is invalid; allowed: a finite number")
    for op, bound in declared.bounds().items():
        ok = {"ge": value >= bound, "gt": value > bound, "le": value <= bound, "lt": value < bound}[op]
        if not ok:
            sign = {"ge": ">=", "gt": ">", "le": "<=", "lt": "<"}[op]
            raise ValueError(f"{label}.{name}={value!r} is invalid; allowed: {sign} {bound:g}")
    if declared.check is not None:
        declared.check(value)
