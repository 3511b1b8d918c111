"""pytest fixtures of the test API server. A suite's conftest.py imports them by name:

from dlrover_testsupport.kube.fixtures import kube_api  # noqa: F401 (a fixture)
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from .server import ApiServer

__all__ = ["kube_api"]


@pytest.fixture
def kube_api() -> Iterator[ApiServer]:
    """A running test API server with a fresh store; stopped (threads joined) after the test."""
    with ApiServer() as server:
        yield server
