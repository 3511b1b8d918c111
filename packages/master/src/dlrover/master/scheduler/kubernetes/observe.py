"""A worker pod as the master sees it: its phase, exit code and the platform's reason (pure).

The rules, in order (the first that applies decides):

1. the master asked to stop the node: STOPPED, whatever the pod does;
2. the pod is gone (deleted by someone else: the scheduler preempting it, the taint manager after
   its node was lost, a person): FAILED, a disruption (`Preempted`, `NodeLost`, `Evicted` from its
   last `DisruptionTarget` condition or status reason; `Deleted` otherwise);
3. phase Pending: PENDING; `Unschedulable` with the scheduler's message when `PodScheduled` is
   False for that reason, else the main container's waiting reason when it says why it cannot start
   (`ErrImagePull`, `ImagePullBackOff`, `CreateContainerConfigError` for a missing Secret, ...);
4. phase Running (or Unknown: the node stopped reporting, the pod may still run): RUNNING;
5. phase Succeeded: SUCCEEDED, exit 0;
6. phase Failed: FAILED with the main container's exit code, and the reason
   - `Evicted` (status reason, or a `DisruptionTarget` from the eviction API or the kubelet),
     `Preempted` (`DisruptionTarget` reason `PreemptionByScheduler`) and `NodeLost` (status
     reason, or `DisruptionTarget` reason `DeletionByTaintManager`): disruptions, not the job's
     fault;
   - `Deleted`: a pod someone other than the master is deleting (``metadata.deletionTimestamp``)
     whose main container ended after that deletion was asked for: a disruption;
   - `DeadlineExceeded` (the pod's activeDeadlineSeconds): the job's own limit, charged;
   - `OOMKilled` (the main container's terminated reason): charged, decided as host OOM by the master;
   - otherwise the container's terminated reason (`Error`, ...).

Every observation carries evidence lines: the pod's phase, reason and message, its conditions that
say why, and each container's state.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dlrover.master.kube.times import epoch_seconds
from dlrover.master.scheduler.base import (
    REASON_DEADLINE_EXCEEDED,
    REASON_DELETED,
    REASON_EVICTED,
    REASON_NODE_LOST,
    REASON_PREEMPTED,
    REASON_UNSCHEDULABLE,
    ObservedNode,
    ObservedState,
)

__all__ = ["observe_deleted_pod", "observe_pod"]

# DisruptionTarget condition reasons (Kubernetes >= 1.26) and what they mean here.
_DISRUPTION_REASONS = {
    "PreemptionByScheduler": REASON_PREEMPTED,
    "PreemptionByKubeScheduler": REASON_PREEMPTED,
    "DeletionByTaintManager": REASON_NODE_LOST,
    "EvictionByEvictionAPI": REASON_EVICTED,
    "TerminationByKubelet": REASON_EVICTED,
    "DeletionByPodGC": REASON_NODE_LOST,
}
_STARTING = frozenset({"ContainerCreating", "PodInitializing"})
"""Waiting reasons of a container on its way to start: no reason to report."""
# A pod's status.reason (set by the kubelet or the node lifecycle controller) and what it means here.
_STATUS_DISRUPTIONS = {
    "Evicted": REASON_EVICTED,
    "NodeLost": REASON_NODE_LOST,
    "Preempting": REASON_PREEMPTED,
    "Shutdown": REASON_EVICTED,
}


def _conditions(pod: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return list((pod.get("status") or {}).get("conditions") or [])


def _condition(pod: Mapping[str, Any], kind: str) -> Mapping[str, Any] | None:
    for condition in _conditions(pod):
        if condition.get("type") == kind:
            return condition
    return None


def _main_status(pod: Mapping[str, Any]) -> Mapping[str, Any] | None:
    statuses = list((pod.get("status") or {}).get("containerStatuses") or [])
    containers = [c.get("name") for c in (pod.get("spec") or {}).get("containers") or []]
    main = "main" if "main" in containers else (containers[0] if containers else None)
    for status in statuses:
        if status.get("name") == main:
            return dict(status)
    return dict(statuses[0]) if statuses else None


def _terminated(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    status = _main_status(pod) or {}
    state = status.get("state") or {}
    return state.get("terminated") or (status.get("lastState") or {}).get("terminated") or {}


def _disruption_reason(pod: Mapping[str, Any]) -> str:
    """The platform's reason for taking the pod away, or ""."""
    target = _condition(pod, "DisruptionTarget")
    if target is not None and target.get("status") == "True":
        return _DISRUPTION_REASONS.get(str(target.get("reason")), REASON_EVICTED)
    return _STATUS_DISRUPTIONS.get(str((pod.get("status") or {}).get("reason") or ""), "")


def _ended_by_a_deletion(pod: Mapping[str, Any], terminated: Mapping[str, Any]) -> bool:
    """Whether a failed pod someone is deleting (``metadata.deletionTimestamp``; not the master, rule 1)
    failed because of that deletion: its main container ended after the deletion was asked for (the
    deletion's time less its grace), or it says no time. A kubelet that stops a pod being deleted
    reports phase Failed before the object goes, with no condition that says why."""
    meta = pod.get("metadata") or {}
    deleting = epoch_seconds(meta.get("deletionTimestamp"))
    if deleting is None:
        return False
    grace = meta.get("deletionGracePeriodSeconds")
    asked = deleting - (float(grace) if isinstance(grace, int | float) and not isinstance(grace, bool) else 0.0)
    finished = epoch_seconds(terminated.get("finishedAt"))
    return finished is None or finished >= asked


def _evidence(pod: Mapping[str, Any], headline: str) -> str:
    meta = pod.get("metadata") or {}
    status = pod.get("status") or {}
    lines = [headline]
    where = (pod.get("spec") or {}).get("nodeName")
    lines.append(
        f"pod {meta.get('namespace', '')}/{meta.get('name', '')} phase {status.get('phase', '?')}"
        + (f" on node {where}" if where else " (not scheduled)")
        + (f", reason {status['reason']}" if status.get("reason") else "")
        + (f": {status['message']}" if status.get("message") else "")
    )
    for condition in _conditions(pod):
        if condition.get("reason") or condition.get("message"):
            lines.append(
                f"condition {condition.get('type')}={condition.get('status')} reason {condition.get('reason', '')}"
                + (f": {condition['message']}" if condition.get("message") else "")
            )
    for container in status.get("containerStatuses") or []:
        for state_name, state in (container.get("state") or {}).items():
            if not isinstance(state, Mapping):
                continue
            facts = ", ".join(f"{k} {state[k]}" for k in ("reason", "exitCode", "signal", "message") if k in state)
            lines.append(f"container {container.get('name')} {state_name}" + (f": {facts}" if facts else ""))
    return "\n".join(lines)


def _observe_pending(node_id: int, pod: Mapping[str, Any], host: str) -> ObservedNode:
    """Rule 3: why a pending pod waits, when the scheduler or the kubelet says."""
    scheduled = _condition(pod, "PodScheduled")
    if scheduled is not None and scheduled.get("status") == "False" and scheduled.get("reason") == REASON_UNSCHEDULABLE:
        message = str(scheduled.get("message") or "")
        evidence = _evidence(pod, f"{REASON_UNSCHEDULABLE}: {message}")
        return ObservedNode(node_id, ObservedState.PENDING, None, host, REASON_UNSCHEDULABLE, evidence)
    waiting = ((_main_status(pod) or {}).get("state") or {}).get("waiting") or {}
    why = str(waiting.get("reason") or "")
    if why and why not in _STARTING:
        evidence = _evidence(pod, f"{why}: {waiting.get('message') or ''}".rstrip(": "))
        return ObservedNode(node_id, ObservedState.PENDING, None, host, why, evidence)
    return ObservedNode(node_id, ObservedState.PENDING, None, host)


def observe_pod(node_id: int, pod: Mapping[str, Any], *, stop_requested: bool = False) -> ObservedNode:
    """The node a live (not deleted) pod shows (rules 1 and 3-6 of the module)."""
    status = pod.get("status") or {}
    phase = str(status.get("phase") or "Pending")
    host = str((pod.get("spec") or {}).get("nodeName") or "")
    terminated = _terminated(pod)
    code = terminated.get("exitCode")
    exit_code = int(code) if isinstance(code, int) else None
    if stop_requested:
        return ObservedNode(node_id, ObservedState.STOPPED, exit_code, host)
    if phase == "Pending":
        return _observe_pending(node_id, pod, host)
    if phase in ("Running", "Unknown"):
        return ObservedNode(node_id, ObservedState.RUNNING, None, host)
    if phase == "Succeeded":
        return ObservedNode(node_id, ObservedState.SUCCEEDED, 0 if exit_code is None else exit_code, host)
    disruption = _disruption_reason(pod) or (REASON_DELETED if _ended_by_a_deletion(pod, terminated) else "")
    if disruption:
        reason, is_disruption = disruption, True
    elif status.get("reason") == REASON_DEADLINE_EXCEEDED:
        reason, is_disruption = REASON_DEADLINE_EXCEEDED, False
    else:
        reason, is_disruption = str(terminated.get("reason") or status.get("reason") or ""), False
    headline = f"Kubernetes: {reason or 'Failed'}" + (f" (exit code {exit_code})" if exit_code is not None else "")
    return ObservedNode(node_id, ObservedState.FAILED, exit_code, host, reason, _evidence(pod, headline), is_disruption)


def observe_deleted_pod(node_id: int, last_seen: Mapping[str, Any] | None, *, stop_requested: bool) -> ObservedNode:
    """The node whose pod is gone (rule 2): STOPPED when the master asked, else a disruption, or what the
    pod had already ended as (a pod that succeeded or failed before someone deleted it keeps that)."""
    pod = last_seen or {}
    host = str((pod.get("spec") or {}).get("nodeName") or "")
    if stop_requested:
        return ObservedNode(node_id, ObservedState.STOPPED, None, host)
    if pod and (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
        return observe_pod(node_id, pod)
    reason = _disruption_reason(pod) or REASON_DELETED
    headline = f"Kubernetes: the pod was deleted by someone other than the master ({reason})"
    evidence = _evidence(pod, headline) if pod else headline
    return ObservedNode(node_id, ObservedState.FAILED, None, host, reason, evidence, True)
