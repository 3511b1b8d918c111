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
from dlrover.master.operator.schema import ROLES, job_schema, schema_errors

__all__ = [
    "DEFAULT_MASTER_PORT",
    "GPU_RESOURCE",
    "JobSpec",
    "SpecCheck",
    "check_spec",
    "cpu_cores",
    "main_container_index",
]

DEFAULT_MASTER_PORT = 50001
GPU_RESOURCE = "nvidia.com/gpu"
_PLANNED_RESOURCES = ("cpu", "memory", GPU_RESOURCE)
_RUN_ROLES = ("worker",)


@attrs.frozen
class JobSpec:
    """What the operator needs from a valid ElasticJob spec (camelCase fields made plain).

    Attributes:
        suspend: the job is to be suspended.
        min_replicas, max_replicas: the worker count range; None: planned by the master.
        resources: per-node resources asked for (`cpu`, `memory`, `nvidia.com/gpu` as strings); empty:
            planned by the master.
        join_timeout_s, last_call_s: rendezvous settings; None: the master's default.
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
    """

    suspend: bool
    min_replicas: int | None
    max_replicas: int | None
    resources: Mapping[str, str]
    join_timeout_s: float | None
    last_call_s: float | None
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


def _template_errors(role: str, template: Mapping[str, Any]) -> list[str]:
    where = f"spec.replicaSpecs.{role}.template.spec.containers"
    containers = (template.get("spec") or {}).get("containers")
    if not isinstance(containers, list) or not containers:
        return [f"{where}: the pod template has no container (one named `main`, or the first, runs dlrover-run)"]
    errors = []
    for i, container in enumerate(containers):
        if not isinstance(container, Mapping) or not container.get("name"):
            errors.append(f"{where}[{i}]: a container needs a name")
    main = containers[main_container_index(template)]
    if isinstance(main, Mapping) and not main.get("command") and not main.get("args"):
        errors.append(
            f"{where}[{main_container_index(template)}]: the main container needs a command (dlrover-run ...)"
        )
    return errors


def _resource_errors(resources: Mapping[str, Any]) -> list[str]:
    errors = []
    where = "spec.replicaSpecs.worker.resources"
    for name, value in resources.items():
        try:
            if name == "cpu":
                cpu_cores(value)
            elif name == "memory":
                parse_memory_mb(str(value))
            elif name == GPU_RESOURCE:
                if not str(value).isdigit():
                    raise ValueError(f"a whole number of GPUs, got {value!r}")
            else:
                errors.append(f"{where}.{name}: not a resource the master plans ({', '.join(_PLANNED_RESOURCES)})")
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
    errors.extend(
        f"spec.replicaSpecs.{role}: only the worker role is run today; remove it"
        for role in ROLES
        if role in replicas and role not in _RUN_ROLES
    )
    errors.extend(_template_errors("worker", worker["template"]))
    errors.extend(_range_errors(spec, worker))
    errors.extend(_resource_errors(worker.get("resources") or {}))
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
    low = worker.get("minReplicas", rdzv.get("minNodes"))
    high = worker.get("maxReplicas", rdzv.get("maxNodes"))
    return SpecCheck(
        JobSpec(
            suspend=bool(spec.get("suspend", False)),
            min_replicas=low,
            max_replicas=high,
            resources={k: str(v) for k, v in (worker.get("resources") or {}).items()},
            join_timeout_s=_number(rdzv, "joinTimeoutSeconds"),
            last_call_s=_number(rdzv, "lastCallSeconds"),
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
        )
    )
