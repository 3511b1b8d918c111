"""A worker pod's manifest from the node's spec, the job's template and the backend's settings (pure).

What the backend adds to the user's template, and why:

- name `<job>-worker-<node id>`, the job's labels (`dlrover.master.kube.names`), an ownerReference
  to the ElasticJob (deleting the job deletes its pods), `restartPolicy: Never` (the master, not
  the kubelet, decides what a failed node becomes);
- the agent's environment: the master's address, the job token through a `secretKeyRef` to the
  `<job>-token` Secret (never a literal: a pod spec is readable by anyone who may list pods), the
  node id, rank and relaunch count, and `POD_NAME`, `POD_NAMESPACE`, `POD_IP` from the downward API;
  a parameter-server job's workers also `GRPC_FAIL_FAST=false` unless the template's `env` sets it
  (see `dlrover.master.psjob.node.WORKER_FAIL_FAST`; a value from `envFrom` is overridden: set it
  in `env`);
- the node's resources as requests and limits of the main container (limits equal requests: a
  node's memory is the limit the OOM heuristic grows), GPUs as `gpu_resource`, a GPU type as a
  nodeSelector on `gpu_type_label`;
- `/dev/shm`: a memory-backed emptyDir sized for two snapshots of the node's state, so flash
  checkpoints and NCCL have room (container runtimes give 64 MB, and both then die with SIGBUS).
  Sizing rule: `2 x node_state_mb`, or, when no state size is given, `2 x memory / 4` (half the
  node's memory). tmpfs pages are charged to the pod's memory cgroup, so the container's memory
  request and limit are the node's memory plus the shm size: the training processes keep the
  memory the planner gave the node. A node with no memory asked gets an unsized one (bounded by
  its host's memory);
- required node anti-affinity on `NodeSpec.avoid_hosts`: `kubernetes.io/hostname NotIn [...]`,
  added to every node selector term the template already has (terms are ORed);
- the checkpoint volume of the ElasticJob, mounted at `/checkpoints`.

A TensorFlow parameter-server job's pods (`KubernetesSettings.tf_tasks`) differ: each comes from its role's
template (`chief`, `ps`, `worker`, `evaluator`) and is named `<job>-<role>-<index>-<node id>`; hostname
`<job>-<role>-<index>` and subdomain `<job>-tasks` give it the task's DNS name, the same for every relaunch, which
the `TF_CONFIG` of every task lists; a parameter server's or worker's main container without a command runs
TensorFlow's server (`python -m dlrover.master.psjob.node`); no sized `/dev/shm` is added (TensorFlow's tasks take
no flash checkpoint, and it would be charged to their memory).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping
from typing import Any

from dlrover.autoscale import Resources
from dlrover.common import (
    MASTER_TLS_CA_ENV_VAR,
    MASTER_TLS_ENV_VARS,
    MASTER_TLS_SERVER_NAME_ENV_VAR,
    TOKEN_ENV_VAR,
    TOKEN_FILE_ENV_VAR,
    ConfigError,
)
from dlrover.master.kube import names
from dlrover.master.psjob.node import WORKER_FAIL_FAST
from dlrover.master.scheduler.base import NodeSpec
from dlrover.master.scheduler.kubernetes.settings import DEFAULT_SHM_FRACTION, KubernetesSettings, WorkerTemplate

__all__ = [
    "CHECKPOINT_MOUNT",
    "MAIN_CONTAINER",
    "MASTER_ADDR_ENV",
    "MASTER_TLS_MOUNT",
    "SHM_VOLUME",
    "TF_SERVER_COMMAND",
    "main_container_index",
    "master_address",
    "pod_name",
    "shm_size_mb",
    "worker_pod",
]

MAIN_CONTAINER = "main"
"""The container that runs `dlrover-run` (else the template's first)."""
SHM_VOLUME = "dlrover-shm"
SHM_MOUNT = "/dev/shm"  # noqa: S108 (a mount path in the pod, not a file this process opens)
CHECKPOINT_VOLUME = "dlrover-checkpoints"
CHECKPOINT_MOUNT = "/checkpoints"
MASTER_TLS_VOLUME = "dlrover-master-tls"
MASTER_TLS_MOUNT = "/etc/dlrover/master-tls"
"""Where a worker finds what verifies the master's TLS certificate (`ca.crt`), when the master serves TLS."""
MASTER_ADDR_ENV = "DLROVER_MASTER_ADDR"
LOCAL_ADDR_ENV = "PET_LOCAL_ADDR"
"""`dlrover-run --local-addr` (torchrun's environment default): set to the pod's IP unless the template sets it."""
TF_SERVER_COMMAND = ("python", "-m", "dlrover.master.psjob.node")
"""What a parameter-server job's `ps` or `worker` pod runs when its template's main container gives no command."""
_TF_SERVER_ROLES = ("ps", "worker")
_DOWNWARD_API = {"POD_NAME": "metadata.name", "POD_NAMESPACE": "metadata.namespace", "POD_IP": "status.podIP"}
# Set by the backend; the template's own entries of these names are replaced, NodeSpec's literal token dropped.
_DROPPED_NODE_ENV = frozenset({TOKEN_ENV_VAR, TOKEN_FILE_ENV_VAR, MASTER_ADDR_ENV, *MASTER_TLS_ENV_VARS})


def main_container_index(template: Mapping[str, Any]) -> int:
    """The index of the container named `main`, else 0."""
    containers = template["spec"]["containers"]
    for i, container in enumerate(containers):
        if container.get("name") == MAIN_CONTAINER:
            return i
    return 0


def pod_name(spec: NodeSpec, settings: KubernetesSettings) -> str:
    """The name of the node's pod: `<job>-worker-<node id>`, or for a parameter-server job's task
    `<job>-<role>-<index>-<node id>`."""
    if settings.tf_tasks:
        return names.task_pod_name(settings.job, spec.role.value, spec.rank, spec.node_id)
    return names.worker_pod_name(settings.job, spec.node_id)


def master_address(spec: NodeSpec, settings: KubernetesSettings) -> str:
    """What the node's agent dials: `settings.master_address`, else the master Service with the port the
    master listens on (from the address the master gave the node).

    Raises:
        ConfigError: no address is set and the master gave none with a port.
    """
    if settings.master_address:
        return settings.master_address
    given = spec.env.get(MASTER_ADDR_ENV, "")
    port = given.rsplit(":", 1)[-1] if ":" in given else ""
    if not port.isdecimal():
        raise ConfigError(
            f"the master's port is unknown (its address is {given!r}): set the workers' master address explicitly"
        )
    return f"{names.master_name(settings.job)}.{settings.namespace}.svc:{port}"


def shm_size_mb(resources: Resources | None, settings: KubernetesSettings) -> int:
    """The size of a node's `/dev/shm` in MiB (see the module's sizing rule); 0: unsized."""
    if settings.node_state_mb:
        return 2 * settings.node_state_mb
    memory = resources.memory_mb if resources is not None else 0
    return 2 * math.ceil(memory * DEFAULT_SHM_FRACTION)


def _cpu(cores: float) -> str:
    milli = round(cores * 1000)
    return str(milli // 1000) if milli % 1000 == 0 else f"{milli}m"


def _resources(resources: Resources | None, shm_mb: int, settings: KubernetesSettings) -> dict[str, dict[str, str]]:
    amounts: dict[str, str] = {}
    if resources is not None:
        if resources.cpu:
            amounts["cpu"] = _cpu(resources.cpu)
        if resources.memory_mb:
            amounts["memory"] = f"{resources.memory_mb + shm_mb}Mi"
        if resources.gpu:
            amounts[settings.gpu_resource] = str(resources.gpu)
    if not amounts:
        return {}
    return {"requests": dict(amounts), "limits": dict(amounts)}


def _env(spec: NodeSpec, settings: KubernetesSettings, address: str) -> list[dict[str, Any]]:
    env: list[dict[str, Any]] = [{"name": MASTER_ADDR_ENV, "value": address}]
    secret = {"name": names.token_secret_name(settings.job), "key": names.TOKEN_SECRET_KEY}
    env.append({"name": TOKEN_ENV_VAR, "valueFrom": {"secretKeyRef": secret}})
    for name, path in _DOWNWARD_API.items():
        env.append({"name": name, "valueFrom": {"fieldRef": {"fieldPath": path}}})
    if settings.tls_secret is not None:
        env.append({"name": MASTER_TLS_CA_ENV_VAR, "value": f"{MASTER_TLS_MOUNT}/ca.crt"})
        if not settings.master_address:
            # The Service's name, whatever address the node's resolver turns it into.
            service = f"{names.master_name(settings.job)}.{settings.namespace}.svc"
            env.append({"name": MASTER_TLS_SERVER_NAME_ENV_VAR, "value": service})
    for name, value in sorted(spec.env.items()):
        if name not in _DROPPED_NODE_ENV:
            env.append({"name": name, "value": str(value)})
    return env


def _anti_affinity(pod_spec: dict[str, Any], avoid_hosts: frozenset[str]) -> None:
    if not avoid_hosts:
        return
    expression = {"key": names.HOSTNAME_LABEL, "operator": "NotIn", "values": sorted(avoid_hosts)}
    affinity = pod_spec.setdefault("affinity", {})
    node_affinity = affinity.setdefault("nodeAffinity", {})
    required = node_affinity.setdefault("requiredDuringSchedulingIgnoredDuringExecution", {})
    terms = required.get("nodeSelectorTerms") or [{}]
    # The hosts are the pods' `spec.nodeName`s; the hostname label usually equals the node's name but
    # need not, so the node's name is excluded too (matchFields), and within a term both must hold.
    by_name = {"key": "metadata.name", "operator": "NotIn", "values": sorted(avoid_hosts)}
    # Terms are ORed: each must exclude the avoided hosts.
    for term in terms:
        term.setdefault("matchExpressions", []).append(dict(expression))
        term.setdefault("matchFields", []).append(dict(by_name))
    required["nodeSelectorTerms"] = terms


def worker_pod(spec: NodeSpec, settings: KubernetesSettings, worker: WorkerTemplate) -> dict[str, Any]:
    """The pod manifest (JSON) of one worker node.

    Args:
        spec: the node the master launches.
        settings: the backend's settings (namespace, job, sizes).
        worker: the ElasticJob's worker template and uid.

    Returns:
        A Pod, ready for `create_namespaced_pod`.

    Raises:
        ConfigError: the master's address cannot be told to the node.
    """
    template = copy.deepcopy(dict(worker.template_for(spec.role.value)))
    meta_in = template.get("metadata") or {}
    pod_spec: dict[str, Any] = template["spec"]
    labels = {
        **(meta_in.get("labels") or {}),
        **names.worker_labels(settings.job, spec.node_id, spec.rank, spec.role.value),
    }
    metadata: dict[str, Any] = {
        "name": pod_name(spec, settings),
        "namespace": settings.namespace,
        "labels": labels,
    }
    if meta_in.get("annotations"):
        metadata["annotations"] = dict(meta_in["annotations"])
    if worker.job_uid:
        metadata["ownerReferences"] = [
            {
                "apiVersion": names.api_version(),
                "kind": names.CRD_KIND,
                "name": settings.job,
                "uid": worker.job_uid,
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
    pod_spec["restartPolicy"] = "Never"
    pod_spec.setdefault("terminationGracePeriodSeconds", settings.pod_deletion_grace_s)
    container = pod_spec["containers"][main_container_index(template)]

    if settings.tf_tasks:
        _name_tf_task(pod_spec, container, spec, settings)

    env = _env(spec, settings, master_address(spec, settings))
    given = container.get("env") or []
    if not settings.tf_tasks and all(e.get("name") != LOCAL_ADDR_ENV for e in given):
        # What the agent tells its peers to dial (the rendezvous store): a pod's host name has no DNS
        # record without a headless Service, its IP always routes.
        env.append({"name": LOCAL_ADDR_ENV, "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}})
    if settings.tf_tasks and spec.role.value == "worker" and all(e.get("name") != "GRPC_FAIL_FAST" for e in given):
        # Whatever the template runs (the default server sets it itself): see `WORKER_FAIL_FAST`.
        env.append({"name": "GRPC_FAIL_FAST", "value": WORKER_FAIL_FAST})
    taken = {entry["name"] for entry in env}
    container["env"] = [e for e in given if e.get("name") not in taken] + env

    shm_mb = 0 if settings.tf_tasks else shm_size_mb(spec.resources, settings)
    amounts = _resources(spec.resources, shm_mb, settings)
    if amounts:
        # The node's cpu, memory and GPUs replace the template's; anything else it asks (ephemeral
        # storage, hugepages, another device) stays.
        merged = copy.deepcopy(dict(container.get("resources") or {}))
        for part, values in amounts.items():
            merged[part] = {**dict(merged.get(part) or {}), **values}
        container["resources"] = merged
    _add_volumes(pod_spec, container, shm_mb, settings, worker)

    if spec.resources is not None and spec.resources.gpu and spec.resources.gpu_type:
        pod_spec.setdefault("nodeSelector", {})[settings.gpu_type_label] = spec.resources.gpu_type
    _anti_affinity(pod_spec, spec.avoid_hosts)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": pod_spec}


def _name_tf_task(pod_spec: dict[str, Any], container: dict[str, Any], spec: NodeSpec,
                  settings: KubernetesSettings) -> None:  # fmt: skip
    """A parameter-server job's task: its DNS name, and TensorFlow's server where its template runs nothing."""
    try:
        pod_spec["hostname"] = names.task_hostname(settings.job, spec.role.value, spec.rank)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    pod_spec["subdomain"] = names.task_service_name(settings.job)
    if spec.role.value in _TF_SERVER_ROLES and not container.get("command") and not container.get("args"):
        container["command"] = list(TF_SERVER_COMMAND)


def _add_volumes(pod_spec: dict[str, Any], container: dict[str, Any], shm_mb: int, settings: KubernetesSettings,
                 worker: WorkerTemplate) -> None:  # fmt: skip
    """`/dev/shm` (not for TensorFlow's tasks), the checkpoint volume (when the job names one) and the
    master's CA (with TLS), each replacing the template's volume and mount of that name and path; the
    template's own mounts elsewhere, and at a path nothing of ours takes (its own volume at
    `/checkpoints` in a job that names none), are kept."""
    added = [
        *(() if settings.tf_tasks else ((SHM_VOLUME, SHM_MOUNT),)),
        *(((CHECKPOINT_VOLUME, CHECKPOINT_MOUNT),) if worker.checkpoint_volume is not None else ()),
        *(((MASTER_TLS_VOLUME, MASTER_TLS_MOUNT),) if settings.tls_secret is not None else ()),
    ]
    ours = {name for name, _path in added}
    volumes = [v for v in pod_spec.get("volumes") or [] if v.get("name") not in ours]
    # Ours replaces any /dev/shm the template mounts: an unsized or 64 MB one is what breaks checkpoints.
    paths = {path for _name, path in added}
    mounts = [m for m in container.get("volumeMounts") or [] if m.get("mountPath") not in paths]
    if not settings.tf_tasks:
        shm: dict[str, Any] = {"medium": "Memory"}
        if shm_mb:
            shm["sizeLimit"] = f"{shm_mb}Mi"
        volumes.append({"name": SHM_VOLUME, "emptyDir": shm})
        mounts.append({"name": SHM_VOLUME, "mountPath": SHM_MOUNT})
    if worker.checkpoint_volume is not None:
        volumes.append({"name": CHECKPOINT_VOLUME, **copy.deepcopy(dict(worker.checkpoint_volume))})
        mounts.append({"name": CHECKPOINT_VOLUME, "mountPath": CHECKPOINT_MOUNT})
    if settings.tls_secret is not None:
        items = [{"key": settings.tls_ca_key, "path": "ca.crt"}]
        volumes.append({"name": MASTER_TLS_VOLUME, "secret": {"secretName": settings.tls_secret, "items": items}})
        mounts.append({"name": MASTER_TLS_VOLUME, "mountPath": MASTER_TLS_MOUNT, "readOnly": True})
    pod_spec["volumes"] = volumes
    container["volumeMounts"] = mounts
