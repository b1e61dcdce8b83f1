"""Scheduler-side KV connectors (vLLM's `KVConnectorBase_V1`, scheduler role)."""

from .base import KVConnectorBase, KVConnectorMetadata
from .pd_connector import PDConnector, PDConnectorMetadata, RecvSpec

__all__ = ["KVConnectorBase", "KVConnectorMetadata", "PDConnector", "PDConnectorMetadata", "RecvSpec"]
