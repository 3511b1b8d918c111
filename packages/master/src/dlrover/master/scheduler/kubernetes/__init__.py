"""The Kubernetes backend: worker pods from the ElasticJob's template (a parameter-server job's tasks from their
roles' templates), observed by list + watch.

`KubernetesScheduler` (the backend), its pure cores `manifest.worker_pod` (NodeSpec -> pod) and
`observe.observe_pod` (pod -> ObservedNode), and `KubernetesSettings`. The official `kubernetes`
client (the `k8s` extra) is imported when a backend is built, not when this package is.
"""

from dlrover.master.scheduler.kubernetes.backend import (
    KILL_GRACE_S,
    VERBS_ADMITTED,
    VERBS_USED,
    VERBS_USED_BY_TF_TASKS,
    KubernetesScheduler,
    read_worker_template,
)
from dlrover.master.scheduler.kubernetes.manifest import (
    TF_SERVER_COMMAND,
    master_address,
    pod_name,
    shm_size_mb,
    worker_pod,
)
from dlrover.master.scheduler.kubernetes.observe import observe_deleted_pod, observe_pod
from dlrover.master.scheduler.kubernetes.settings import KubernetesSettings, WorkerTemplate

__all__ = [
    "KILL_GRACE_S",
    "TF_SERVER_COMMAND",
    "VERBS_ADMITTED",
    "VERBS_USED",
    "VERBS_USED_BY_TF_TASKS",
    "KubernetesScheduler",
    "KubernetesSettings",
    "WorkerTemplate",
    "master_address",
    "observe_deleted_pod",
    "observe_pod",
    "pod_name",
    "read_worker_template",
    "shm_size_mb",
    "worker_pod",
]
