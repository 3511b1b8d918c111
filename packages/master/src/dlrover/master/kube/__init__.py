"""Kubernetes client plumbing shared by the master's Kubernetes backend and the operator.

`names` (the ElasticJob CRD, labels and object names), `config` (in-cluster config or a
kubeconfig), `times` (the API server's timestamps) and `watch` (list + watch from a
resourceVersion: resume, relist after 410, bounded backoff). The official `kubernetes` client
(the `k8s` extra) is imported only when a client is made or a request is sent, so importing this
package costs nothing without it.
"""

from dlrover.master.kube import names
from dlrover.master.kube.config import IN_CLUSTER_ENV_VAR, KUBECONFIG_ENV_VAR, import_kubernetes, load_api_client
from dlrover.master.kube.watch import (
    Backoff,
    EventType,
    ListWatch,
    ListWatchStats,
    Watcher,
    WatchEvent,
    WatchSettings,
    object_key,
)

__all__ = [
    "IN_CLUSTER_ENV_VAR",
    "KUBECONFIG_ENV_VAR",
    "Backoff",
    "EventType",
    "ListWatch",
    "ListWatchStats",
    "WatchEvent",
    "WatchSettings",
    "Watcher",
    "import_kubernetes",
    "load_api_client",
    "names",
    "object_key",
]
