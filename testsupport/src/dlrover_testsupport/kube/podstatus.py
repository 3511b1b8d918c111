"""The pod status the test kubelet reports, as pure functions of what it knows of the containers.

Exit statuses are reported as a container runtime does: a process ended by signal N exits with
128+N; the reason is `Completed` for 0, `OOMKilled` when the kernel's OOM killer acted in the
container's memory cgroup, `Error` otherwise. The phase follows the restart policy; conditions
keep their lastTransitionTime while their status does not change.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from datetime import datetime, timezone
from typing import Any

from .quantity import QuantityError, parse_quantity

__all__ = [
    "ContainerRecord",
    "container_status",
    "exit_code_of",
    "exit_reason",
    "merge_conditions",
    "pod_phase",
    "qos_class",
    "rfc3339",
]


def rfc3339(epoch_s: float) -> str:
    """An epoch time as Kubernetes writes timestamps."""
    return datetime.fromtimestamp(epoch_s, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def exit_code_of(returncode: int) -> int:
    """A process's exit status as a container runtime reports it: signal N is 128+N."""
    return 128 - returncode if returncode < 0 else returncode


def exit_reason(exit_code: int, oom_killed: bool) -> str:
    """The terminated container's reason."""
    if oom_killed:
        return "OOMKilled"
    return "Completed" if exit_code == 0 else "Error"


@dataclasses.dataclass
class ContainerRecord:
    """What the kubelet knows of one container of a pod (mutated by the kubelet's loop only).

    At most one of `running`, `waiting` and `exit_code` describes the current state; none of them
    (a container not created yet) reads as waiting in `ContainerCreating`.
    """

    name: str
    image: str = ""
    restart_count: int = 0
    container_id: str = ""
    started_at: str | None = None
    running: bool = False
    waiting: tuple[str, str] | None = None  # (reason, message)
    exit_code: int | None = None
    reason: str = ""  # of the termination
    message: str = ""
    finished_at: str | None = None
    last_terminated: dict[str, Any] | None = None

    def terminated(self) -> dict[str, Any]:
        """The `terminated` state of the last exit (exit_code must be set)."""
        state: dict[str, Any] = {
            "exitCode": self.exit_code,
            "reason": self.reason,
            "startedAt": self.started_at,
            "finishedAt": self.finished_at,
            "containerID": self.container_id,
        }
        if self.message:
            state["message"] = self.message
        return state


def container_status(record: ContainerRecord) -> dict[str, Any]:
    """The entry of `status.containerStatuses` for `record`."""
    state: dict[str, Any]
    if record.running:
        state = {"running": {"startedAt": record.started_at}}
    elif record.waiting is not None:
        state = {"waiting": {"reason": record.waiting[0], "message": record.waiting[1]}}
    elif record.exit_code is not None:
        state = {"terminated": record.terminated()}
    else:
        state = {"waiting": {"reason": "ContainerCreating"}}
    status: dict[str, Any] = {
        "name": record.name,
        "image": record.image,
        "imageID": "",
        "ready": record.running,
        "started": record.running,
        "restartCount": record.restart_count,
        "state": state,
        "lastState": {"terminated": record.last_terminated} if record.last_terminated else {},
    }
    if record.container_id:
        status["containerID"] = record.container_id
    return status


def pod_phase(records: Sequence[ContainerRecord], restart_policy: str, started: bool) -> str:
    """The pod's phase: Pending until its containers started, Running while any runs or will be
    restarted, then Succeeded when every container exited 0 and Failed otherwise."""
    if not started:
        return "Pending"
    if any(r.exit_code is None for r in records):
        return "Running"
    if restart_policy == "Always":
        return "Running"
    if restart_policy == "OnFailure" and any(r.exit_code != 0 for r in records):
        return "Running"
    return "Succeeded" if all(r.exit_code == 0 for r in records) else "Failed"


def merge_conditions(
    old: Sequence[Mapping[str, Any]], new: Mapping[str, tuple[str, str, str]], now: str
) -> list[dict[str, Any]]:
    """`old` conditions updated with `new` (type -> (status, reason, message)); a condition whose
    status is unchanged keeps its lastTransitionTime; conditions not in `new` stay as they were."""
    result: list[dict[str, Any]] = []
    seen = set()
    for condition in old:
        kind = str(condition.get("type"))
        seen.add(kind)
        if kind not in new:
            result.append(dict(condition))
            continue
        status, reason, message = new[kind]
        changed = condition.get("status") != status
        entry: dict[str, Any] = {
            "type": kind,
            "status": status,
            "lastProbeTime": None,
            "lastTransitionTime": now if changed else condition.get("lastTransitionTime", now),
        }
        if reason:
            entry["reason"] = reason
        if message:
            entry["message"] = message
        result.append(entry)
    for kind, (status, reason, message) in new.items():
        if kind in seen:
            continue
        entry = {"type": kind, "status": status, "lastProbeTime": None, "lastTransitionTime": now}
        if reason:
            entry["reason"] = reason
        if message:
            entry["message"] = message
        result.append(entry)
    return result


def qos_class(containers: Sequence[Mapping[str, Any]]) -> str:
    """The pod's QoS class: Guaranteed when every container limits cpu and memory and requests
    what it limits (a missing request is the limit), BestEffort when none asks for either,
    Burstable otherwise."""
    any_set = False
    guaranteed = True
    for container in containers:
        resources = container.get("resources") or {}
        limits = resources.get("limits") or {}
        requests = {**limits, **(resources.get("requests") or {})}
        for name in ("cpu", "memory"):
            any_set = any_set or name in limits or name in requests
            if name not in limits or not _same_quantity(requests.get(name), limits[name]):
                guaranteed = False
    if not any_set:
        return "BestEffort"
    return "Guaranteed" if guaranteed and containers else "Burstable"


def _same_quantity(a: object, b: object) -> bool:
    try:
        return parse_quantity(a) == parse_quantity(b)
    except QuantityError:
        return str(a) == str(b)
