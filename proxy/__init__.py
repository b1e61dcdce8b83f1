"""The proxy role: routing, the P/D request flow, abort, release, finishing
and re-routing after a fault, written once without I/O (proxy/proxy.py) and
driven by both runtimes through its ports (proxy/ports.py)."""

import engine  # noqa: F401  (first: a compiled build of this package's modules, engine/compiled.py)

from .client import ClientPort, Submission
from .ports import ProxyPorts, ProxySettings
from .proxy import Proxy

__all__ = ["ClientPort", "Proxy", "ProxyPorts", "ProxySettings", "Submission"]
