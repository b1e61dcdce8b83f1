"""Fixtures for the gRPC loopback tests (helpers live in helpers.py)."""

import pytest

from connector.transport import InMemoryBlockSource


@pytest.fixture
def source() -> InMemoryBlockSource:
    return InMemoryBlockSource()
