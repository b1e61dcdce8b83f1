"""The switch for the simulator's exact fast paths (issue 15).

Every fast path computes what the plain step-by-step path computes — the
same token times, step records, counters and block ids — only cheaper. They
stay switchable so that this can be checked at any time: with
`DISAGG_SIM_FAST_PATHS=0` in the environment (or `set_enabled(False)`) every
run takes the plain path, and tests/e2e_inproc/test_fast_paths.py compares both on
random scenarios.
"""

from __future__ import annotations

import os

_enabled = os.environ.get("DISAGG_SIM_FAST_PATHS", "1").strip().lower() not in ("0", "false", "off", "no")


def enabled() -> bool:
    return _enabled


def set_enabled(on: bool) -> bool:
    """Switch the fast paths on or off for runs started from now on; returns the previous setting."""
    global _enabled
    previous, _enabled = _enabled, bool(on)
    return previous
