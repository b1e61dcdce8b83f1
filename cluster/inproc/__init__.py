"""The in-process runtime: every node on one virtual clock (see `cluster.py`)."""

from .cluster import InProcCluster, run_inproc

__all__ = ["InProcCluster", "run_inproc"]
