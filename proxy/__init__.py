"""The proxy role: routing, the P/D request flow, abort, release, finishing
and re-routing after a fault, written once without I/O (proxy/proxy.py) and
driven by both runtimes through its ports (proxy/ports.py)."""

from .client import ClientPort, Submission
from .ports import ProxyPorts, ProxySettings
from .proxy import Proxy

__all__ = ["ClientPort", "Proxy", "ProxyPorts", "ProxySettings", "Submission"]
