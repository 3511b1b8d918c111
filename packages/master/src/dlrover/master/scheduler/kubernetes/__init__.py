"""The Kubernetes backend: worker pods from the ElasticJob's template, observed by list + watch.

`KubernetesScheduler` (the backend), its pure cores `manifest.worker_pod` (NodeSpec -> pod) and
`observe.observe_pod` (pod -> ObservedNode), and `KubernetesSettings`. The official `kubernetes`
client (the `k8s` extra) is imported when a backend is built, not when this package is.
"""

from dlrover.master.scheduler.kubernetes.backend import (
    VERBS_ADMITTED,
    VERBS_USED,
    KubernetesScheduler,
    read_worker_template,
)
from dlrover.master.scheduler.kubernetes.manifest import master_address, shm_size_mb, worker_pod
from dlrover.master.scheduler.kubernetes.observe import observe_deleted_pod, observe_pod
from dlrover.master.scheduler.kubernetes.settings import KubernetesSettings, WorkerTemplate

__all__ = [
    "VERBS_ADMITTED",
    "VERBS_USED",
    "KubernetesScheduler",
    "KubernetesSettings",
    "WorkerTemplate",
    "master_address",
    "observe_deleted_pod",
    "observe_pod",
    "read_worker_template",
    "shm_size_mb",
    "worker_pod",
]
