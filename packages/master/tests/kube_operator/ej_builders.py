"""Shared builders for the operator's tests: ElasticJobs, observed objects, master summaries, and the
one bounded wait every suite against an API server uses."""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Mapping
from typing import Any

import attrs

from dlrover.master.operator import CreateObject, Observed, Reconciliation
from dlrover.master.states import JobState, NodeState
from dlrover.master.status import JobSummary, NodeSummary

TOKEN = "t" * 43


def wait_for(
    what: str,
    check: Callable[[], Any],
    timeout_s: float = 150.0,
    *,
    poll_s: float = 0.1,
    explain: Callable[[], str] | None = None,
) -> Any:
    """`check()`'s first truthy value, polled every `poll_s`; fails naming `what` (and what `explain` tells)
    once `timeout_s` passed."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            detail = f"\n{explain()}" if explain is not None else ""
            raise AssertionError(f"timed out waiting for {what}{detail}")
        time.sleep(poll_s)


def template(**container: Any) -> dict[str, Any]:
    main = {"name": "main", "image": "dlrover:test", "command": ["dlrover-run", "train.py"], **container}
    return {"spec": {"containers": [main]}}


def elastic_job(name: str = "job1", namespace: str = "default", **spec: Any) -> dict[str, Any]:
    """An ElasticJob as the API server returns it (uid, generation set)."""
    body: dict[str, Any] = {"replicaSpecs": {"worker": {"template": template(), "minReplicas": 1, "maxReplicas": 2}}}
    body.update(spec)
    return {
        "apiVersion": "elastic.dlrover.io/v1alpha1",
        "kind": "ElasticJob",
        "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}", "generation": 1},
        "spec": body,
    }


def with_status(job: Mapping[str, Any], answer: Reconciliation) -> dict[str, Any]:
    out = copy.deepcopy(dict(job))
    out["status"] = copy.deepcopy(dict(answer.status))
    return out


def edited(job: Mapping[str, Any], change: Mapping[str, Any]) -> dict[str, Any]:
    """The job after a spec edit (generation + 1); `change` is merged into spec one level deep."""
    out = copy.deepcopy(dict(job))
    for key, value in change.items():
        out["spec"][key] = value
    out["metadata"]["generation"] += 1
    return out


def created(answer: Reconciliation, kind: str) -> dict[str, Any]:
    objs = [dict(w.obj) for w in answer.writes if isinstance(w, CreateObject) and w.kind == kind]
    assert len(objs) == 1, answer.writes
    return objs[0]


def observed_after(answer: Reconciliation, base: Observed | None = None, **changes: Any) -> Observed:
    """What exists once the answer's creates were made (a pod just created is Pending)."""
    fields: dict[str, Any] = {}
    names = {
        "ServiceAccount": "service_account",
        "Role": "role",
        "RoleBinding": "role_binding",
        "Secret": "secret",
        "Service": "service",
        "Pod": "master_pod",
    }
    for write in answer.writes:
        if isinstance(write, CreateObject):
            obj = copy.deepcopy(dict(write.obj))
            obj["metadata"]["uid"] = f"uid-{write.kind}-{obj['metadata']['name']}"
            if write.kind == "Pod":
                obj["status"] = {"phase": "Pending"}
            fields[names[write.kind]] = obj
    return attrs.evolve(base or Observed(), **{**fields, **changes})


def pod_phase(
    pod: Mapping[str, Any], phase: str, *, ip: str = "127.0.0.5", exit_code: int | None = None, reason: str = ""
) -> dict[str, Any]:
    out = copy.deepcopy(dict(pod))
    status: dict[str, Any] = {"phase": phase}
    if phase == "Running":
        status["podIP"] = ip
    if exit_code is not None or reason:
        terminated: dict[str, Any] = {"reason": reason or "Error"}
        if exit_code is not None:
            terminated["exitCode"] = exit_code
        status["containerStatuses"] = [{"name": "master", "state": {"terminated": terminated}}]
    out["status"] = status
    return out


def summary(
    state: JobState = JobState.RUNNING,
    *,
    running: int = 2,
    min_nodes: int = 1,
    max_nodes: int = 2,
    wanted: int = 0,
    goodput: float = 0.9,
) -> JobSummary:
    nodes = tuple(NodeSummary(node_id=i, rank=i, state=NodeState.RUNNING, process_restarts=1) for i in range(running))
    return JobSummary(
        job_name="job1",
        state=state,
        exit_reason="" if state is JobState.RUNNING else f"the job {state.value}",
        nodes=nodes,
        min_nodes=min_nodes,
        max_nodes=max_nodes,
        goodput=goodput,
        total_relaunches=3,
        step=42,
        target_nodes=running,
        wanted_nodes=wanted,
    )
