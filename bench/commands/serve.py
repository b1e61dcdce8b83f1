"""`disagg-sim serve` and `tokenizer` (docs/serve.md); their parsers and
bodies live in `bench/serve/cli.py`, imported only when chosen."""

from __future__ import annotations

from .parsing import number


def add_parsers(sub) -> None:
    from ..serve.cli import add_serve_parsers

    add_serve_parsers(sub, number, cmd_serve, cmd_tokenizer)


def cmd_serve(args) -> int:
    from ..serve.cli import serve_command

    return serve_command(args)


def cmd_tokenizer(args) -> int:
    from ..serve.cli import tokenizer_command

    return tokenizer_command(args)
