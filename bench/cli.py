"""`disagg-sim`: run scenarios, compare results (the entry point; each
command is a module of `bench/commands/`).

disagg-sim run [SCENARIO | RESULT.json (that run alone)] [--runtime inproc|ray] [--set k=v ...] [--only VARIANT ...]
               [--address ADDR] [--net-delay MS] [--jitter MS] [--bandwidth MBPS] [--loss P]
               [--repeats N] [--jobs N] [--cluster] [--out DIR] [--overwrite] [--pace X] [--metrics-port PORT]
               [--log-stats [S]]
disagg-sim compare [LABEL=]RESULTS ... [--threshold EXPR ...] [--baseline VARIANT] [--metric M ...] [--json PATH]
disagg-sim validate SCENARIO
disagg-sim schema [--markdown | --json | --metrics SCENARIO]
disagg-sim scenarios
disagg-sim serve [SCENARIO] [--runtime inproc|ray] [--address ADDR] [--host 127.0.0.1] [--port 8000]
                 [--model-name NAME] [--time-scale X] [--variant V] [--max-pending N]
disagg-sim tokenizer DIR
disagg-sim validate-cost [--only ID ...] [--fit | --render-only] [--out MD] [--results JSON]
disagg-sim --version

Exit codes: 0 all thresholds pass; 1 a threshold failed; 2 bad input (one
line on stderr says what, where and what is allowed); 3 a run broke an
invariant; 4 the simulator itself failed (a bug: the traceback is saved).
"""

from __future__ import annotations

import sys

from .commands.main import build_parser, main

__all__ = ["build_parser", "main"]

if __name__ == "__main__":
    sys.exit(main())
