"""An ElasticJob's spec, checked: the schema first, then what no schema can say.

`check_spec` is pure: it returns a `JobSpec` or the list of problems, each naming its field
(`spec.replicaSpecs.worker.minReplicas (4) exceeds maxReplicas (2)`). Whether a storage the spec
names exists is a question for the cluster: `JobSpec.claims` and `JobSpec.secrets` say what to look
up, and the reconcile checks the answer.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import attrs

from dlrover.autoscale import parse_memory_mb
from dlrover.common import ConfigError
from dlrover.master.operator.schema import job_schema, schema_errors

__all__ = [
    "DEFAULT_MASTER_PORT",
    "GPU_RESOURCE",
    "JobSpec",
    "PsRoles",
    "SpecCheck",
    "check_spec",
    "cpu_cores",
    "main_container_index",
]

DEFAULT_MASTER_PORT = 50001
GPU_RESOURCE = "nvidia.com/gpu"
_PLANNED_RESOURCES = ("cpu", "memory", GPU_RESOURCE)
_PS_JOB_ROLES = ("chief", "ps", "evaluator")  # any of them makes a TensorFlow parameter-server job
_PS_RESOURCES = ("cpu", "memory")


@attrs.frozen
class PsRoles:
    """A TensorFlow parameter-server job's roles, as `dlrover-master ps-job`'s flags take them (None: planned).

    Attributes:
        ps: parameter servers at the start (`ps.minReplicas`).
        max_ps: the most servers the job may grow to (`ps.maxReplicas`).
        workers: workers (`worker.maxReplicas`, else `minReplicas`).
        min_workers: the fewest the job goes on with (`worker.minReplicas`).
        evaluator: whether the job has an evaluator.
        resources: per role, its `cpu` and `memory` as written.
        task_start_s: how long a task may take to start running (`timeouts.nodeStartSeconds`).
    """

    ps: int | None
    max_ps: int | None
    workers: int | None
    min_workers: int | None
    evaluator: bool
    resources: Mapping[str, Mapping[str, str]]
    task_start_s: float | None


@attrs.frozen
class JobSpec:
    """What the operator needs from a valid ElasticJob spec (camelCase fields made plain).

    Attributes:
        suspend: the job is to be suspended.
        min_replicas, max_replicas: the worker count range; None: planned by the master.
        resources: per-node resources asked for (`cpu`, `memory`, `nvidia.com/gpu` as strings); empty:
            planned by the master.
        join_timeout_s, last_call_s, planned_wait_s: rendezvous settings; None: the master's default.
        node_pending_s, heartbeat_s, node_start_s: timeouts; None: the master's default.
        master_image: the master container's image; None: the operator's default.
        master_port: the port the master serves on.
        state_volume: the Volume source of the master's journal; None: an emptyDir.
        tls_secret: the Secret holding the master's `tls.crt`/`tls.key`; None: no TLS.
        tls_ca_key: the key of `tls_secret` workers verify the master with (`tls.crt` or `ca.crt`).
        spare_replicas: warm spare worker pods (`--spare-nodes`).
        master_resources: the master container's ResourceRequirements.
        claims: PersistentVolumeClaims the spec names (they must exist), by field.
        secrets: Secrets the spec names (they must exist), by field.
        raw: the spec as written (for comparing edits).
        ps_job: the roles of a TensorFlow parameter-server job (its master runs `dlrover-master ps-job`); None: a
            worker job.
    """

    suspend: bool
    min_replicas: int | None
    max_replicas: int | None
    resources: Mapping[str, str]
    join_timeout_s: float | None
    last_call_s: float | None
    planned_wait_s: float | None
    node_pending_s: float | None
    heartbeat_s: float | None
    node_start_s: float | None
    master_image: str | None
    master_port: int
    state_volume: Mapping[str, Any] | None
    tls_secret: str | None
    tls_ca_key: str
    spare_replicas: int
    master_resources: Mapping[str, Any]
    claims: Mapping[str, str]
    secrets: Mapping[str, str]
    raw: Mapping[str, Any]
    ps_job: PsRoles | None = None

    @property
    def node_range(self) -> tuple[int, int] | None:
        """`(min, max)` for the master's --nnodes; None leaves the count to the master's plan.

        A minimum alone is a fixed count (the master plans both ends or neither)."""
        low, high = self.min_replicas, self.max_replicas
        if low is None and high is None:
            return None
        return (low or 1, high if high is not None else low or 1)


@attrs.frozen
class SpecCheck:
    """The answer of `check_spec`: a spec, or why there is none.

    Attributes:
        spec: the checked spec; None when `errors` is not empty.
        errors: every problem, each naming its field.
    """

    spec: JobSpec | None
    errors: tuple[str, ...] = ()


def main_container_index(template: Mapping[str, Any]) -> int:
    """Which container of a pod template runs dlrover-run: the one named `main`, else the first."""
    containers = (template.get("spec") or {}).get("containers") or []
    for i, container in enumerate(containers):
        if isinstance(container, Mapping) and container.get("name") == "main":
            return i
    return 0


def cpu_cores(quantity: str | int | float) -> float:
    """A Kubernetes CPU quantity (`2`, `0.5`, `500m`) in cores.

    Raises:
        ValueError: not a CPU quantity.
    """
    text = str(quantity).strip()
    value = float(text[:-1]) / 1000 if text.endswith("m") else float(text)
    if not math.isfinite(value) or value < 0:
        raise ValueError(f"{quantity!r} is not a CPU quantity")
    return value


def _number(section: Mapping[str, Any], key: str) -> float | None:
    value = section.get(key)
    return None if value is None else float(value)


def _claim(volume: Mapping[str, Any] | None) -> str | None:
    pvc = (volume or {}).get("persistentVolumeClaim")
    return str(pvc.get("claimName")) if isinstance(pvc, Mapping) and pvc.get("claimName") else None


def _template_errors(role: str, template: Mapping[str, Any], runs: str | None = "dlrover-run ...") -> list[str]:
    """What is wrong with a role's pod template; `runs`: what its main container's command must be (None: it may
    have none)."""
    where = f"spec.replicaSpecs.{role}.template.spec.containers"
    containers = (template.get("spec") or {}).get("containers")
    if not isinstance(containers, list) or not containers:
        return [f"{where}: the pod template has no container (one named `main`, or the first, runs the task)"]
    errors = []
    for i, container in enumerate(containers):
        if not isinstance(container, Mapping) or not container.get("name"):
            errors.append(f"{where}[{i}]: a container needs a name")
    main = containers[main_container_index(template)]
    if runs is not None and isinstance(main, Mapping) and not main.get("command") and not main.get("args"):
        errors.append(f"{where}[{main_container_index(template)}]: the main container needs a command ({runs})")
    return errors


def _resource_errors(
    resources: Mapping[str, Any], role: str = "worker", planned: tuple[str, ...] = _PLANNED_RESOURCES
) -> list[str]:
    errors = []
    where = f"spec.replicaSpecs.{role}.resources"
    for name, value in resources.items():
        try:
            if name not in planned:
                errors.append(f"{where}.{name}: not a resource the master plans ({', '.join(planned)})")
            elif name == "cpu":
                cpu_cores(value)
            elif name == "memory":
                parse_memory_mb(str(value))
            elif not str(value).isdigit():
                raise ValueError(f"a whole number of GPUs, got {value!r}")
        except (ValueError, ConfigError) as exc:
            errors.append(f"{where}.{name}: {exc}")
    return errors


def _range_errors(spec: Mapping[str, Any], worker: Mapping[str, Any]) -> list[str]:
    errors = []
    low, high = worker.get("minReplicas"), worker.get("maxReplicas")
    if low is not None and high is not None and low > high:
        errors.append(f"spec.replicaSpecs.worker.minReplicas ({low}) exceeds maxReplicas ({high})")
    rdzv = spec.get("rendezvous") or {}
    rlow, rhigh = rdzv.get("minNodes"), rdzv.get("maxNodes")
    if rlow is not None and rhigh is not None and rlow > rhigh:
        errors.append(f"spec.rendezvous.minNodes ({rlow}) exceeds maxNodes ({rhigh})")
    # The master has one node range: the rendezvous cannot ask for another.
    for key, mine, theirs in (("minNodes", rlow, low), ("maxNodes", rhigh, high)):
        other = "minReplicas" if key == "minNodes" else "maxReplicas"
        if mine is not None and theirs is not None and mine != theirs:
            errors.append(
                f"spec.rendezvous.{key} ({mine}) differs from spec.replicaSpecs.worker.{other} ({theirs}): "
                "the master has one node range"
            )
    return errors


def check_spec(job: Mapping[str, Any]) -> SpecCheck:
    """Check an ElasticJob against the CRD's schema and the rules a schema cannot express.

    Args:
        job: the ElasticJob object (as JSON).

    Returns:
        The spec, or every problem found (each naming its field).
    """
    errors = schema_errors(job_schema(), {k: v for k, v in job.items() if k != "status"})
    if errors:
        return SpecCheck(None, tuple(errors))
    spec: Mapping[str, Any] = job["spec"]
    replicas: Mapping[str, Any] = spec["replicaSpecs"]
    worker: Mapping[str, Any] = replicas["worker"]
    ps_job = None
    if any(role in replicas for role in _PS_JOB_ROLES):
        ps_job, ps_errors = _ps_roles(spec, replicas)
        errors.extend(ps_errors)
    else:
        errors.extend(_template_errors("worker", worker["template"]))
        errors.extend(_resource_errors(worker.get("resources") or {}))
    errors.extend(_range_errors(spec, worker))
    timeouts = spec.get("timeouts") or {}
    if timeouts.get("heartbeatSeconds") is not None and timeouts["heartbeatSeconds"] < 3:
        errors.append(f"spec.timeouts.heartbeatSeconds ({timeouts['heartbeatSeconds']}) must be at least 3")
    if errors:
        return SpecCheck(None, tuple(errors))
    rdzv = spec.get("rendezvous") or {}
    checkpoint = spec.get("checkpoint") or {}
    master = spec.get("master") or {}
    claims = {
        field: claim
        for field, claim in (
            ("spec.checkpoint.volume", _claim(checkpoint.get("volume"))),
            ("spec.master.stateVolume", _claim(master.get("stateVolume"))),
        )
        if claim
    }
    secrets = {
        field: name
        for field, name in (
            ("spec.checkpoint.objectStore.secretName", (checkpoint.get("objectStore") or {}).get("secretName")),
            ("spec.master.tls.secretName", (master.get("tls") or {}).get("secretName")),
        )
        if name
    }
    # A parameter-server job's counts and resources are its roles' (`ps_job`), not a node range.
    low = worker.get("minReplicas", rdzv.get("minNodes")) if ps_job is None else None
    high = worker.get("maxReplicas", rdzv.get("maxNodes")) if ps_job is None else None
    return SpecCheck(
        JobSpec(
            suspend=bool(spec.get("suspend", False)),
            min_replicas=low,
            max_replicas=high,
            resources={k: str(v) for k, v in (worker.get("resources") or {}).items()} if ps_job is None else {},
            join_timeout_s=_number(rdzv, "joinTimeoutSeconds"),
            last_call_s=_number(rdzv, "lastCallSeconds"),
            planned_wait_s=_number(rdzv, "plannedWaitSeconds"),
            node_pending_s=_number(timeouts, "nodePendingSeconds"),
            heartbeat_s=_number(timeouts, "heartbeatSeconds"),
            node_start_s=_number(timeouts, "nodeStartSeconds"),
            master_image=master.get("image"),
            master_port=int(master.get("port", DEFAULT_MASTER_PORT)),
            state_volume=master.get("stateVolume"),
            tls_secret=(master.get("tls") or {}).get("secretName"),
            tls_ca_key=(master.get("tls") or {}).get("caKey") or "tls.crt",
            spare_replicas=int(worker.get("spareReplicas") or 0),
            master_resources=master.get("resources") or {},
            claims=claims,
            secrets=secrets,
            raw=spec,
            ps_job=ps_job,
        )
    )


def _ps_roles(spec: Mapping[str, Any], replicas: Mapping[str, Any]) -> tuple[PsRoles | None, list[str]]:
    """The roles of a parameter-server job, or what keeps the spec from being one (each naming its field)."""
    errors = [f"spec.replicaSpecs.{role}: a parameter-server job needs chief, ps and worker"
              for role in ("chief", "ps") if role not in replicas]  # fmt: skip
    for role in ("chief", "ps", "worker", "evaluator"):
        replica = replicas.get(role)
        if replica is None:
            continue
        runs = "the chief's training program" if role in ("chief", "evaluator") else None
        errors.extend(_template_errors(role, replica["template"], runs))
        errors.extend(_resource_errors(replica.get("resources") or {}, role, _PS_RESOURCES))
        if replica.get("spareReplicas"):
            errors.append(f"spec.replicaSpecs.{role}.spareReplicas: a parameter-server job keeps no spares")
        if role in ("chief", "evaluator"):
            errors.extend(f"spec.replicaSpecs.{role}.{key} ({replica[key]}): a job has one {role}"
                          for key in ("minReplicas", "maxReplicas") if replica.get(key, 1) != 1)  # fmt: skip
    ps = replicas.get("ps") or {}
    low_ps, high_ps = ps.get("minReplicas"), ps.get("maxReplicas")
    if low_ps is not None and high_ps is not None and low_ps > high_ps:
        errors.append(f"spec.replicaSpecs.ps.minReplicas ({low_ps}) exceeds maxReplicas ({high_ps})")
    if spec.get("rendezvous"):
        errors.append("spec.rendezvous: a parameter-server job has no rendezvous (its chief coordinates the workers)")
    timeouts = spec.get("timeouts") or {}
    errors.extend(f"spec.timeouts.{key}: not for a parameter-server job (nodeStartSeconds is)"
                  for key in ("nodePendingSeconds", "heartbeatSeconds") if key in timeouts)  # fmt: skip
    if not isinstance((spec.get("checkpoint") or {}).get("volume"), Mapping):
        errors.append("spec.checkpoint.volume: a parameter-server job needs one: the chief's checkpoints must outlive "
                      "its pods (it is mounted at /checkpoints in every task and in the master)")  # fmt: skip
    if (spec.get("master") or {}).get("tls"):
        errors.append("spec.master.tls: a parameter-server job's master does not serve TLS yet")
    if errors:
        return None, errors
    worker = replicas["worker"]
    low, high = worker.get("minReplicas"), worker.get("maxReplicas")
    resources = {
        role: {name: str(value) for name, value in replica["resources"].items()}
        for role, replica in replicas.items()
        if replica.get("resources")
    }
    roles = PsRoles(
        ps=low_ps,
        max_ps=high_ps,
        workers=high if high is not None else low,
        min_workers=low,
        evaluator="evaluator" in replicas,
        resources=resources,
        task_start_s=_number(timeouts, "nodeStartSeconds"),
    )
    return roles, []
