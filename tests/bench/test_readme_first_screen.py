"""The README's first screen gets a newcomer to the cascade table, and the
commands the README and the quick start show exist as written (every
subcommand, flag and built-in scenario)."""

from __future__ import annotations

import re
import shlex

import pytest

from bench.cli import build_parser
from bench.scenario import builtin_scenarios
from tests.bench.cli_helpers import ROOT

FIRST_SCREEN = 24  # lines


def test_first_screen_shows_the_in_process_cascade():
    lines = (ROOT / "README.md").read_text().splitlines()[:FIRST_SCREEN]
    commands = [line.split("#")[0].strip() for line in lines]
    assert "make venv" in commands
    assert ".venv/bin/disagg-sim run cascade-inproc" in commands
    assert "cascade-inproc" in builtin_scenarios()


def _commands(path):
    """Every `disagg-sim ...` command line in the document's code blocks (continuations joined)."""
    text = (ROOT / path).read_text()
    blocks = re.findall(r"```bash\n(.*?)```", text, flags=re.S)
    out = []
    for block in blocks:
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split("  #")[0].strip()
            if "disagg-sim " in line and not line.startswith(("make", "cp ")):
                out.append(shlex.split(line.split("disagg-sim", 1)[1].split(">")[0]))
    return out


def _subparsers():
    parser = build_parser()
    action = next(a for a in parser._actions if getattr(a, "choices", None) and "run" in a.choices)
    return action.choices


@pytest.mark.parametrize("doc", ["README.md", "docs/quickstart.md", "docs/usage.md"])
def test_documented_commands_and_flags_exist(doc):
    subs = _subparsers()
    commands = _commands(doc)
    assert commands, doc
    for argv in commands:
        if argv[0].startswith("--"):
            continue
        assert argv[0] in subs, argv
        flags = {o for a in subs[argv[0]]._actions for o in a.option_strings}
        for word in argv[1:]:
            if word.startswith("--"):
                assert word.split("=")[0] in flags, (doc, argv, word)
