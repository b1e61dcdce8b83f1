"""The `disagg-sim` parser (a subparser per command module) and `main`,
which turns every way a command can end into its exit code."""

from __future__ import annotations

import argparse
import sys
import tempfile
import traceback
from pathlib import Path

from ..errors import InputError, one_line
from . import compare, run, scenario_info, serve
from .parsing import EXIT_BAD_INPUT, EXIT_CRASH, Parser


def build_parser() -> argparse.ArgumentParser:
    from ..calibrate import add_calibrate_parser
    from ..provenance import tool_version
    from ..validation.cli import add_validate_cost_parser

    p = Parser(prog="disagg-sim", description="Disaggregated LLM serving simulator (vLLM scheduler model).")
    p.add_argument("--version", action="version", version=f"disagg-sim {tool_version()}")
    sub = p.add_subparsers(dest="command", required=True, parser_class=Parser)
    run.add_parser(sub)
    compare.add_parser(sub)
    scenario_info.add_parsers(sub)
    add_calibrate_parser(sub)
    add_validate_cost_parser(sub)
    serve.add_parsers(sub)
    return p


def _crash_report(exc: BaseException, out: Path | None) -> str:
    """Save the traceback of an unexpected error; return where it went."""
    text = "".join(traceback.format_exception(exc))
    try:
        if out is not None:
            path = Path(out) / "error.log"
        else:
            fd, name = tempfile.mkstemp(prefix="disagg-sim-error-", suffix=".log")
            path = Path(name)
            import os

            os.close(fd)
        path.write_text(text)
        return str(path)
    except OSError:
        return "(could not be saved)"


def _quiet_closed_pipe() -> int:
    """The reader went away (`disagg-sim ... | head`): stop writing, exit 0 as
    `head` users expect. stdout is pointed at /dev/null so the interpreter's
    final flush does not raise the same error again."""
    import os

    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
    return 0


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except BrokenPipeError:
        return _quiet_closed_pipe()
    except InputError as exc:
        print(f"error: {one_line(str(exc))}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as exc:
        from ..sweep import RunCrashed

        crashed = isinstance(exc, RunCrashed)
        error = exc.error if isinstance(exc, RunCrashed) else exc
        where = _crash_report(error, getattr(exc, "out_dir", None) or run.RUN_DIR.get("out"))
        what = str(exc) if crashed else f"{type(exc).__name__}: {exc}"
        print(
            f"error: the simulator failed (a bug, not your input): {one_line(what)}; traceback in {where}",
            file=sys.stderr,
        )
        return EXIT_CRASH
