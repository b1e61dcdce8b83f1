"""The oracle launcher (`tools/oracle/launch.py`, stdlib only), loaded as the
conformance harnesses load it: from its directory on `sys.path`."""

from __future__ import annotations

import sys
from pathlib import Path

_TOOLS = Path(__file__).resolve().parents[2] / "tools" / "oracle"
if str(_TOOLS) not in sys.path:
    sys.path.insert(0, str(_TOOLS))

import launch  # noqa: E402

__all__ = ["launch"]
