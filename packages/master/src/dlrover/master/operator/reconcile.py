"""The operator's decision: a pure function of (an ElasticJob, what is observed) to writes and a reason.

`reconcile` is level-triggered: it compares what the job asks for with what exists and returns the
few writes that close the gap, plus the status the job should show. Calling it again on the same
inputs after its writes were made returns no writes, so a missed or repeated event changes nothing.
It never reads a clock (`now` comes in), never makes a token (`new_token` comes in) and does no I/O;
`dlrover.master.operator.controller` feeds it and carries out its answer.

The rules, in order:

1. A job being deleted: nothing (ownership deletes what it owns).
2. A job that ended (the master said so, or exited 0, 1 or 3): nothing is recreated.
3. A spec that breaks the schema or a rule the schema cannot express: with no master yet, a
   `Failed` condition naming the field and nothing created; once the job started, the edit is
   refused (`SpecChangeRefused`) and the job runs on the spec in force (`status.appliedSpec`): its
   master is still watched, mirrored and replaced when it dies.
4. A storage the spec names (a checkpoint PVC, an object-store or TLS Secret) that does not exist:
   the same, checked before the master starts.
5. `suspend`: the master pod (at once, so it does not stop the job: dlrover-master stops the job
   on SIGTERM) and the worker pods are deleted; resuming recreates the master, which resumes from
   its journal on `spec.master.stateVolume`.
6. The Secret, ServiceAccount, Role, RoleBinding and Service are created when missing, and the
   Service's ports and selector and the Role's rules are brought back to what the spec in force
   needs when they differ (a port changed while suspended, a worker job turned into a
   parameter-server job, an operator upgrade's new rules); an object of the same name owned by
   another job (a deleted one of the same name whose objects are still being collected) is not
   this job's: it is waited out. The master pod is created when missing, and replaced (counted in
   `masterRestarts`, bounded) when it died for any reason but the job's end. A master pod on a lost
   node is dead too, though nothing reports it so (no kubelet is left to): Running with `Ready=False` for longer than
   `master_unready_timeout_s`, or Terminating past its deletion time (the taint manager's graceful
   deletion, which only that node's kubelet could finish) plus `master_terminating_margin_s`. It is
   force-deleted (grace 0) and replaced; see `_Pass.master_lost` for why that is safe.
7. An edit a running job cannot take (anything but `suspend` and the node counts) is refused in the
   status; a new node count within the master's range is carried out by its resize RPC (judged
   once the master answers its status). The spec in force is the one the master was started with,
   with the node counts carried out since (read back from the live master pod if the status lost
   it); every master after the first, and the Service, follow it, never a refused edit or a count
   not carried out yet. Suspending the job ends it: the master a resume starts takes the spec as it
   then is.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

import attrs

from dlrover.common.validators import non_negative, positive
from dlrover.master.kube.names import (
    APPLIED_SPEC_STATUS,
    master_name,
    token_secret_name,
)
from dlrover.master.kube.times import epoch_seconds
from dlrover.master.operator import objects
from dlrover.master.operator.spec import JobSpec, check_spec
from dlrover.master.states import JobState, NodeState
from dlrover.master.status import JobSummary

__all__ = [
    "APPLIED_SPEC_STATUS",
    "MASTER_EXIT_RETRY",
    "Condition",
    "CreateObject",
    "DeleteObject",
    "Observed",
    "ReconcileSettings",
    "Reconciliation",
    "ResizeJob",
    "UpdateObject",
    "Write",
    "reconcile",
]


class Condition:
    """The condition types the operator writes."""

    MASTER_READY = "MasterReady"
    FAILED = "Failed"
    SUCCEEDED = "Succeeded"
    SUSPENDED = "Suspended"
    SPEC_CHANGE_REFUSED = "SpecChangeRefused"


_TERMINAL_FAILURES = frozenset({"JobFailed", "JobStopped", "MasterFailed", "MasterRestartsExhausted"})
"""Reasons of a `Failed` condition that end the job for good (others clear once the spec is fixed)."""

_ENDED_STATES = {JobState.SUCCEEDED: "JobSucceeded", JobState.FAILED: "JobFailed", JobState.STOPPED: "JobStopped"}

_ENDED_EXIT_CODES = {0: "JobSucceeded", 1: "JobFailed", 2: "MasterFailed", 3: "JobStopped"}
"""dlrover-master's exit statuses: 0 succeeded, 1 failed, 2 bad usage, 3 stopped. Any other end (a
signal, an OOM kill, an eviction, a lost node, `MASTER_EXIT_RETRY`) is the master dying, not the job
ending."""

MASTER_EXIT_RETRY = 75
"""dlrover-master's "could not start now, retry" status (`dlrover.master.exits.EXIT_RETRY`): another master
still holds the state directory, or the API server could not be reached. Replaced after a backoff."""


@attrs.frozen
class CreateObject:
    """Create `obj` (a `kind` in the job's namespace)."""

    kind: str
    obj: Mapping[str, Any]

    @property
    def name(self) -> str:
        return str(self.obj["metadata"]["name"])


@attrs.frozen
class UpdateObject:
    """Replace `obj` (a `kind` in the job's namespace), which carries the resourceVersion it was read at: a
    conflict (someone changed it since) is retried from a fresh read."""

    kind: str
    obj: Mapping[str, Any]
    reason: str

    @property
    def name(self) -> str:
        return str(self.obj["metadata"]["name"])


@attrs.frozen
class DeleteObject:
    """Delete the `kind` named `name` in the job's namespace; `grace_period_s` None: the pod's own."""

    kind: str
    name: str
    reason: str
    grace_period_s: int | None = None
    uid: str = ""
    """Only that incarnation (a precondition): a newer one of the same name is left alone."""


@attrs.frozen
class ResizeJob:
    """Ask the master (its resize RPC) to run `target` nodes."""

    target: int
    reason: str


Write = CreateObject | UpdateObject | DeleteObject | ResizeJob


@attrs.frozen
class Observed:
    """What exists for one job (the controller's caches and its last call to the master).

    Attributes:
        master_pod, service, secret, service_account, role, role_binding: the job's objects by
            their contract names; None when absent.
        worker_pods: the job's worker pods (by label).
        claims: the names of the PersistentVolumeClaims the spec refers to that exist.
        secrets: the names of the Secrets the spec refers to that exist.
        foreign: the kinds of the job's objects whose names another owner holds (left out above): a
            deleted job of the same name whose objects are still being collected, or someone else's.
        summary: the master's last answer to the status RPC (from the current master pod); None
            before one.
        master_error: why the last status call failed ("" when it did not).
    """

    master_pod: Mapping[str, Any] | None = None
    service: Mapping[str, Any] | None = None
    secret: Mapping[str, Any] | None = None
    service_account: Mapping[str, Any] | None = None
    role: Mapping[str, Any] | None = None
    role_binding: Mapping[str, Any] | None = None
    worker_pods: tuple[Mapping[str, Any], ...] = ()
    claims: frozenset[str] = frozenset()
    secrets: frozenset[str] = frozenset()
    foreign: frozenset[str] = frozenset()
    summary: JobSummary | None = None
    master_error: str = ""


@attrs.frozen
class ReconcileSettings:
    """The operator's settings the decision depends on.

    Attributes:
        master: how masters are started.
        max_master_restarts: replacements of a dead master before the job is failed.
        master_unready_timeout_s: how long a Running master pod may show `Ready=False` (its node
            stopped answering: the node lifecycle controller marks its pods not ready) before it is
            taken for dead and replaced.
        master_terminating_margin_s: how long past its deletion time (the deletion's time plus the
            pod's grace period) a Terminating master pod may stay before it is taken for dead (its
            node's kubelet, the only one that could finish the deletion, is gone) and force-deleted.
        master_retry_backoff_s, master_retry_backoff_max_s: how long a master pod that exited with
            `MASTER_EXIT_RETRY` (it could not start now) is left before it is replaced: the first,
            doubled per replacement counted, up to the maximum (from the container's finishedAt).
    """

    master: objects.MasterSettings = attrs.field(factory=objects.MasterSettings)
    max_master_restarts: int = 10
    master_unready_timeout_s: float = attrs.field(default=120.0, validator=positive)
    master_terminating_margin_s: float = attrs.field(default=30.0, validator=non_negative)
    master_retry_backoff_s: float = attrs.field(default=5.0, validator=non_negative)
    master_retry_backoff_max_s: float = attrs.field(default=300.0, validator=non_negative)

    def retry_backoff_s(self, restarts: int) -> float:
        """The wait before replacing a master that exited `MASTER_EXIT_RETRY`, the `restarts`-th counted."""
        return float(min(self.master_retry_backoff_s * 2 ** max(restarts - 1, 0), self.master_retry_backoff_max_s))


@attrs.frozen
class Reconciliation:
    """The answer of `reconcile`.

    Attributes:
        writes: to make, in order.
        status: the status the job should show (written when it differs from the current one).
        reason: why, in a sentence or a few.
    """

    writes: tuple[Write, ...]
    status: Mapping[str, Any]
    reason: str


def _condition(status: dict[str, Any], kind: str) -> dict[str, Any] | None:
    for condition in status.get("conditions") or []:
        if condition.get("type") == kind:
            return dict(condition)
    return None


def _is_true(status: Mapping[str, Any], kind: str) -> bool:
    return any(c.get("type") == kind and c.get("status") == "True" for c in status.get("conditions") or [])


def _set_condition(
    status: dict[str, Any], kind: str, true: bool, reason: str, message: str, *, now: str, generation: int
) -> None:
    value = "True" if true else "False"
    old = _condition(status, kind)
    new = {
        "type": kind,
        "status": value,
        "reason": reason,
        "message": message,
        "lastTransitionTime": old["lastTransitionTime"] if old and old.get("status") == value else now,
        "observedGeneration": generation,
    }
    others = [c for c in status.get("conditions") or [] if c.get("type") != kind]
    status["conditions"] = [*others, new]


def _clear_condition(status: dict[str, Any], kind: str, reason: str, now: str, generation: int) -> None:
    if _condition(status, kind) is not None:
        _set_condition(status, kind, False, reason, "", now=now, generation=generation)


def _terminated(pod: Mapping[str, Any]) -> tuple[int | None, str, str]:
    """The master container's exit code, reason and message (None: no exit code known)."""
    for container in (pod.get("status") or {}).get("containerStatuses") or []:
        state = (container.get("state") or {}).get("terminated") or (container.get("lastState") or {}).get("terminated")
        if state:
            return state.get("exitCode"), str(state.get("reason") or ""), str(state.get("message") or "")
    status = pod.get("status") or {}
    return None, str(status.get("reason") or ""), str(status.get("message") or "")


def _finished_at(pod: Mapping[str, Any]) -> str:
    """When the master container ended ("" when not known)."""
    for container in (pod.get("status") or {}).get("containerStatuses") or []:
        state = (container.get("state") or {}).get("terminated") or {}
        if state.get("finishedAt"):
            return str(state["finishedAt"])
    return ""


def _pending_message(pod: Mapping[str, Any]) -> str:
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("status") == "False":
            return f"{condition.get('reason', '')}: {condition.get('message', '')}"
    return "the master pod is pending"


def _mirror(status: dict[str, Any], summary: JobSummary) -> None:
    counts = {"pending": 0, "running": 0, "succeeded": 0, "failed": 0}
    for node in summary.nodes:
        if node.state in (NodeState.PENDING, NodeState.STARTING):
            counts["pending"] += 1
        elif node.state is NodeState.RUNNING:
            counts["running"] += 1
        elif node.state is NodeState.SUCCEEDED:
            counts["succeeded"] += 1
        else:
            counts["failed"] += 1
    status.update(
        nodes=counts,
        restarts=sum(n.process_restarts for n in summary.nodes),
        relaunches=summary.total_relaunches,
        goodput=round(min(max(summary.goodput, 0.0), 1.0), 4),
        step=summary.step,
        targetNodes=summary.target_nodes,
        minNodes=summary.min_nodes,
        maxNodes=summary.max_nodes,
    )


def _end(status: dict[str, Any], reason: str, message: str, now: str, generation: int) -> None:
    """Mark the job ended for good (`reason` one of `_ENDED_EXIT_CODES`' values)."""
    if reason == "JobSucceeded":
        status["phase"] = "Succeeded"
        _set_condition(status, Condition.SUCCEEDED, True, reason, message, now=now, generation=generation)
    else:
        status["phase"] = "Failed"
        _set_condition(status, Condition.FAILED, True, reason, message, now=now, generation=generation)
    status["message"] = message
    _set_condition(status, Condition.MASTER_READY, False, "JobEnded", message, now=now, generation=generation)


def _ended(status: Mapping[str, Any]) -> bool:
    if _is_true(status, Condition.SUCCEEDED):
        return True
    failed = next((c for c in status.get("conditions") or [] if c.get("type") == Condition.FAILED), None)
    return bool(failed and failed.get("status") == "True" and failed.get("reason") in _TERMINAL_FAILURES)


def _deleting(obj: Mapping[str, Any] | None) -> bool:
    return bool(obj and (obj.get("metadata") or {}).get("deletionTimestamp"))


def _uid(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("uid") or "")


def _lost_master(pod: Mapping[str, Any], now: str, settings: ReconcileSettings) -> str:
    """Why the master pod is taken for dead though nothing reported it so (its node is lost); "" if not."""
    now_s = epoch_seconds(now)
    if now_s is None:
        return ""
    unready = _unready_too_long(pod, now_s, settings.master_unready_timeout_s)
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        # (A deleted pod on a node lost long before is dead whatever its deletion's time.)
        return _stuck_terminating(pod, now_s, settings.master_terminating_margin_s) or unready
    return unready


def _stuck_terminating(pod: Mapping[str, Any], now_s: float, margin_s: float) -> str:
    meta = pod.get("metadata") or {}
    # deletionTimestamp is the deletion's time plus the grace period (the API server sets it so).
    deadline = epoch_seconds(meta.get("deletionTimestamp"))
    if deadline is None or now_s <= deadline + margin_s:
        return ""
    node = str((pod.get("spec") or {}).get("nodeName") or "?")
    return (
        f"the master pod has been Terminating since {meta['deletionTimestamp']} (its grace period over, plus "
        f"{margin_s:g} s): its node {node} does not confirm the deletion"
    )


def _unready_too_long(pod: Mapping[str, Any], now_s: float, timeout_s: float) -> str:
    status = pod.get("status") or {}
    if status.get("phase") != "Running":
        return ""
    ready = next((c for c in status.get("conditions") or [] if c.get("type") == "Ready"), None)
    since = epoch_seconds((ready or {}).get("lastTransitionTime"))
    if ready is None or ready.get("status") != "False" or since is None or now_s - since <= timeout_s:
        return ""
    node = str((pod.get("spec") or {}).get("nodeName") or "?")
    return (
        f"the master pod has not been ready since {ready.get('lastTransitionTime')} (more than {timeout_s:g} s) "
        f"on node {node}: the node stopped answering"
    )


@attrs.frozen
class _Edit:
    """What of the requested spec a started job cannot take: `errors` (with `reason`), and whether the job runs
    on the spec in force instead (`changed`)."""

    errors: tuple[str, ...] = ()
    reason: str = ""
    changed: bool = False


class _Pass:
    """One reconcile pass: the inputs, the status being built, the writes and the reasons."""

    def __init__(
        self, job: Mapping[str, Any], observed: Observed, settings: ReconcileSettings, now: str, new_token: str
    ) -> None:
        self.job = job
        self.observed = observed
        self.settings = settings
        self.now = now
        self.new_token = new_token
        self.generation = int(job["metadata"].get("generation") or 0)
        self.status: dict[str, Any] = json.loads(json.dumps(job.get("status") or {}))
        self.writes: list[Write] = []
        self.reasons: list[str] = []
        self.edit = _Edit()
        self.requested: JobSpec | None = None  # the spec as the job asks for it (None: it cannot be run)
        self.in_force: JobSpec | None = None  # the spec the started job runs on (None: not started)

    def condition(self, kind: str, true: bool, reason: str, message: str = "") -> None:
        _set_condition(self.status, kind, true, reason, message, now=self.now, generation=self.generation)

    def clear(self, kind: str, reason: str) -> None:
        _clear_condition(self.status, kind, reason, self.now, self.generation)

    def answer(self) -> Reconciliation:
        return Reconciliation(tuple(self.writes), self.status, "; ".join(self.reasons) or "nothing to do")

    def run(self) -> Reconciliation:
        if _deleting(self.job):
            self.reasons.append("the job is being deleted: its owner references delete what it owns")
            return Reconciliation((), self.job.get("status") or {}, self.reasons[0])
        self.status.setdefault("phase", "Pending")
        self.status.setdefault("masterRestarts", 0)
        self.status.pop("appliedMaxReplicas", None)  # an older operator's; the counts are in the spec in force
        pod = self.observed.master_pod
        if self.observed.summary is not None:
            _mirror(self.status, self.observed.summary)
        if self.ended_or_suspended(pod):
            return self.answer()
        requested, errors = self.requested_spec()
        in_force = self.spec_in_force(pod)
        if requested is None and in_force is None:
            return self.refuse(errors, "InvalidSpec")
        self.requested, self.in_force = requested, in_force
        self.edit = self.refused_edit(errors)
        # Once started, the job runs on the spec in force: an edit reaches it (and a replacement master) only as
        # `check_edit` carries it out, so neither a refused edit nor a node count not carried out yet does.
        spec = in_force if in_force is not None else requested
        assert spec is not None  # (both None returned above)
        if pod is None:
            missing = [
                f"{field}: PersistentVolumeClaim {name!r} not found"
                for field, name in spec.claims.items()
                if name not in self.observed.claims
            ] + [
                f"{field}: Secret {name!r} not found"
                for field, name in spec.secrets.items()
                if name not in self.observed.secrets
            ]
            if missing:
                return self.refuse(tuple(missing), "StorageNotFound")
        if _is_true(self.status, Condition.FAILED):
            self.clear(Condition.FAILED, "SpecValid")
        self.status["observedGeneration"] = self.generation
        self.clear(Condition.SUSPENDED, "Resumed")
        self.ensure_objects(spec)
        self.master(spec)
        return self.answer()

    def requested_spec(self) -> tuple[JobSpec | None, tuple[str, ...]]:
        """The spec as the job now asks for it, checked (None and why: it cannot be run)."""
        check = check_spec(self.job)
        if check.spec is None:
            return None, check.errors
        spec = self.with_default_tls(check.spec)
        if spec.ps_job is not None and spec.tls_secret is not None:
            return None, ("--master-tls-secret: the operator serves every master with TLS, which a parameter-server "
                          "job's master does not serve yet",)  # fmt: skip
        return spec, ()

    def spec_in_force(self, pod: Mapping[str, Any] | None) -> JobSpec | None:
        """The spec the started job runs on (`APPLIED_SPEC_STATUS`); None before it started (or after a suspend)."""
        applied = self.status.get(APPLIED_SPEC_STATUS)
        read_back = not isinstance(applied, Mapping)
        if read_back:
            applied = self.spec_of_running_master(pod)
            if applied is None:
                return None
        check = check_spec({**{k: v for k, v in self.job.items() if k != "status"}, "spec": applied})
        if check.spec is None:
            return None
        if read_back:  # (only a spec that checks: an unreadable annotation leaves the status as it was)
            self.status[APPLIED_SPEC_STATUS] = applied
            self.reasons.append("the spec in force read back from the running master pod")
        return self.with_default_tls(check.spec)

    def spec_of_running_master(self, pod: Mapping[str, Any] | None) -> dict[str, Any] | None:
        """The spec a live master pod was started with: its annotation, and the node range of its `--nnodes` (the
        annotation leaves a worker job's counts out). For a job whose status lacks the spec in force (the status
        write after the pod's create failed, or an operator from before it kept one). None for no pod, or one on
        its way out (a suspended job's, whose resume must take the spec as it then is)."""
        if pod is None or _deleting(pod) or (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed"):
            return None
        text = ((pod.get("metadata") or {}).get("annotations") or {}).get(objects.APPLIED_SPEC_ANNOTATION)
        try:
            part = json.loads(text) if text else None
        except ValueError:
            return None
        if not isinstance(part, dict):
            return None
        started = objects.started_node_range(pod)
        replicas = part.get("replicaSpecs")
        worker = replicas.get("worker") if isinstance(replicas, dict) else None
        if started is not None and isinstance(worker, dict):
            worker["minReplicas"], worker["maxReplicas"] = started
        return part

    def refused_edit(self, errors: tuple[str, ...]) -> _Edit:
        """What of the requested spec a started job cannot take (nothing before it started)."""
        requested, in_force = self.requested, self.in_force
        if requested is None:
            return _Edit(errors, "InvalidSpec", changed=True)
        if in_force is None:
            return _Edit()
        changed = objects.changed_fields(objects.applied_part(in_force.raw), objects.applied_part(requested.raw))
        if not changed:
            return _Edit()
        message = (
            f"{', '.join(changed)} cannot change while the job runs (suspend and resume the job to start its master "
            "with the new spec)"
        )
        return _Edit((message,), "CannotApply", changed=True)

    def ended_or_suspended(self, pod: Mapping[str, Any] | None) -> bool:
        """Whether the job ended (nothing more to do) or is suspended (its pods deleted)."""
        if _ended(self.status):
            self.reasons.append(f"the job ended ({self.status.get('phase')}): nothing is recreated")
            return True
        end = self.end_by_master(pod)
        if end is not None:
            reason, message = end
            _end(self.status, reason, message, self.now, self.generation)
            self.reasons.append(f"the master ended the job ({reason}): {message}")
            return True
        if (self.job.get("spec") or {}).get("suspend") is True:
            # Before the spec check: stopping pods is safe whatever else an edit broke.
            self.status["observedGeneration"] = self.generation
            self.suspend()
            return True
        return False

    def with_default_tls(self, spec: JobSpec) -> JobSpec:
        default = self.settings.master.tls_secret
        if spec.tls_secret is not None or default is None:
            return spec
        return attrs.evolve(spec, tls_secret=default, secrets={**spec.secrets, "--master-tls-secret": default})

    def refuse(self, errors: tuple[str, ...], reason: str) -> Reconciliation:
        message = "; ".join(errors)
        if self.observed.master_pod is None:
            self.status["phase"] = "Failed"
            self.status["message"] = message
            self.condition(Condition.FAILED, True, reason, message)
            self.reasons.append(f"nothing created: {message}")
        else:
            self.condition(Condition.SPEC_CHANGE_REFUSED, True, reason, message)
            self.reasons.append(f"the edit is refused and the job runs on: {message}")
        return self.answer()

    def suspend(self) -> Reconciliation:
        pod = self.observed.master_pod
        lost = _lost_master(pod, self.now, self.settings) if pod is not None and _deleting(pod) else ""
        if pod is not None and lost:
            # Its node is lost: no kubelet will finish the graceful delete (see `master_lost` for the journal).
            self.writes.append(DeleteObject("Pod", master_name(self.name), lost, 0, _uid(pod)))
            if _uid(pod):
                self.status["countedMaster"] = _uid(pod)  # its end is the suspension's, no restart
        if pod is not None and not _deleting(pod):
            # With its grace: a master given SIGTERM leaves its job resumable (it hands its pods over; they are
            # deleted here), and a resumed master is created only once this one is gone, so two never share
            # the journal (a grace-0 delete removes the object while the container may still run).
            self.writes.append(DeleteObject("Pod", master_name(self.name), "the job is suspended", None, _uid(pod)))
            if _uid(pod):
                self.status["countedMaster"] = _uid(pod)  # its end is the suspension's, no restart
        for worker in self.observed.worker_pods:
            if not _deleting(worker):
                name = str(worker["metadata"]["name"])
                self.writes.append(DeleteObject("Pod", name, "the job is suspended", None, _uid(worker)))
        # A resume starts the master from the spec as it then is.
        self.status.pop(APPLIED_SPEC_STATUS, None)
        self.status["phase"] = "Suspended"
        self.status["message"] = "suspended: the master and the workers are stopped"
        self.condition(Condition.SUSPENDED, True, "Suspended", "spec.suspend is true")
        self.condition(Condition.MASTER_READY, False, "Suspended", "the job is suspended")
        self.reasons.append(f"suspended: {len(self.writes)} pod(s) to delete")
        return self.answer()

    @property
    def name(self) -> str:
        return str(self.job["metadata"]["name"])

    def ensure_objects(self, spec: JobSpec) -> None:
        observed, job = self.observed, self.job
        wanted: tuple[tuple[str, Mapping[str, Any] | None, Callable[[], dict[str, Any]], tuple[str, ...]], ...] = (
            ("ServiceAccount", observed.service_account, lambda: objects.master_service_account(job), ()),
            ("Role", observed.role, lambda: objects.master_role(job, spec), ("rules",)),
            ("RoleBinding", observed.role_binding, lambda: objects.master_role_binding(job), ()),
            ("Secret", observed.secret, lambda: objects.token_secret(job, self.new_token), ()),
            ("Service", observed.service, lambda: objects.master_service(job, spec), ("spec.ports", "spec.selector")),
        )
        for kind, present, build, kept in wanted:
            name = token_secret_name(self.name) if kind == "Secret" else master_name(self.name)
            if kind in observed.foreign:
                self.reasons.append(f"wait: the {kind} {name} belongs to another object (a deleted job's, collected)")
            elif present is None:
                self.writes.append(CreateObject(kind, build()))
                self.reasons.append(f"create the {kind} {name}")
            elif kept:
                self.bring_back(kind, present, build(), kept)

    def bring_back(
        self, kind: str, present: Mapping[str, Any], wanted: Mapping[str, Any], paths: tuple[str, ...]
    ) -> None:
        """Update the fields `paths` (dotted) of an existing object that differ from what the spec in force needs."""
        updated: dict[str, Any] = json.loads(json.dumps(dict(present)))
        differ = []
        for path in paths:
            *parents, leaf = path.split(".")
            have: Any = updated
            want: Any = wanted
            for part in parents:
                have = have.setdefault(part, {})
                want = want[part]
            if have.get(leaf) != want[leaf]:
                differ.append(path)
                have[leaf] = json.loads(json.dumps(want[leaf]))
        if differ:
            why = f"its {', '.join(differ)} differ from what the spec in force needs"
            self.writes.append(UpdateObject(kind, updated, why))
            self.reasons.append(f"update the {kind} {master_name(self.name)}: {why}")

    def master(self, spec: JobSpec) -> None:
        pod = self.observed.master_pod
        if pod is None and self.observed.foreign:
            # (A master started without its own Role, Secret or Service would fail, and count as a restart.)
            held = ", ".join(sorted(self.observed.foreign))
            message = f"waiting for objects of this job's names that another owner holds to go: {held}"
            self.condition(Condition.MASTER_READY, False, "MasterPending", message)
            self.reasons.append(f"no master yet: {message}")
            return
        if pod is None:
            self.create_master(spec)
            return
        lost = _lost_master(pod, self.now, self.settings)
        if lost:
            self.master_lost(pod, lost)
            return
        if _deleting(pod):
            if _is_true(self.status, Condition.MASTER_READY):
                # Deleted by someone else (the operator's own deletions are counted or excused when made):
                # counted now, as `create_master` would have had the pod gone before this look, since the
                # condition it counts by is false from here on.
                self.count_end(pod)
            self.condition(Condition.MASTER_READY, False, "MasterTerminating", "the old master pod is being deleted")
            self.reasons.append("wait for the old master pod to go")
            return
        phase = (pod.get("status") or {}).get("phase") or "Pending"
        if phase in ("Succeeded", "Failed"):
            self.master_exited(pod, phase)
            return
        summary = self.observed.summary
        if phase == "Running" and (pod.get("status") or {}).get("podIP"):
            ip = pod["status"]["podIP"]
            self.status["masterAddress"] = f"{ip}:{spec.master_port}"
            if summary is None:
                message = self.observed.master_error or "waiting for the master's first status"
                self.condition(Condition.MASTER_READY, False, "MasterStarting", message)
                self.reasons.append(f"the master runs; no status yet ({message})")
            else:
                self.condition(Condition.MASTER_READY, True, "Running", f"the master serves on {ip}:{spec.master_port}")
                self.follow_master(summary)
        else:
            self.condition(Condition.MASTER_READY, False, "MasterPending", _pending_message(pod))
            self.reasons.append("the master pod is not running yet")
        self.check_edit(summary)

    def create_master(self, spec: JobSpec) -> None:
        restarted = _is_true(self.status, Condition.MASTER_READY)
        if restarted:
            # It was running and is gone (deleted by someone, or by its node): a replacement.
            self.status["masterRestarts"] = int(self.status.get("masterRestarts", 0)) + 1
        restarts = int(self.status.get("masterRestarts", 0))
        if restarts > self.settings.max_master_restarts:
            message = f"the master died {restarts} times (limit {self.settings.max_master_restarts})"
            _end(self.status, "MasterRestartsExhausted", message, self.now, self.generation)
            self.reasons.append(message)
            return
        self.writes.append(CreateObject("Pod", objects.master_pod(self.job, spec, self.settings.master)))
        self.status[APPLIED_SPEC_STATUS] = json.loads(json.dumps(dict(spec.raw)))
        self.in_force = spec
        self.check_edit(None)
        fresh = ""
        if restarts and spec.state_volume is None:
            fresh = " (no spec.master.stateVolume: the new master starts the job afresh)"
        message = f"replacement {restarts} of the master{fresh}" if restarts else "the master pod was created"
        self.condition(Condition.MASTER_READY, False, "MasterStarting", message)
        if self.status.get("phase") != "Running":
            self.status["phase"] = "Pending"
        self.reasons.append(f"create the master pod {master_name(self.name)}{fresh}")

    def end_by_master(self, pod: Mapping[str, Any] | None) -> tuple[str, str] | None:
        """How the job ended, if its master pod says so: its last status, else its exit status."""
        if pod is None or (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed"):
            return None
        summary = self.observed.summary
        if summary is not None and summary.state.finished:
            return _ENDED_STATES[summary.state], summary.exit_reason or f"the job {summary.state.value}"
        code, reason, message = _terminated(pod)
        if code in _ENDED_EXIT_CODES and reason != "OOMKilled":
            return _ENDED_EXIT_CODES[code], message.strip() or f"dlrover-master exited with status {code}"
        return None

    def master_exited(self, pod: Mapping[str, Any], phase: str) -> None:
        """The master pod ended without ending the job (`end_by_master` said no): it died, or could not
        start now (`MASTER_EXIT_RETRY`: replaced once its backoff passed)."""
        code, reason, message = _terminated(pod)
        why = f"the master pod {phase.lower()} ({reason or 'no reason'}, exit code {code}): {message}".rstrip(": ")
        self.count_end(pod)
        if code == MASTER_EXIT_RETRY:
            wait_s = self.settings.retry_backoff_s(int(self.status.get("masterRestarts", 0)))
            finished = epoch_seconds(_finished_at(pod))
            now_s = epoch_seconds(self.now)
            if finished is not None and now_s is not None and now_s < finished + wait_s:
                said = f"the master could not start now ({why}); replaced after a backoff of {wait_s:g} s"
                self.condition(Condition.MASTER_READY, False, "MasterRetrying", said)
                self.reasons.append(f"{said} ({finished + wait_s - now_s:g} s left)")
                return
        self.condition(Condition.MASTER_READY, False, "MasterDied", why)
        self.writes.append(DeleteObject("Pod", master_name(self.name), why, 0, _uid(pod)))
        self.reasons.append(f"{why}: delete it, then start a replacement")

    def count_end(self, pod: Mapping[str, Any]) -> None:
        """Count the master pod's end in `masterRestarts`, once per pod: it may still be seen (its deletion under
        way, a view that lags) after it was counted, or after the operator deleted it itself (`countedMaster`)."""
        uid = _uid(pod)
        if uid and uid == self.status.get("countedMaster"):
            return
        self.status["masterRestarts"] = int(self.status.get("masterRestarts", 0)) + 1
        if uid:
            self.status["countedMaster"] = uid

    def master_lost(self, pod: Mapping[str, Any], why: str) -> None:
        """The master pod's node is lost (`_lost_master`): force-delete the pod so a replacement can start.

        A grace-0 delete removes the object at once while the old container may still run on the
        unreachable node. The journal is safe all the same: a master opens it only while holding the
        state directory's lock (`dlrover.master.statedir`, flock on `master.lock`). The replacement
        cannot take that lock while the old master lives: on a ReadWriteOnce volume it cannot even
        mount the state volume until the attach-detach controller detaches it from the lost node;
        on a shared (NFS) volume the lock holds across hosts until the lost host's lease expires,
        after which that host's I/O on the file fails. Until then the replacement is refused the
        state directory and exits `MASTER_EXIT_RETRY`, and is replaced in turn after a backoff.
        """
        self.count_end(pod)
        self.condition(Condition.MASTER_READY, False, "MasterLost", why)
        self.writes.append(DeleteObject("Pod", master_name(self.name), why, 0, _uid(pod)))
        self.reasons.append(f"{why}: force-delete it, then start a replacement")

    def follow_master(self, summary: JobSummary) -> None:
        state = summary.state
        if state is JobState.RUNNING:
            self.status["phase"] = "Running"
            self.status["message"] = ""
            self.reasons.append("mirrored the master's status")
        else:
            message = summary.exit_reason or f"the job {state.value}"
            _end(self.status, _ENDED_STATES[state], message, self.now, self.generation)
            self.reasons.append(f"the master ended the job: {state.value}")

    def check_edit(self, summary: JobSummary | None) -> None:
        """Carry out what the running job can take of the requested spec (a new node count, by the master's resize
        RPC), record it in the spec in force, and say what it cannot take."""
        requested, in_force = self.requested, self.in_force
        if requested is None or in_force is None:
            self.settle_edit(())
            return
        counts = _node_counts_changed(requested, in_force)
        if counts and (summary is None or summary.state is not JobState.RUNNING):
            # Judged against the master's range once it answers; a refusal shown till then stands.
            if self.edit.errors:
                self.settle_edit(())
            self.reasons.append("the node count edit waits for the running master's status")
            return
        refused = tuple(self.resize(requested, summary)) if counts and summary is not None else ()
        self.settle_edit(refused)
        if refused:
            return
        # Carried out: all of the requested spec, or (the rest refused) its node counts.
        carried = requested.raw if not self.edit.changed else objects.with_node_counts(in_force.raw, requested.raw)
        self.status[APPLIED_SPEC_STATUS] = json.loads(json.dumps(dict(carried)))

    def settle_edit(self, more: tuple[str, ...]) -> None:
        """Show the refused edit (`self.edit` and `more`) in the status, or clear a refusal no longer standing."""
        refused = (*self.edit.errors, *more)
        if refused:
            reason = self.edit.reason if self.edit.errors else "CannotApply"
            self.condition(Condition.SPEC_CHANGE_REFUSED, True, reason, "; ".join(refused))
            self.reasons.append(f"edit refused, the job runs on the spec in force: {'; '.join(refused)}")
        else:
            self.clear(Condition.SPEC_CHANGE_REFUSED, "Applied")

    def resize(self, requested: JobSpec, summary: JobSummary) -> list[str]:
        """Resize the running job to the requested node count; why it cannot be (empty: it is, or needs not be)."""
        if requested.node_range is None or (self.in_force is not None and self.in_force.node_range is None):
            return [
                "spec.replicaSpecs.worker: node counts set or left to the master's plan change only when the master "
                "is started again (suspend and resume the job)"
            ]
        low, high = requested.node_range
        if low != summary.min_nodes or not summary.min_nodes <= high <= summary.max_nodes:
            return [
                f"spec.replicaSpecs.worker: the range {low}..{high} is not the master's {summary.min_nodes}.."
                f"{summary.max_nodes} (a running master carries out a new maxReplicas within its range; the "
                "minimum and the range change when it is started again: suspend and resume the job)"
            ]
        # Only an edit is carried out (the counts differ from the spec in force): the master's own resizes (its
        # autoscaler, `dlrover-master scale`) are not undone. A master that already wants the count needs no
        # resize (the status read may predate the last write).
        wanted = summary.wanted_nodes or summary.max_nodes
        if high != wanted:
            self.writes.append(ResizeJob(high, f"spec.replicaSpecs.worker.maxReplicas is {high}"))
            self.reasons.append(f"resize the job from {wanted} to {high} nodes")
        return []


def _node_counts_changed(requested: JobSpec, in_force: JobSpec) -> bool:
    """Whether a worker job's node counts differ from the spec in force (a parameter-server job's are part of
    what a running job cannot change)."""
    return requested.ps_job is None and in_force.ps_job is None and requested.node_range != in_force.node_range


def reconcile(
    job: Mapping[str, Any],
    observed: Observed,
    settings: ReconcileSettings,
    *,
    now: str,
    new_token: str,
) -> Reconciliation:
    """Decide what to write for one ElasticJob (see the module's rules).

    Args:
        job: the ElasticJob as JSON (metadata, spec, status).
        observed: the job's objects and the master's last status.
        settings: how masters are started, the master restart budget.
        now: the time for conditions' lastTransitionTime (RFC 3339).
        new_token: the token to put in the Secret if it must be created.

    Returns:
        The writes, in order, the status to show, and why.
    """
    return _Pass(job, observed, settings, now, new_token).run()
