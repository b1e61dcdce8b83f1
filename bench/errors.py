"""Bad input, said in one line.

Every error a user can cause — a scenario file, a trace, a flag, `--set`, a
threshold, a results file — is an `InputError`. The CLI prints its message
as one line (`error: <where>: <what is wrong>; <what is allowed>`) and exits
with code 2, so CI never mistakes bad input for a failed threshold (1) or a
broken run (3). Anything else that escapes is a bug and is reported as one.
"""

from __future__ import annotations

import typing
from collections.abc import Callable, Iterable
from typing import Any

from pydantic import BaseModel, ValidationError


class InputError(ValueError):
    """Input the simulator refuses; the message says where, what and what is allowed."""


def did_you_mean(word: str, candidates: Iterable[str]) -> str:
    """'; did you mean X?' when a close match exists (bench/suggest.py: by tokens and spelling), else ''."""
    from .suggest import closest

    close = closest(word, candidates)
    return f"; did you mean {close}?" if close else ""


def one_line(text: str) -> str:
    """Collapse a message to one line (a caret diagram or a wrapped message)."""
    return " ".join(part.strip() for part in text.splitlines() if part.strip())


def format_validation_error(
    exc: ValidationError,
    model: type[BaseModel],
    where: str,
    locate: Callable[[tuple], str] | None = None,
    prefix: tuple = (),
    max_errors: int = 3,
) -> str:
    """pydantic's errors as one line: `where: dotted.key=value: problem (allowed ...)`.

    `prefix` is where `model` sits in the user's document (e.g. ("cluster",));
    `locate(path)` turns a document path into `file:line` (or "--set k=v").
    Union tags (`uniform` in `prompt_len.uniform.hihg`) are dropped from the
    path: the user never writes them.
    """
    parts = []
    errors = _drop_losing_union_branches(exc.errors())
    for err in errors[:max_errors]:
        loc = _user_path(model, tuple(err["loc"]))
        path = (*prefix, *loc)
        dotted = ".".join(str(p) for p in path) or "(top level)"
        msg = str(err["msg"]).removeprefix("Value error, ")
        kind = err["type"]
        if kind == "extra_forbidden":
            allowed = _allowed_fields(model, tuple(err["loc"])[:-1])
            msg = f"unknown key{did_you_mean(str(loc[-1]), allowed)}"
            if allowed:
                msg += f" (allowed: {', '.join(allowed)})"
        elif kind == "missing":
            msg = "required key missing"
        elif "input" in err and not isinstance(err["input"], (dict, list)):
            dotted += f"={_short(err['input'])}"
        head = locate(path) if locate is not None else where
        parts.append(f"{head}: {dotted}: {msg}")
    more = len(errors) - max_errors
    text = "; ".join(parts) + (f" (and {more} more)" if more > 0 else "")
    return one_line(text)


_PRIMITIVE_TAGS = {"str", "int", "float", "bool", "none", "list", "dict"}


def _drop_losing_union_branches(errors: list) -> list:
    """For `str | Model` given a mapping, pydantic reports both branches; the
    "should be a valid string" one says nothing useful when the model branch
    has errors of its own."""
    out = []
    for err in errors:
        loc = tuple(err["loc"])
        if loc and loc[-1] in _PRIMITIVE_TAGS:
            siblings = [e for e in errors if e is not err and tuple(e["loc"])[: len(loc) - 1] == loc[:-1]]
            if siblings:
                continue
        out.append(err)
    return out


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _user_path(model: type[BaseModel], loc: tuple) -> tuple:
    """The error's path without the tags pydantic inserts for tagged unions."""
    out: list = []
    current: Any = model
    for part in loc:
        if isinstance(current, type) and issubclass(current, BaseModel) and part in current.model_fields:
            out.append(part)
            current = current.model_fields[part].annotation
            continue
        members = [m for m in _union_members(current) if _tag_of(m) == part or m.__name__ == part]
        if members:
            current = members[0]  # a union tag or member name: not part of the user's path
            continue
        if isinstance(part, str) and (part.startswith(("function-", "tagged-union")) or part in _PRIMITIVE_TAGS):
            continue
        out.append(part)
        current = _inner(current)
    return tuple(out)


def _inner(annotation: Any) -> Any:
    """Step into list/tuple/dict/Optional: the element type, for paths through containers."""
    args = [a for a in typing.get_args(annotation) if a is not type(None)]
    if typing.get_origin(annotation) is typing.Annotated:
        return _inner(args[0]) if args else None
    return args[-1] if args else None


def _allowed_fields(model: type[BaseModel], loc: tuple) -> list[str]:
    """Walk `loc` through nested models and tagged unions to the model that owns it."""
    current: Any = model
    for part in loc:
        if isinstance(current, type) and issubclass(current, BaseModel) and part in current.model_fields:
            current = current.model_fields[part].annotation
            continue
        members = [m for m in _union_members(current) if _tag_of(m) == part]
        if members:
            current = members[0]
            continue
        models = [m for m in _union_members(current) if isinstance(m, type) and issubclass(m, BaseModel)]
        if len(models) == 1:  # `X | None`, or `str | Model` with the model's name as pydantic's tag
            current = models[0]
            if part in current.model_fields:
                current = current.model_fields[part].annotation
            continue
        return []
    models = [m for m in [current, *_union_members(current)] if isinstance(m, type) and issubclass(m, BaseModel)]
    return sorted(models[0].model_fields) if models else []


def _union_members(annotation: Any) -> list:
    args = typing.get_args(annotation)
    if typing.get_origin(annotation) is typing.Annotated:
        return _union_members(args[0])
    return [a for a in args if isinstance(a, type)]


def _tag_of(model: Any) -> Any:
    field = getattr(model, "model_fields", {}).get("kind")
    return field.default if field is not None else None
