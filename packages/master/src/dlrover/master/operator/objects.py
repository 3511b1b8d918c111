"""The objects the operator creates for an ElasticJob, built from its spec (pure).

Per job: the token Secret, the master's ServiceAccount, Role and RoleBinding (least privilege:
`MASTER_ROLE_RULES`), the master Service and the master Pod, every one labelled as DLRover's and
owned by the job (controller=true), so deleting the job deletes them.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from typing import Any

import attrs

from dlrover.master.kube.names import (
    COMPONENT_MASTER,
    CRD_GROUP,
    CRD_KIND,
    MASTER_PORT_NAME,
    TOKEN_SECRET_KEY,
    api_version,
    job_labels,
    master_name,
    token_secret_name,
)
from dlrover.master.operator.spec import GPU_RESOURCE, JobSpec, PsRoles, cpu_cores
from dlrover.master.scheduler.kubernetes import VERBS_ADMITTED, VERBS_USED, VERBS_USED_BY_TF_TASKS
from dlrover.master.scheduler.kubernetes.manifest import CHECKPOINT_MOUNT

__all__ = [
    "APPLIED_SPEC_ANNOTATION",
    "MASTER_ROLE_RULES",
    "PS_MASTER_ROLE_RULES",
    "MASTER_STATE_DIR",
    "MASTER_STATE_MOUNT",
    "MASTER_TLS_DIR",
    "MasterSettings",
    "RoleRule",
    "applied_part",
    "changed_fields",
    "master_args",
    "master_pod",
    "master_role",
    "master_role_binding",
    "master_service",
    "master_service_account",
    "owner_reference",
    "serves_tls",
    "started_node_range",
    "token_secret",
    "with_node_counts",
]

MASTER_STATE_MOUNT = "/var/lib/dlrover"
"""Where `spec.master.stateVolume` is mounted in the master pod."""
MASTER_STATE_DIR = f"{MASTER_STATE_MOUNT}/journal"
"""The master's --state-dir: a directory it creates inside the volume with mode 0700 (it refuses a
state directory open to other users, and a volume's root is not its own: an emptyDir is 0777)."""
MASTER_TLS_DIR = "/etc/dlrover/tls"
"""Where the master's TLS Secret (`tls.crt`, `tls.key`) is mounted."""
APPLIED_SPEC_ANNOTATION = f"{CRD_GROUP}/applied-spec"
"""On the master pod: the part of the spec it was started with that a running job cannot change (JSON)."""


@attrs.frozen
class RoleRule:
    """One rule of the master's Role: `verbs` on `resources` of `api_group` ("" for the core group)."""

    api_group: str
    resources: tuple[str, ...]
    verbs: tuple[str, ...]

    def as_policy_rule(self) -> dict[str, Any]:
        """The rule as a Kubernetes PolicyRule."""
        return {"apiGroups": [self.api_group], "resources": list(self.resources), "verbs": list(self.verbs)}


def _rules(verbs_used: frozenset[tuple[str, str, str]]) -> tuple[RoleRule, ...]:
    """One rule per (group, resource), its verbs sorted: the PolicyRules granting exactly `verbs_used`."""
    by_resource: dict[tuple[str, str], set[str]] = {}
    for group, resource, verb in verbs_used:
        by_resource.setdefault((group, resource), set()).add(verb)
    return tuple(
        RoleRule(group, (resource,), tuple(sorted(verbs))) for (group, resource), verbs in sorted(by_resource.items())
    )


MASTER_ROLE_RULES: tuple[RoleRule, ...] = _rules(VERBS_USED | VERBS_ADMITTED)
"""What the master's Role grants, in its job's namespace only: exactly the verbs the master's Kubernetes
backend calls (`dlrover.master.scheduler.kubernetes.VERBS_USED`: it reads its ElasticJob, lists and watches
the job's worker pods, creates and deletes them), and the one admission checks on its creates (`VERBS_ADMITTED`:
update on the ElasticJob's finalizers, for its pods' blockOwnerDeletion). A test compares it with the requests a
master in a pod made."""

PS_MASTER_ROLE_RULES: tuple[RoleRule, ...] = _rules(VERBS_USED_BY_TF_TASKS | VERBS_ADMITTED)
"""The Role of a parameter-server job's master: `MASTER_ROLE_RULES` and the create of its tasks' headless
Service (`VERBS_USED_BY_TF_TASKS`)."""


@attrs.frozen
class MasterSettings:
    """How the operator starts masters (from its flags).

    Attributes:
        image: the master container's image when the spec names none (the operator's own image).
        command: the master's command (`dlrover-master`).
        extra_args: more flags for every worker job's master, `dlrover-master` (e.g. `--log-level DEBUG`).
        ps_extra_args: more flags for every parameter-server job's master, `dlrover-master ps-job` (its flags are
            not all dlrover-master's: `--stop-grace`, not `--node-stop-grace-s`).
        image_pull_policy: the master container's imagePullPolicy; "" leaves the cluster's default.
        grace_period_s: the master pod's terminationGracePeriodSeconds.
        tls_secret: the Secret (in the job's namespace) masters serve TLS from when their spec names
            none (`--master-tls-secret`); None: only `spec.master.tls` turns TLS on.
        fs_group: the master pod's `securityContext.fsGroup` (the image's user group, so the state
            volume is writable); None sets none.
    """

    image: str = "dlrover:latest"
    command: tuple[str, ...] = ("dlrover-master",)
    extra_args: tuple[str, ...] = ()
    ps_extra_args: tuple[str, ...] = ()
    image_pull_policy: str = ""
    grace_period_s: int = 30
    tls_secret: str | None = None
    fs_group: int | None = None


def owner_reference(job: Mapping[str, Any]) -> dict[str, Any]:
    """The ownerReference of everything the job owns (controller=true: the job manages it)."""
    meta = job["metadata"]
    return {
        "apiVersion": api_version(),
        "kind": CRD_KIND,
        "name": meta["name"],
        "uid": meta["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }


def _metadata(job: Mapping[str, Any], name: str) -> dict[str, Any]:
    meta = job["metadata"]
    return {
        "name": name,
        "namespace": meta["namespace"],
        "labels": job_labels(meta["name"], COMPONENT_MASTER),
        "ownerReferences": [owner_reference(job)],
    }


def token_secret(job: Mapping[str, Any], token: str) -> dict[str, Any]:
    """The Secret `<job>-token` holding the job token under `token`."""
    encoded = base64.b64encode(token.encode()).decode()
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": _metadata(job, token_secret_name(job["metadata"]["name"])),
        "type": "Opaque",
        "data": {TOKEN_SECRET_KEY: encoded},
    }


def master_service_account(job: Mapping[str, Any]) -> dict[str, Any]:
    """The master's own ServiceAccount."""
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": _metadata(job, master_name(job["metadata"]["name"])),
    }


def master_role(job: Mapping[str, Any], spec: JobSpec | None = None) -> dict[str, Any]:
    """The master's Role: `MASTER_ROLE_RULES` (`PS_MASTER_ROLE_RULES` for a parameter-server job) in the job's
    namespace."""
    rules = PS_MASTER_ROLE_RULES if spec is not None and spec.ps_job is not None else MASTER_ROLE_RULES
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": _metadata(job, master_name(job["metadata"]["name"])),
        "rules": [rule.as_policy_rule() for rule in rules],
    }


def master_role_binding(job: Mapping[str, Any]) -> dict[str, Any]:
    """Binds the master's Role to its ServiceAccount."""
    name = master_name(job["metadata"]["name"])
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": _metadata(job, name),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": [{"kind": "ServiceAccount", "name": name, "namespace": job["metadata"]["namespace"]}],
    }


def master_service(job: Mapping[str, Any], spec: JobSpec) -> dict[str, Any]:
    """The Service the workers reach the master through (`<job>-master.<ns>.svc:<port>`)."""
    name = job["metadata"]["name"]
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": _metadata(job, master_name(name)),
        "spec": {
            "selector": job_labels(name, COMPONENT_MASTER),
            "ports": [
                {"name": MASTER_PORT_NAME, "port": spec.master_port, "targetPort": spec.master_port, "protocol": "TCP"}
            ],
        },
    }


def _seconds(value: float) -> str:
    return f"{value:g}"


def _backend_args(job: Mapping[str, Any], spec: JobSpec) -> list[str]:
    """The flags both masters take alike: the job's name, the Kubernetes backend on it, where to serve."""
    meta = job["metadata"]
    return [
        "--job-name", meta["name"],
        "--backend", "kubernetes",
        "--kube-namespace", meta["namespace"],
        "--kube-job", meta["name"],
        "--bind-address", "0.0.0.0",  # noqa: S104 (in a pod: the Service reaches it; every call needs the token)
        "--port", str(spec.master_port),
    ]  # fmt: skip


def _ps_job_args(job: Mapping[str, Any], spec: JobSpec, roles: PsRoles) -> list[str]:
    """`ps-job` and its flags: the Kubernetes backend on this job, its work directory on the state volume, the
    checkpoint volume where every task mounts it, and the counts and resources the spec gives."""
    args = ["ps-job", *_backend_args(job, spec), "--work-dir", MASTER_STATE_DIR, "--checkpoint-dir", CHECKPOINT_MOUNT]
    for flag, value in (("--ps", roles.ps), ("--max-ps", roles.max_ps), ("--workers", roles.workers),
                        ("--min-workers", roles.min_workers)):  # fmt: skip
        if value is not None:
            args += [flag, str(value)]
    if roles.evaluator:
        args.append("--evaluator")
    for role, resources in sorted(roles.resources.items()):
        if "cpu" in resources:
            args += [f"--{role}-cpu", f"{cpu_cores(resources['cpu']):g}"]
        if "memory" in resources:
            args += [f"--{role}-memory", resources["memory"]]
    if roles.task_start_s is not None:
        args += ["--task-start-timeout", _seconds(roles.task_start_s)]
    return args


def _rendezvous_args(spec: JobSpec) -> list[str]:
    """The master's rendezvous flags the spec sets."""
    flags = (
        ("--rdzv-join-timeout-s", spec.join_timeout_s),
        ("--rdzv-last-call-s", spec.last_call_s),
        ("--rdzv-planned-wait-s", spec.planned_wait_s),
    )
    return [arg for flag, value in flags if value is not None for arg in (flag, _seconds(value))]


def master_args(job: Mapping[str, Any], spec: JobSpec) -> list[str]:
    """The master's flags: the Kubernetes backend on this job, and what the spec sets."""
    if spec.ps_job is not None:
        return _ps_job_args(job, spec, spec.ps_job)
    args = [*_backend_args(job, spec), "--state-dir", MASTER_STATE_DIR]
    if spec.node_range is not None:
        args += ["--nnodes", f"{spec.node_range[0]}:{spec.node_range[1]}"]
    if spec.spare_replicas:
        args += ["--spare-nodes", str(spec.spare_replicas)]
    resources = spec.resources
    if "cpu" in resources:
        args += ["--node-cpu", f"{cpu_cores(resources['cpu']):g}"]
    if "memory" in resources:
        args += ["--node-memory", resources["memory"]]
    if GPU_RESOURCE in resources:
        args += ["--node-gpus", resources[GPU_RESOURCE]]
    args += _rendezvous_args(spec)
    if spec.node_pending_s is not None:
        args += ["--node-pending-timeout-s", _seconds(spec.node_pending_s)]
    if spec.node_start_s is not None:
        args += ["--node-start-timeout-s", _seconds(spec.node_start_s)]
    if spec.heartbeat_s is not None:
        # The master refuses an interval that is not shorter than the timeout: a third of it, at most its 5 s default.
        args += ["--heartbeat-timeout-s", _seconds(spec.heartbeat_s)]
        args += ["--heartbeat-interval-s", _seconds(min(5.0, spec.heartbeat_s / 3))]
    if spec.tls_secret is not None:
        args += ["--tls-cert", f"{MASTER_TLS_DIR}/tls.crt", "--tls-key", f"{MASTER_TLS_DIR}/tls.key"]
        args += ["--kube-tls-secret", spec.tls_secret, "--kube-tls-ca-key", spec.tls_ca_key]
    return args


def _node_count_fields(spec: Mapping[str, Any]) -> list[tuple[tuple[str, ...], str]]:
    """Where a worker job's spec holds its node counts, as (path to the mapping, key); none for a parameter-server
    job, whose counts a running job cannot change."""
    replicas = spec.get("replicaSpecs") or {}
    if not isinstance(replicas, Mapping) or any(role in replicas for role in ("chief", "ps", "evaluator")):
        return []
    fields: list[tuple[tuple[str, ...], str]] = [
        (("replicaSpecs", str(role)), key)
        for role, role_spec in replicas.items()
        if isinstance(role_spec, Mapping)
        for key in ("minReplicas", "maxReplicas")
    ]
    if isinstance(spec.get("rendezvous"), Mapping):
        fields += [(("rendezvous",), "minNodes"), (("rendezvous",), "maxNodes")]
    return fields


def _at(spec: Mapping[str, Any], path: tuple[str, ...]) -> Any:
    for part in path:
        spec = spec.get(part) if isinstance(spec, Mapping) else None  # type: ignore[assignment]
    return spec


def applied_part(spec: Mapping[str, Any]) -> dict[str, Any]:
    """The part of a spec a running job cannot change: all of it but `suspend` and a worker job's node counts
    (those are carried out on the running job; a parameter-server job's are not)."""
    part: dict[str, Any] = json.loads(json.dumps(dict(spec)))
    part.pop("suspend", None)
    for path, key in _node_count_fields(part):
        _at(part, path).pop(key, None)
    return part


def with_node_counts(spec: Mapping[str, Any], counts_from: Mapping[str, Any]) -> dict[str, Any]:
    """`spec` with the node counts of `counts_from` (a worker job's: a parameter-server job's stay as they are)."""
    out: dict[str, Any] = json.loads(json.dumps(dict(spec)))
    wanted = _node_count_fields(counts_from)
    have = _node_count_fields(out)
    if not wanted or not have:
        return out
    for path, key in have:
        _at(out, path).pop(key, None)
    for path, key in wanted:
        source, target = _at(counts_from, path), _at(out, path)
        if key in source and isinstance(target, dict):
            target[key] = source[key]
    return out


def started_node_range(pod: Mapping[str, Any]) -> tuple[int, int] | None:
    """The node range a master pod made by `master_pod` was started with (its `--nnodes`); None: none given."""
    containers = (pod.get("spec") or {}).get("containers") or []
    command = [str(arg) for arg in (containers[0].get("command") or [])] if containers else []
    if "--nnodes" not in command[:-1]:
        return None
    low, _, high = command[command.index("--nnodes") + 1].partition(":")
    try:
        return int(low), int(high or low)
    except ValueError:
        return None


def serves_tls(pod: Mapping[str, Any]) -> bool:
    """Whether a master pod made by `master_pod` serves TLS (its TLS Secret is mounted)."""
    containers = (pod.get("spec") or {}).get("containers") or []
    mounts = (containers[0].get("volumeMounts") or []) if containers else []
    return any(mount.get("mountPath") == MASTER_TLS_DIR for mount in mounts)


def master_pod(job: Mapping[str, Any], spec: JobSpec, settings: MasterSettings) -> dict[str, Any]:
    """The master Pod: `dlrover-master --backend kubernetes ...` with the job token from its Secret,
    the journal on `spec.master.stateVolume` (an emptyDir without one) and the TLS Secret mounted."""
    name = job["metadata"]["name"]
    mounts: list[dict[str, Any]] = [{"name": "state", "mountPath": MASTER_STATE_MOUNT}]
    volumes: list[dict[str, Any]] = [{"name": "state", **dict(spec.state_volume or {"emptyDir": {}})}]
    if spec.tls_secret is not None:
        mounts.append({"name": "tls", "mountPath": MASTER_TLS_DIR, "readOnly": True})
        volumes.append({"name": "tls", "secret": {"secretName": spec.tls_secret}})
    checkpoint = (spec.raw.get("checkpoint") or {}).get("volume")
    if spec.ps_job is not None and isinstance(checkpoint, Mapping):
        # The master reads the model's size from the chief's checkpoints.
        mounts.append({"name": "checkpoints", "mountPath": CHECKPOINT_MOUNT, "readOnly": True})
        volumes.append({"name": "checkpoints", **json.loads(json.dumps(dict(checkpoint)))})
    container: dict[str, Any] = {
        "name": "master",
        "image": spec.master_image or settings.image,
        "command": [
            *settings.command,
            *master_args(job, spec),
            *(settings.extra_args if spec.ps_job is None else settings.ps_extra_args),
        ],
        "env": [
            {
                "name": "DLROVER_JOB_TOKEN",
                "valueFrom": {"secretKeyRef": {"name": token_secret_name(name), "key": TOKEN_SECRET_KEY}},
            }
        ],
        "ports": [{"name": MASTER_PORT_NAME, "containerPort": spec.master_port, "protocol": "TCP"}],
        "volumeMounts": mounts,
    }
    if spec.master_resources:
        container["resources"] = json.loads(json.dumps(dict(spec.master_resources)))
    if settings.image_pull_policy:
        container["imagePullPolicy"] = settings.image_pull_policy
    meta = _metadata(job, master_name(name))
    meta["annotations"] = {APPLIED_SPEC_ANNOTATION: json.dumps(applied_part(spec.raw), sort_keys=True)}
    pod_spec: dict[str, Any] = {
        "serviceAccountName": master_name(name),
        # The operator replaces a dead master itself: it decides whether the job ended first.
        "restartPolicy": "Never",
        "terminationGracePeriodSeconds": settings.grace_period_s,
        "containers": [container],
        "volumes": volumes,
    }
    if settings.fs_group is not None:
        pod_spec["securityContext"] = {"fsGroup": settings.fs_group}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": pod_spec}


def changed_fields(applied: Mapping[str, Any], wanted: Mapping[str, Any], prefix: str = "spec") -> list[str]:
    """The fields where two spec parts differ, as paths (`spec.replicaSpecs.worker.template`), at most
    three levels below `spec`."""
    out: list[str] = []
    for key in sorted(set(applied) | set(wanted)):
        a, b = applied.get(key), wanted.get(key)
        if a == b:
            continue
        path = f"{prefix}.{key}"
        if isinstance(a, Mapping) and isinstance(b, Mapping) and path.count(".") < 3:
            out.extend(changed_fields(a, b, path))
        else:
            out.append(path)
    return out
