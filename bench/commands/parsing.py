"""What every subcommand's parser shares: argparse that refuses bad flags in
one line (exit 2) with "did you mean", range-checked number types, and the
console that tables are printed on."""

from __future__ import annotations

import argparse
import math
import os
import sys
from typing import NoReturn

from rich.console import Console

from ..errors import did_you_mean

EXIT_BAD_INPUT = 2
EXIT_CRASH = 4
BY_NODE_HELP = (
    "after each variant, a column per node (variant@node: its counters and step figures; thresholds can name "
    "metric[variant@node] too)"
)


class Parser(argparse.ArgumentParser):
    """argparse, but a bad flag is one line and exit code 2 (no usage block),
    with "did you mean" for an unknown flag; abbreviations are off, so
    `--repeat` is refused rather than silently taken as `--repeats`."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)
        self._argv: list[str] = []

    def parse_known_args(self, args=None, namespace=None):
        self._argv = list(sys.argv[1:] if args is None else args)
        return super().parse_known_args(args, namespace)

    def error(self, message: str) -> NoReturn:
        message += _flag_suggestion(self, message)
        print(f"error: {self.prog}: {message} (see {self.prog} --help)", file=sys.stderr)
        raise SystemExit(EXIT_BAD_INPUT)


def _flag_suggestion(parser: Parser, message: str) -> str:
    """'; did you mean --net-delay?' for the first unknown flag, from the
    flags of the subcommand it was given to."""
    if not message.startswith("unrecognized arguments:"):
        return ""
    unknown = [w.split("=", 1)[0] for w in message.split(":", 1)[1].split() if w.startswith("--")]
    if not unknown:
        return ""
    flags = {o for a in parser._actions for o in a.option_strings}
    for action in parser._subparsers._group_actions if parser._subparsers else []:
        choices = getattr(action, "choices", None) or {}
        command = next((w for w in parser._argv if w in choices), None)
        if command is not None:
            flags |= {o for a in choices[command]._actions for o in a.option_strings}
    return did_you_mean(unknown[0], sorted(f for f in flags if f.startswith("--")))


class PipeConsole(Console):
    """rich's Console exits 1 when its reader goes away; here that is the
    reader's choice (`| head`), so it ends the command like any other closed
    pipe: exit 0 (`main`)."""

    def on_broken_pipe(self) -> None:
        self.quiet = True
        raise BrokenPipeError


def console() -> Console:
    """The terminal's width; when stdout is not a terminal, $COLUMNS if set,
    else 160 (a log or CI page is wider than rich's default 80)."""
    wide = sys.stdout.isatty() or os.environ.get("COLUMNS", "").isdigit()
    return PipeConsole(width=None if wide else 160)


def number(kind: str, lo: float | None = None, hi: float | None = None, lo_open: bool = False):
    """An argparse type: a finite int/float within [lo, hi] (lo excluded with lo_open)."""

    def parse(text: str):
        try:
            value = int(text) if kind == "int" else float(text)
        except ValueError:
            what = "an integer" if kind == "int" else "a number"
            raise argparse.ArgumentTypeError(f"{text!r} is not {what}") from None
        ok = math.isfinite(value) and (lo is None or (value > lo if lo_open else value >= lo))
        ok = ok and (hi is None or value <= hi)
        if not ok:
            rng = f"{'>' if lo_open else '>='} {lo:g}" if lo is not None else ""
            rng += (" and " if rng and hi is not None else "") + (f"<= {hi:g}" if hi is not None else "")
            raise argparse.ArgumentTypeError(f"{text} is out of range; allowed: a finite number {rng}")
        return value

    parse.__name__ = kind  # argparse names the type in its messages
    return parse
