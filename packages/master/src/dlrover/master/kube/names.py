"""The names DLRover gives its Kubernetes objects: the ElasticJob CRD, labels, object names.

One place for what the operator, the master's Kubernetes backend and the deploy manifests must
agree on (see /work/kube-contract.md of issue 29 and the master README).
"""

from __future__ import annotations

__all__ = [
    "APPLIED_SPEC_STATUS",
    "COMPONENT_LABEL",
    "COMPONENT_MASTER",
    "COMPONENT_WORKER",
    "CRD_GROUP",
    "CRD_KIND",
    "CRD_NAME",
    "CRD_PLURAL",
    "CRD_SHORT_NAME",
    "CRD_SINGULAR",
    "CRD_VERSION",
    "HOSTNAME_LABEL",
    "JOB_LABEL",
    "MANAGED_BY",
    "MANAGED_BY_LABEL",
    "MASTER_PORT_NAME",
    "NODE_ID_LABEL",
    "RANK_LABEL",
    "ROLE_LABEL",
    "SPARE_RANK",
    "TOKEN_SECRET_KEY",
    "api_version",
    "job_labels",
    "master_name",
    "task_hostname",
    "task_pod_name",
    "task_service_name",
    "token_secret_name",
    "worker_labels",
    "worker_pod_name",
    "worker_selector",
]

CRD_GROUP = "elastic.dlrover.io"
CRD_VERSION = "v1alpha1"
CRD_KIND = "ElasticJob"
CRD_PLURAL = "elasticjobs"
CRD_SINGULAR = "elasticjob"
CRD_SHORT_NAME = "ej"
CRD_NAME = f"{CRD_PLURAL}.{CRD_GROUP}"

MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "dlrover"
JOB_LABEL = f"{CRD_GROUP}/job"
COMPONENT_LABEL = f"{CRD_GROUP}/component"
ROLE_LABEL = f"{CRD_GROUP}/role"
NODE_ID_LABEL = f"{CRD_GROUP}/node-id"
RANK_LABEL = f"{CRD_GROUP}/rank"
COMPONENT_MASTER = "master"
COMPONENT_WORKER = "worker"

HOSTNAME_LABEL = "kubernetes.io/hostname"
"""The well-known node label the scheduler's node (anti-)affinity matches a host by."""

TOKEN_SECRET_KEY = "token"  # noqa: S105 (a key name, not a secret)
"""The key of the job token in the Secret `token_secret_name(job)`."""
MASTER_PORT_NAME = "grpc"
"""The name of the master Service's port."""
APPLIED_SPEC_STATUS = "appliedSpec"
"""The ElasticJob's status field holding the spec in force: the one the operator started the running master
with, with the node counts carried out since. While an edit is refused the job runs on it, and the master's
backend reads its pod templates from it (from `spec` where the field is absent: no operator runs the job)."""


def api_version() -> str:
    """`elastic.dlrover.io/v1alpha1`: the apiVersion of an ElasticJob (and of its ownerReferences)."""
    return f"{CRD_GROUP}/{CRD_VERSION}"


def token_secret_name(job: str) -> str:
    """The Secret holding the job's token (key `token`)."""
    return f"{job}-token"


def master_name(job: str) -> str:
    """The name of the job's master Pod, Service, ServiceAccount, Role and RoleBinding."""
    return f"{job}-master"


def worker_pod_name(job: str, node_id: int) -> str:
    """The pod of one worker node."""
    return f"{job}-worker-{node_id}"


def task_service_name(job: str) -> str:
    """The headless Service under which every task of a TensorFlow parameter-server job has its DNS name."""
    return f"{job}-tasks"


def task_hostname(job: str, role: str, index: int) -> str:
    """The hostname of task `role:index` of a parameter-server job (`<job>-ps-0`): the first label of its DNS name,
    `<hostname>.<job>-tasks.<namespace>.svc`, which every pod of that task has, whatever its relaunch.

    Raises:
        ValueError: the name is longer than a DNS label may be (63).
    """
    name = f"{job}-{role}-{index}"
    if len(name) > 63:
        raise ValueError(f"task {role}:{index} of job {job!r} needs a hostname of at most 63 characters, got {name!r}")
    return name


def task_pod_name(job: str, role: str, index: int, node_id: int) -> str:
    """The pod of one node of task `role:index` (`<job>-ps-0-3`: parameter server 0, node 3); each relaunch is
    another node, so another pod, under the same hostname."""
    return f"{job}-{role}-{index}-{node_id}"


def job_labels(job: str, component: str) -> dict[str, str]:
    """The labels on every object DLRover creates for `job` (`component`: master or worker)."""
    return {MANAGED_BY_LABEL: MANAGED_BY, JOB_LABEL: job, COMPONENT_LABEL: component}


SPARE_RANK = "spare"
"""The rank label of a warm spare (which holds no rank): label values cannot start with '-', so not "-1"."""


def worker_labels(job: str, node_id: int, rank: int, role: str = "worker") -> dict[str, str]:
    """The labels of a worker pod: the job's, plus its role, node id and the rank it was launched for
    (`SPARE_RANK` for a warm spare; labels are not rewritten when a spare later takes a rank)."""
    labels = job_labels(job, COMPONENT_WORKER)
    labels.update({ROLE_LABEL: role, NODE_ID_LABEL: str(node_id), RANK_LABEL: str(rank) if rank >= 0 else SPARE_RANK})
    return labels


def worker_selector(job: str) -> str:
    """The label selector of `job`'s worker pods (what the master lists and watches)."""
    return f"{JOB_LABEL}={job},{COMPONENT_LABEL}={COMPONENT_WORKER}"
