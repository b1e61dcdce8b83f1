"""What every scenario settings model shares: strictness (unknown keys and
infinite or NaN numbers refused), the bounds, and `from_setting`, which
turns a setting declared on a plain dataclass (engine/setting.py) into the
schema's field: the one declaration gives the default, the bounds, the doc
and any further rule."""

from __future__ import annotations

import dataclasses
from typing import Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, ValidatorFunctionWrapHandler
from pydantic_core import PydanticUndefined

from engine.setting import MAX_BLOCKS, MAX_PP, MAX_RUN_S, MAX_SEED, MAX_SEQS, MAX_TOKENS, declaration, declared_settings

__all__ = [
    "MAX_BLOCKS",
    "MAX_NODES",
    "MAX_PP",
    "MAX_RUN_S",
    "MAX_SEED",
    "MAX_SEQS",
    "MAX_TOKENS",
    "DerivedFrom",
    "StrictModel",
    "from_setting",
    "int_or_auto",
    "settings_for",
]

MAX_NODES = 256  # per node group (a fleet: docs/fleet.md)


class DerivedFrom:
    """The mark `from_setting` leaves on a schema field: which dataclass field
    declares it (tests/unit/test_one_source.py checks every field against it)."""

    def __init__(self, owner: type, name: str) -> None:
        self.owner = owner
        self.name = name

    def __repr__(self) -> str:
        return f"DerivedFrom({self.owner.__name__}.{self.name})"


def from_setting(owner: type, name: str, *, bounds: bool = True, **override: Any) -> Any:
    """The schema field of the setting `owner.name` declares (use as the
    pydantic field's default). `bounds=False` leaves the bounds to a wrap
    validator (an int-or-"auto" field, `int_or_auto`); `override` changes the
    default where the scenario's form differs (None: "the preset's")."""
    default, declared = declaration(owner, name)
    kwargs: dict[str, Any] = {"description": declared.doc, **(declared.bounds() if bounds else {})}
    kwargs.update(override)
    if "default" not in kwargs and "default_factory" not in kwargs:
        kwargs["default"] = PydanticUndefined if default is dataclasses.MISSING else default
    info = Field(**kwargs)
    info.metadata.append(DerivedFrom(owner, name))
    if declared.check is not None:
        check = declared.check

        def _checked(v: Any) -> Any:
            if v is not None:
                check(v)
            return v

        info.metadata.append(AfterValidator(_checked))
    return info


def settings_for(owner: type, model: BaseModel) -> dict[str, Any]:
    """The values `model` holds of the settings `owner` declares, by name:
    what `owner(**...)` is built from, without a list of its fields."""
    return {name: getattr(model, name) for name in declared_settings(owner) if name in type(model).model_fields}


def int_or_auto(v: object, handler: ValidatorFunctionWrapHandler, owner: type, name: str) -> object:
    """One error for an int-or-"auto" field, not one per union branch; the
    int's bounds are those `owner.name` declares."""
    if v == "auto":
        return v
    _, declared = declaration(owner, name)
    low, high = int(declared.ge or 0), int(declared.le or 0)
    try:
        value = handler(v)
    except ValidationError:
        value = None
    if not isinstance(value, int) or not low <= value <= high:
        raise ValueError(f"allowed: an int in [{low}, {high}] or 'auto'") from None
    return value


class StrictModel(BaseModel):
    # allow_inf_nan=False: an infinite or NaN number is never a usable setting
    # (NaN corrupts the event queue's ordering; inf never fires).
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


def scenario_relative(path: str, context: dict[str, Any] | None) -> tuple[str, str]:
    """A file path a scenario names, and how it was taken: relative to the scenario file's directory
    (validation context `base_dir`, set by bench/scenario.py) unless absolute, as trace.path is
    (bench/traces.py); without a scenario (a spec built in code) the working directory's."""
    from pathlib import Path

    base = (context or {}).get("base_dir")
    if Path(path).is_absolute():
        return path, "an absolute path"
    if base is None:
        return path, "relative to the working directory"
    return str(Path(base) / path), f"relative to the scenario file's directory, {base}"
