"""A test cluster: the test API server with graceful pod deletion and a kubelet on its store."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from .kubelet import Kubelet
from .server import ApiServer
from .simnodes import SimNode
from .store import Store

__all__ = ["KubeCluster"]


class KubeCluster:
    """`ApiServer(Store(graceful_pod_deletion=True))` plus a `Kubelet` on its store; a context
    manager (stopping the kubelet first: every process it ran is gone before the server stops).

    Args:
        nodes: the simulated nodes (the kubelet's default: node-0..node-2, 4 CPUs and 8Gi each).
        kubelet_options: further `Kubelet` keyword arguments (root, memory_groups, backoffs...);
            `api_url` is the server's, so pods get a kubeconfig for it.
    """

    def __init__(self, nodes: Sequence[SimNode] | None = None, **kubelet_options: Any) -> None:
        self.server = ApiServer(Store(graceful_pod_deletion=True))
        self._nodes = nodes
        self._options = kubelet_options
        self._kubelet: Kubelet | None = None

    @property
    def kubelet(self) -> Kubelet:
        if self._kubelet is None:
            raise RuntimeError("the test cluster is not running")
        return self._kubelet

    @property
    def url(self) -> str:
        return self.server.url

    def write_kubeconfig(self, path: Path, *, namespace: str = "default") -> Path:
        """A kubeconfig of the server (see `ApiServer.write_kubeconfig`)."""
        return self.server.write_kubeconfig(path, namespace=namespace)

    def start(self) -> KubeCluster:
        self.server.start()
        try:
            kubelet = Kubelet(self.server.store, self._nodes, api_url=self.server.url, **self._options)
            self._kubelet = kubelet.start()
            self.server.pod_logs = kubelet.read_log
        except BaseException:
            self.server.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop the kubelet (every process, cgroup and directory it made), then the server."""
        try:
            if self._kubelet is not None:
                self.server.pod_logs = None
                self._kubelet.stop()
                self._kubelet = None
        finally:
            self.server.stop()

    def __enter__(self) -> KubeCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
