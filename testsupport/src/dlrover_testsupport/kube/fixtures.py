"""pytest fixtures of the test API server and its kubelet. A suite's conftest.py imports them by name:

from dlrover_testsupport.kube.fixtures import kube_api, kube_cluster  # noqa: F401 (fixtures)
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from .cluster import KubeCluster
from .server import ApiServer
from .simnodes import SimNode

__all__ = ["kube_api", "kube_cluster"]


@pytest.fixture
def kube_api() -> Iterator[ApiServer]:
    """A running test API server with a fresh store; stopped (threads joined) after the test."""
    with ApiServer() as server:
        yield server


@pytest.fixture
def kube_cluster() -> Iterator[KubeCluster]:
    """A running test cluster: the API server (graceful pod deletion) and a kubelet with three
    nodes, node-0..node-2 (4 CPUs, 8Gi, 110 pods each), restart backoff 0.2 s. Every process,
    cgroup, directory and thread is gone after the test."""
    nodes = [SimNode(f"node-{i}") for i in range(3)]
    with KubeCluster(nodes, restart_backoff_s=0.2, max_restart_backoff_s=2.0) as cluster:
        yield cluster
