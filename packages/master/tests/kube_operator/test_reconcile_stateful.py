"""The reconcile as a state machine: a simulated cluster carries out its writes while the master
runs, dies, is deleted, loses its node (left Running not ready, then Terminating, as a real cluster
leaves it), ends the job, and the user suspends, resumes and edits the job (validly, invalidly, in
what a running job cannot take); time passes."""

from __future__ import annotations

import copy
import datetime
import json
from typing import Any

import hypothesis.strategies as st
from ej_builders import TOKEN, elastic_job, summary
from hypothesis import settings
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from dlrover.master.operator import (
    APPLIED_SPEC_STATUS,
    MASTER_EXIT_RETRY,
    CreateObject,
    DeleteObject,
    MasterSettings,
    Observed,
    ReconcileSettings,
    ResizeJob,
    UpdateObject,
    check_spec,
    reconcile,
)
from dlrover.master.operator.objects import APPLIED_SPEC_ANNOTATION, applied_part
from dlrover.master.operator.reconcile import _ended
from dlrover.master.operator.schema import STATUS_SCHEMA, schema_errors

MAX_RESTARTS = 3
SETTINGS = ReconcileSettings(master=MasterSettings(image="img"), max_master_restarts=MAX_RESTARTS)
_FIELDS = {
    "ServiceAccount": "service_account",
    "Role": "role",
    "RoleBinding": "role_binding",
    "Secret": "secret",
    "Service": "service",
}


class OperatorMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.job = elastic_job()
        self.objects: dict[str, dict[str, Any]] = {}
        self.master: dict[str, Any] | None = None
        self.workers: dict[str, dict[str, Any]] = {}
        self.running = False  # the master answers its status
        self.uid = 0
        self.deaths = 0  # master pods that died or were deleted after they served
        self.ended = False
        self.masters_after_end = 0
        self.last_restarts = 0
        self.passes = 0
        self.previous: Observed | None = None
        self.clock_s = 0.0  # seconds since the start of 2026
        self.counted: set[str] = set()  # master pods whose death is counted in `deaths`
        self.master_range = (1, 2)  # the master's node range (its --nnodes)
        self.master_wanted = 2  # the node count it runs at: its maximum, then what resizes asked for

    def _now(self, offset_s: float = 0.0) -> str:
        start = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
        return (start + datetime.timedelta(seconds=self.clock_s + offset_s)).strftime("%Y-%m-%dT%H:%M:%SZ")

    def _death(self) -> None:
        assert self.master is not None
        uid = self.master["metadata"]["uid"]
        if uid not in self.counted:
            self.counted.add(uid)
            self.deaths += 1

    def _uid(self) -> str:
        self.uid += 1
        return f"u{self.uid}"

    def _observed(self) -> Observed:
        return Observed(
            master_pod=self.master,
            worker_pods=tuple(self.workers.values()),
            summary=(
                summary(min_nodes=self.master_range[0], max_nodes=self.master_range[1], wanted=self.master_wanted)
                if self.running
                else None
            ),
            **{field: self.objects.get(kind) for kind, field in _FIELDS.items()},
        )

    def _pass(self, stale: Observed | None = None) -> int:
        observed = stale or self._observed()
        self.previous = self._observed()
        now = self._now()
        in_force = (self.job.get("status") or {}).get(APPLIED_SPEC_STATUS)
        answer = reconcile(self.job, observed, SETTINGS, now=now, new_token=TOKEN)
        again = reconcile(copy.deepcopy(self.job), observed, SETTINGS, now=now, new_token=TOKEN)
        assert again == answer, "the decision depends only on its inputs"
        assert schema_errors(STATUS_SCHEMA, dict(answer.status), "status") == []
        resize_failed = False
        for write in answer.writes:
            resize_failed = not self._carry_out(write, stale, in_force) or resize_failed
        self.job["status"] = copy.deepcopy(dict(answer.status))
        if resize_failed:  # (as the controller does: the spec in force must not say it was carried out)
            self.job["status"].pop(APPLIED_SPEC_STATUS, None)
            if in_force is not None:
                self.job["status"][APPLIED_SPEC_STATUS] = in_force
        if _ended(answer.status):
            self.ended = True  # the operator saw the end (maybe on a stale view of a pod since deleted)
        restarts = int(answer.status.get("masterRestarts", 0))
        assert restarts >= self.last_restarts, "masterRestarts never goes back"
        self.last_restarts = restarts
        self.passes += 1
        return len(answer.writes)

    def _carry_out(self, write: Any, stale: Observed | None, in_force: dict[str, Any] | None) -> bool:
        """Make one write in the simulated cluster; False for a resize that fails (its master is gone)."""
        if isinstance(write, CreateObject):
            obj = copy.deepcopy(dict(write.obj))
            owner = obj["metadata"]["ownerReferences"][0]
            assert owner["uid"] == self.job["metadata"]["uid"]
            assert owner["controller"] is True
            obj["metadata"]["uid"] = self._uid()
            if stale is not None and ((write.kind == "Pod" and self.master is not None) or write.kind in self.objects):
                return True  # the API server answers 409: it exists already
            if write.kind == "Pod":
                self._master_created(obj, in_force)
            else:
                assert write.kind not in self.objects, f"a second {write.kind}"
                self.objects[write.kind] = obj
        elif isinstance(write, DeleteObject):
            if stale is not None and self.master is not None and write.uid != self.master["metadata"]["uid"]:
                return True  # the uid precondition fails: a newer master is left alone
            if self.master is not None and write.name == self.master["metadata"]["name"]:
                self._delete_master(write)
            else:
                self.workers.pop(write.name, None)
        elif isinstance(write, UpdateObject):
            assert write.kind in self.objects, f"an update of a missing {write.kind}"
            self.objects[write.kind] = copy.deepcopy(dict(write.obj))
        else:
            assert isinstance(write, ResizeJob)
            if not self.running:
                assert stale is not None, "a resize of a master that is not running"
                return False  # the RPC fails: the master the stale view showed is gone
            assert self.master_range[0] <= write.target <= self.master_range[1], "a resize beyond the range"
            self.master_wanted = write.target
        return True

    def _master_created(self, obj: dict[str, Any], in_force: dict[str, Any] | None) -> None:
        assert self.master is None, "a second master pod"
        started_with = json.loads(obj["metadata"]["annotations"][APPLIED_SPEC_ANNOTATION])
        if in_force is None:
            assert check_spec(self.job).spec is not None, "a master created from an invalid spec"
            assert started_with == applied_part(self.job["spec"])
        else:
            # A replacement: from the spec in force, whatever edit is refused meanwhile, with the node count
            # the master it replaces was resized to (and not one refused or not carried out yet).
            assert started_with == applied_part(in_force), "a replacement took a refused edit"
            worker = in_force["replicaSpecs"]["worker"]
            assert _nnodes(obj) == (worker["minReplicas"], worker["maxReplicas"])
            assert worker["maxReplicas"] == self.master_wanted, "a replacement lost a node count carried out"
        self.master_range = _nnodes(obj)
        self.master_wanted = self.master_range[1]
        assert not self.job["spec"].get("suspend"), "a master created for a suspended job"
        if self.ended:
            self.masters_after_end += 1
        obj["status"] = {"phase": "Pending"}
        self.master = obj

    def _delete_master(self, write: DeleteObject) -> None:
        assert self.master is not None
        assert write.uid == self.master["metadata"]["uid"]
        meta = self.master["metadata"]
        if write.grace_period_s is None and not meta.get("deletionTimestamp"):
            # A graceful delete: Terminating until its kubelet confirms (`graceful_deletion_ends`).
            meta["deletionTimestamp"] = self._now(30)
            meta["deletionGracePeriodSeconds"] = 30
        else:
            if meta.get("deletionTimestamp") and write.grace_period_s == 0:
                self._death()  # a pod stuck Terminating, taken for dead
            self.master = None
        self.running = False

    @rule()
    def reconcile_until_quiet(self) -> None:
        for _ in range(4):
            if self._pass() == 0:
                break
        else:
            raise AssertionError("the reconcile did not settle in 4 passes of an unchanging world")
        self._check_settled()

    def _check_settled(self) -> None:
        status = self.job["status"]
        if self.job["spec"].get("suspend") and not self.ended and self.master is None:
            assert not self.workers
        if self.job["spec"].get("suspend") and status.get("phase") == "Suspended":
            # (A master left Terminating on a lost node is force-deleted only past its grace and the margin.)
            assert self.master is None or self.master["metadata"].get("deletionTimestamp")
            assert not self.workers
        assert self.masters_after_end == 0, "a master was started after the job ended"
        started = status.get(APPLIED_SPEC_STATUS) is not None or check_spec(self.job).spec is not None
        runs = not self.ended and not self.job["spec"].get("suspend") and started
        if runs and status.get("phase") != "Failed":
            assert self.master is not None, status
            assert set(self.objects) == set(_FIELDS)
            port = self.master["spec"]["containers"][0]["ports"][0]["containerPort"]
            live = self.master["status"]["phase"] in ("Pending", "Running")
            if live and not self.master["metadata"].get("deletionTimestamp"):  # (its successor's may differ)
                assert self.objects["Service"]["spec"]["ports"][0]["port"] == port, "the Service misses the master"
            statuses = self.master["status"].get("containerStatuses", [])
            finished = [c["state"]["terminated"].get("finishedAt") for c in statuses]
            # (A pod being deleted is waited for, whatever its container did: two masters never share a journal.)
            if finished and finished[0] and not self.master["metadata"].get("deletionTimestamp"):
                start = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
                since_s = (datetime.datetime.fromisoformat(finished[0]) - start).total_seconds()
                wait_s = SETTINGS.retry_backoff_s(self.last_restarts)
                assert self.clock_s - since_s < wait_s, "a master that could not start was not replaced"
            conditions = self.master["status"].get("conditions", [])
            lost_since = next((c["lastTransitionTime"] for c in conditions if c["status"] == "False"), None)
            if lost_since is not None:
                start = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
                since = (datetime.datetime.fromisoformat(lost_since) - start).total_seconds()
                assert self.clock_s - since <= SETTINGS.master_unready_timeout_s, "a lost master was left in place"
        assert self.last_restarts <= self.deaths
        in_force = status.get(APPLIED_SPEC_STATUS)
        if self.master is not None and in_force is not None:
            assert in_force["replicaSpecs"]["worker"]["maxReplicas"] == self.master_wanted, "a count not recorded"

    @precondition(lambda self: self.previous is not None)
    @rule()
    def reconcile_on_a_stale_view(self) -> None:
        """The caches lag: the decision sees the objects as they were before the last pass's writes."""
        assert self.previous is not None
        self._pass(stale=self.previous)

    @precondition(lambda self: self.master is not None and self.master["status"]["phase"] == "Pending")
    @rule()
    def master_starts(self) -> None:
        assert self.master is not None
        self.master["status"] = {"phase": "Running", "podIP": "127.0.0.9"}
        self.running = not self.ended

    @precondition(lambda self: self.master is not None and self.master["status"]["phase"] == "Running")
    @rule(code=st.sampled_from([137, 143]))
    def master_dies(self, code: int) -> None:
        assert self.master is not None
        self._death()
        self.master["status"] = {
            "phase": "Failed",
            "containerStatuses": [{"name": "master", "state": {"terminated": {"exitCode": code}}}],
        }
        self.running = False

    @precondition(lambda self: self.master is not None)
    @rule()
    def master_deleted(self) -> None:
        self._end_unseen()
        self._death()
        self.master = None
        self.running = False

    def _end_unseen(self) -> None:
        if self.ended and self.job.get("status", {}).get("phase") not in ("Succeeded", "Failed"):
            # The pod that said how the job ended is gone before the operator saw it: nothing tells the
            # operator the job ended, and a replacement master (resuming its journal) says it again.
            self.ended = False

    @precondition(
        lambda self: (
            self.master is not None
            and self.master["status"]["phase"] == "Running"
            and not self.master["status"].get("conditions")
        )
    )
    @rule()
    def masters_node_lost(self) -> None:
        """Its node stops answering: the node lifecycle controller marks it not ready; it stays Running."""
        assert self.master is not None
        self._end_unseen()
        self._death()
        self.master["spec"]["nodeName"] = "node-0"
        self.master["status"]["conditions"] = [{"type": "Ready", "status": "False", "lastTransitionTime": self._now()}]
        self.running = False

    @precondition(
        lambda self: (
            self.master is not None
            and any(c.get("status") == "False" for c in self.master["status"].get("conditions", []))
            and not self.master["metadata"].get("deletionTimestamp")
        )
    )
    @rule()
    def taint_manager_deletes_the_lost_master(self) -> None:
        """A graceful deletion that no kubelet finishes: the pod stays Terminating."""
        assert self.master is not None
        self.master["metadata"]["deletionTimestamp"] = self._now(30)
        self.master["metadata"]["deletionGracePeriodSeconds"] = 30

    @precondition(lambda self: self.master is not None and self.master["status"]["phase"] == "Pending")
    @rule()
    def master_cannot_start_now(self) -> None:
        """It exits 75: another master still holds the state directory (replaced after a backoff)."""
        assert self.master is not None
        self._death()
        terminated = {"exitCode": MASTER_EXIT_RETRY, "reason": "Error", "finishedAt": self._now()}
        self.master["status"] = {"phase": "Failed", "containerStatuses": [{"name": "master", "state": {
            "terminated": terminated}}]}  # fmt: skip

    @precondition(lambda self: self.master is not None and self.master["metadata"].get("deletionTimestamp"))
    @rule()
    def graceful_deletion_ends(self) -> None:
        """The master's kubelet confirms a graceful deletion (the node answers): the pod is gone."""
        self._end_unseen()
        self.master = None
        self.running = False

    @rule(seconds=st.sampled_from([1.0, 60.0, 200.0]))
    def time_passes(self, seconds: float) -> None:
        self.clock_s += seconds

    @precondition(
        lambda self: (
            self.master is not None
            and self.master["status"]["phase"] == "Running"
            and not self.ended
            and not self.master["status"].get("conditions")
        )
    )
    @rule(code=st.sampled_from([0, 1, 3]))
    def job_ends(self, code: int) -> None:
        assert self.master is not None
        self.master["status"] = {
            "phase": "Succeeded" if code == 0 else "Failed",
            "containerStatuses": [{"name": "master", "state": {"terminated": {"exitCode": code}}}],
        }
        self.running = False
        self.ended = True

    @precondition(lambda self: self.master is not None and self.master["status"]["phase"] == "Running")
    @rule()
    def master_launches_a_worker(self) -> None:
        name = f"job1-worker-{len(self.workers)}"
        self.workers[name] = {"metadata": {"name": name, "uid": self._uid()}, "status": {"phase": "Running"}}

    def _edit(self, change: dict[str, Any]) -> None:
        self.job["spec"].update(copy.deepcopy(change))
        self.job["metadata"]["generation"] += 1

    @rule()
    def toggle_suspend(self) -> None:
        self._edit({"suspend": not self.job["spec"].get("suspend", False)})

    @rule(image=st.sampled_from(["dlrover:test", "dlrover:new"]))
    def edit_template(self, image: str) -> None:
        spec = copy.deepcopy(self.job["spec"]["replicaSpecs"])
        spec["worker"]["template"]["spec"]["containers"][0]["image"] = image
        self._edit({"replicaSpecs": spec})

    @rule(port=st.sampled_from([50001, 6000]))
    def edit_master_port(self, port: int) -> None:
        """A field a running job cannot take; a master started after a suspend takes it, and its Service follows."""
        self._edit({"master": {"port": port}})

    @rule(high=st.sampled_from([1, 2, 3]))
    def edit_max_replicas(self, high: int) -> None:
        """Within the running master's range it is carried out (resized); beyond it, refused."""
        spec = copy.deepcopy(self.job["spec"]["replicaSpecs"])
        spec["worker"]["maxReplicas"] = high
        self._edit({"replicaSpecs": spec})

    @rule(broken=st.booleans())
    def edit_validity(self, broken: bool) -> None:
        spec = copy.deepcopy(self.job["spec"]["replicaSpecs"])
        spec["worker"]["minReplicas"] = 3 if broken else 1
        self._edit({"replicaSpecs": spec})

    @invariant()
    def restarts_are_bounded(self) -> None:
        assert self.last_restarts <= MAX_RESTARTS + 1
        assert self.last_restarts <= self.deaths, "a master death counted twice"


def _nnodes(pod: dict[str, Any]) -> tuple[int, int]:
    command = pod["spec"]["containers"][0]["command"]
    low, high = command[command.index("--nnodes") + 1].split(":")
    return int(low), int(high)


# The number of examples comes from the profile (conftest.py: dev, or ci under CI).
TestOperatorMachine = OperatorMachine.TestCase
TestOperatorMachine.settings = settings(TestOperatorMachine.settings, stateful_step_count=30)
