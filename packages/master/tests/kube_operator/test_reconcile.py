"""The operator's pure decision: what it creates, refuses, replaces and mirrors."""

from __future__ import annotations

import base64
import copy
import json
from typing import Any

import attrs
import pytest
from ej_builders import TOKEN, created, edited, elastic_job, observed_after, pod_phase, summary, with_status

from dlrover.master.kube.names import COMPONENT_LABEL, JOB_LABEL, MANAGED_BY_LABEL
from dlrover.master.operator import (
    APPLIED_SPEC_STATUS,
    MASTER_EXIT_RETRY,
    MASTER_ROLE_RULES,
    Condition,
    CreateObject,
    DeleteObject,
    MasterSettings,
    Observed,
    ReconcileSettings,
    Reconciliation,
    ResizeJob,
    UpdateObject,
    reconcile,
)
from dlrover.master.operator.objects import serves_tls
from dlrover.master.operator.schema import STATUS_SCHEMA, schema_errors
from dlrover.master.states import JobState

SETTINGS = ReconcileSettings(master=MasterSettings(image="dlrover:test"), max_master_restarts=2)


def run(
    job: dict[str, Any], observed: Observed | None = None, settings: ReconcileSettings = SETTINGS
) -> Reconciliation:
    answer = reconcile(job, observed or Observed(), settings, now="2026-01-01T00:00:00Z", new_token=TOKEN)
    assert schema_errors(STATUS_SCHEMA, dict(answer.status), "status") == []
    return answer


def condition(answer: Reconciliation, kind: str) -> dict[str, Any]:
    found = [c for c in answer.status.get("conditions", []) if c["type"] == kind]
    assert found, (kind, answer.status)
    return dict(found[0])


def running(job: dict[str, Any]) -> tuple[dict[str, Any], Observed]:
    """A job whose objects exist and whose master runs and answered its status."""
    first = run(job)
    observed = observed_after(first)
    assert observed.master_pod is not None
    observed = observed_after(first, master_pod=pod_phase(observed.master_pod, "Running"), summary=summary())
    answer = run(with_status(job, first), observed)
    return with_status(job, answer), observed


def test_a_new_job_gets_its_objects_all_owned_by_it() -> None:
    job = elastic_job()
    answer = run(job)
    kinds = [w.kind for w in answer.writes if isinstance(w, CreateObject)]
    assert sorted(kinds) == ["Pod", "Role", "RoleBinding", "Secret", "Service", "ServiceAccount"]
    for write in answer.writes:
        assert isinstance(write, CreateObject)
        meta = write.obj["metadata"]
        assert meta["namespace"] == "default"
        assert meta["ownerReferences"] == [
            {
                "apiVersion": "elastic.dlrover.io/v1alpha1",
                "kind": "ElasticJob",
                "name": "job1",
                "uid": "uid-job1",
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ]
        assert meta["labels"] == {MANAGED_BY_LABEL: "dlrover", JOB_LABEL: "job1", COMPONENT_LABEL: "master"}
    assert base64.b64decode(created(answer, "Secret")["data"]["token"]).decode() == TOKEN
    assert created(answer, "Role")["rules"] == [r.as_policy_rule() for r in MASTER_ROLE_RULES]
    service = created(answer, "Service")
    assert service["spec"]["ports"] == [{"name": "grpc", "port": 50001, "targetPort": 50001, "protocol": "TCP"}]
    assert service["spec"]["selector"] == created(answer, "Pod")["metadata"]["labels"]
    assert answer.status["phase"] == "Pending"
    assert condition(answer, Condition.MASTER_READY)["reason"] == "MasterStarting"


def test_the_master_pod_runs_the_kubernetes_backend_with_flags_from_the_spec() -> None:
    job = elastic_job(
        rendezvous={"joinTimeoutSeconds": 120, "lastCallSeconds": 2.5},
        timeouts={"nodePendingSeconds": 90, "heartbeatSeconds": 12, "nodeStartSeconds": 0},
        master={
            "port": 6000,
            "image": "mine:1",
            "tls": {"secretName": "tls", "caKey": "ca.crt"},
            "stateVolume": {"persistentVolumeClaim": {"claimName": "st"}},
        },
    )
    job["spec"]["replicaSpecs"]["worker"]["resources"] = {"cpu": "500m", "memory": "4Gi", "nvidia.com/gpu": 1}
    job["spec"]["replicaSpecs"]["worker"]["spareReplicas"] = 1
    pod = created(run(job, Observed(claims=frozenset({"st"}), secrets=frozenset({"tls"}))), "Pod")
    container = pod["spec"]["containers"][0]
    command = container["command"]
    flags = dict(zip(command[1::2], command[2::2], strict=False))
    assert command[0] == "dlrover-master"
    assert flags["--backend"] == "kubernetes"
    assert flags["--kube-namespace"] == "default"
    assert flags["--kube-job"] == "job1"
    assert flags["--bind-address"] == "0.0.0.0"
    assert flags["--port"] == "6000"
    assert flags["--state-dir"] == "/var/lib/dlrover/journal"
    assert flags["--nnodes"] == "1:2"
    assert flags["--node-cpu"] == "0.5"
    assert flags["--node-memory"] == "4Gi"
    assert flags["--node-gpus"] == "1"
    assert flags["--rdzv-join-timeout-s"] == "120"
    assert flags["--rdzv-last-call-s"] == "2.5"
    assert flags["--node-pending-timeout-s"] == "90"
    assert flags["--node-start-timeout-s"] == "0"
    assert flags["--heartbeat-timeout-s"] == "12"
    assert flags["--heartbeat-interval-s"] == "4"
    assert flags["--tls-cert"] == "/etc/dlrover/tls/tls.crt"
    assert flags["--tls-key"] == "/etc/dlrover/tls/tls.key"
    # Workers verify the master with the same Secret's CA key (mounted by the master's backend).
    assert flags["--kube-tls-secret"] == "tls"
    assert flags["--kube-tls-ca-key"] == "ca.crt"
    assert flags["--spare-nodes"] == "1"
    assert container["image"] == "mine:1"
    assert container["env"] == [
        {"name": "DLROVER_JOB_TOKEN", "valueFrom": {"secretKeyRef": {"name": "job1-token", "key": "token"}}}
    ]
    assert pod["spec"]["serviceAccountName"] == "job1-master"
    assert pod["spec"]["restartPolicy"] == "Never"
    assert {"name": "state", "persistentVolumeClaim": {"claimName": "st"}} in pod["spec"]["volumes"]
    assert {"name": "tls", "secret": {"secretName": "tls"}} in pod["spec"]["volumes"]


def test_a_job_without_counts_leaves_them_to_the_masters_plan() -> None:
    job = elastic_job()
    job["spec"]["replicaSpecs"]["worker"] = {"template": job["spec"]["replicaSpecs"]["worker"]["template"]}
    command = created(run(job), "Pod")["spec"]["containers"][0]["command"]
    assert "--nnodes" not in command
    assert "--node-memory" not in command
    assert "--spare-nodes" not in command
    assert created(run(job), "Pod")["spec"]["volumes"][0] == {"name": "state", "emptyDir": {}}


def test_a_second_pass_over_what_the_first_created_writes_nothing() -> None:
    job = elastic_job()
    first = run(job)
    second = run(with_status(job, first), observed_after(first))
    assert second.writes == ()
    assert second.status["phase"] == "Pending"


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"replicaSpecs": {"worker": {"template": {"spec": {"containers": []}}}}}, "template.spec.containers"),
        ({"replicaSpecs": {"worker": {"template": {"metadata": {}}}}}, "template.spec.containers"),
        (
            {"replicaSpecs": {"worker": {"template": {"spec": {"containers": [{"name": "main", "image": "x"}]}}}}},
            "needs a command",
        ),
        (
            {
                "replicaSpecs": {
                    "worker": {
                        "template": {"spec": {"containers": [{"name": "m", "command": ["a"]}]}},
                        "minReplicas": 4,
                        "maxReplicas": 2,
                    }
                }
            },
            "minReplicas (4) exceeds maxReplicas (2)",
        ),
        ({"rendezvous": {"minNodes": 3, "maxNodes": 1}}, "spec.rendezvous.minNodes (3) exceeds maxNodes (1)"),
        ({"rendezvous": {"minNodes": 2}}, "spec.rendezvous.minNodes (2) differs"),
        (
            {"checkpoint": {"volume": {"persistentVolumeClaim": {"claimName": "gone"}}}},
            "spec.checkpoint.volume: PersistentVolumeClaim 'gone' not found",
        ),
        (
            {"checkpoint": {"objectStore": {"uri": "s3://b/p", "secretName": "creds"}}},
            "spec.checkpoint.objectStore.secretName: Secret 'creds' not found",
        ),
        ({"master": {"tls": {"secretName": "tls"}}}, "spec.master.tls.secretName: Secret 'tls' not found"),
        (
            {"master": {"stateVolume": {"persistentVolumeClaim": {"claimName": "st"}}}},
            "spec.master.stateVolume: PersistentVolumeClaim 'st'",
        ),
        ({"master": {"port": 70000}}, "spec.master.port: must be at most 65535"),
        ({"replicaSpecs": {"ps": {"template": {}}}}, "missing required field 'worker'"),
    ],
)
def test_bad_input_fails_the_job_naming_the_field_and_creates_nothing(change: dict[str, Any], field: str) -> None:
    job = edited(elastic_job(), change)
    answer = run(job)
    assert answer.writes == ()
    failed = condition(answer, Condition.FAILED)
    assert failed["status"] == "True"
    assert field in failed["message"], failed["message"]
    assert answer.status["phase"] == "Failed"


def test_a_fixed_spec_clears_the_failure_and_starts_the_job() -> None:
    bad = elastic_job(checkpoint={"volume": {"persistentVolumeClaim": {"claimName": "ckpt"}}})
    answer = run(bad)
    assert condition(answer, Condition.FAILED)["reason"] == "StorageNotFound"
    later = run(with_status(bad, answer), Observed(claims=frozenset({"ckpt"})))
    assert condition(later, Condition.FAILED)["status"] == "False"
    assert any(isinstance(w, CreateObject) and w.kind == "Pod" for w in later.writes)


def test_a_running_job_mirrors_its_masters_status() -> None:
    job, observed = running(elastic_job())
    answer = run(job, observed)
    status = answer.status
    assert status["phase"] == "Running"
    assert status["nodes"] == {"pending": 0, "running": 2, "succeeded": 0, "failed": 0}
    assert status["restarts"] == 2
    assert status["relaunches"] == 3
    assert status["goodput"] == 0.9
    assert status["masterAddress"] == "127.0.0.5:50001"
    assert condition(answer, Condition.MASTER_READY)["status"] == "True"
    assert answer.writes == ()


def test_an_edit_a_running_job_cannot_take_is_refused_and_the_job_runs_on() -> None:
    job, observed = running(elastic_job())
    changed = edited(
        job,
        {
            "replicaSpecs": {
                "worker": {
                    "template": {"spec": {"containers": [{"name": "main", "image": "new", "command": ["x"]}]}},
                    "minReplicas": 1,
                    "maxReplicas": 2,
                }
            }
        },
    )
    answer = run(changed, observed)
    assert answer.writes == ()
    refused = condition(answer, Condition.SPEC_CHANGE_REFUSED)
    assert refused["status"] == "True"
    assert "spec.replicaSpecs.worker.template" in refused["message"]
    assert answer.status["phase"] == "Running"
    # Putting the spec back clears the refusal.
    back = run(with_status(job, answer), observed)
    assert condition(back, Condition.SPEC_CHANGE_REFUSED)["status"] == "False"


def test_an_invalid_edit_of_a_running_job_is_refused_not_failed() -> None:
    job, observed = running(elastic_job())
    changed = edited(job, {"replicaSpecs": {"worker": {"template": {"spec": {"containers": []}}}}})
    answer = run(changed, observed)
    assert answer.writes == ()
    assert "no container" in condition(answer, Condition.SPEC_CHANGE_REFUSED)["message"]
    assert answer.status["phase"] == "Running"
    assert not [c for c in answer.status["conditions"] if c["type"] == Condition.FAILED and c["status"] == "True"]


def test_a_new_max_within_the_masters_range_is_carried_out_by_a_resize() -> None:
    job, observed = running(elastic_job())
    observed = observed_after(Reconciliation((), {}, ""), observed, summary=summary(max_nodes=4, running=2, wanted=4))
    job["spec"]["replicaSpecs"]["worker"]["maxReplicas"] = 4
    changed = edited(job, {})
    changed["spec"]["replicaSpecs"]["worker"]["maxReplicas"] = 3
    answer = run(changed, observed)
    assert answer.writes == (ResizeJob(3, "spec.replicaSpecs.worker.maxReplicas is 3"),)
    # Once the master says it wants 3, nothing more.
    done = observed_after(Reconciliation((), {}, ""), observed, summary=summary(max_nodes=4, running=2, wanted=3))
    assert run(with_status(changed, answer), done).writes == ()


def test_the_masters_own_resizes_are_not_undone() -> None:
    # The master's autoscaler (or `dlrover-master scale`) took the job to 1 of its 2: no edit, no resize.
    job, observed = running(elastic_job())
    scaled = observed_after(Reconciliation((), {}, ""), observed, summary=summary(max_nodes=2, running=1, wanted=1))
    assert not [w for w in run(job, scaled).writes if isinstance(w, ResizeJob)]
    # An edit of maxReplicas is carried out once; the master's later resizes are its own again.
    full = observed_after(Reconciliation((), {}, ""), observed, summary=summary(max_nodes=2, running=2, wanted=2))
    edit = edited(job, {})
    edit["spec"]["replicaSpecs"]["worker"]["maxReplicas"] = 1
    first = run(edit, full)
    assert first.writes == (ResizeJob(1, "spec.replicaSpecs.worker.maxReplicas is 1"),)
    assert first.status[APPLIED_SPEC_STATUS]["replicaSpecs"]["worker"]["maxReplicas"] == 1
    # A pass that still shows the master at 2 (its answer not yet in) after the edit was applied: no second resize.
    assert not [w for w in run(with_status(edit, first), full).writes if isinstance(w, ResizeJob)]


def test_a_range_beyond_the_masters_is_refused() -> None:
    job, observed = running(elastic_job())
    job["spec"]["replicaSpecs"]["worker"]["maxReplicas"] = 8
    answer = run(edited(job, {}), observed)
    assert answer.writes == ()
    assert "1..8 is not the master's 1..2" in condition(answer, Condition.SPEC_CHANGE_REFUSED)["message"]


def test_suspend_deletes_the_master_and_the_workers_and_resume_brings_the_master_back() -> None:
    job, observed = running(elastic_job())
    worker = {"metadata": {"name": "job1-worker-0", "uid": "w0", "labels": {}}, "status": {"phase": "Running"}}
    observed = observed_after(Reconciliation((), {}, ""), observed, worker_pods=(worker,))
    suspended = edited(job, {"suspend": True})
    answer = run(suspended, observed)
    assert answer.writes == (
        DeleteObject("Pod", "job1-master", "the job is suspended", None, "uid-Pod-job1-master"),
        DeleteObject("Pod", "job1-worker-0", "the job is suspended", None, "w0"),
    )
    assert answer.status["phase"] == "Suspended"
    assert condition(answer, Condition.SUSPENDED)["status"] == "True"
    gone = observed_after(Reconciliation((), {}, ""), observed, master_pod=None, worker_pods=(), summary=None)
    assert run(with_status(suspended, answer), gone).writes == ()
    resumed = edited(with_status(suspended, answer), {"suspend": False})
    again = run(resumed, gone)
    assert [w.kind for w in again.writes] == ["Pod"]
    assert again.status["masterRestarts"] == 0
    assert condition(again, Condition.SUSPENDED)["status"] == "False"


@pytest.mark.parametrize(("code", "reason"), [(137, "OOMKilled"), (143, "Error"), (None, "Evicted"), (1, "OOMKilled")])
def test_a_master_that_died_is_replaced(code: int | None, reason: str) -> None:
    job, observed = running(elastic_job())
    assert observed.master_pod is not None
    dead = observed_after(
        Reconciliation((), {}, ""),
        observed,
        master_pod=pod_phase(observed.master_pod, "Failed", exit_code=code, reason=reason),
        summary=None,
    )
    answer = run(job, dead)
    assert answer.writes == (DeleteObject("Pod", "job1-master", answer.writes[0].reason, 0, "uid-Pod-job1-master"),)
    assert answer.status["masterRestarts"] == 1
    assert condition(answer, Condition.MASTER_READY)["reason"] == "MasterDied"
    # Seen again before its deletion shows: deleted again, not counted again.
    again = run(with_status(job, answer), dead)
    assert [type(w) for w in again.writes] == [DeleteObject]
    assert again.status["masterRestarts"] == 1
    gone = observed_after(Reconciliation((), {}, ""), observed, master_pod=None, summary=None)
    replaced = run(with_status(job, answer), gone)
    assert [w.kind for w in replaced.writes] == ["Pod"]
    assert replaced.status["masterRestarts"] == 1  # counted once
    assert "starts the job afresh" in condition(replaced, Condition.MASTER_READY)["message"]


def test_a_master_deleted_while_ready_is_replaced_and_counted() -> None:
    job, observed = running(elastic_job())
    gone = observed_after(Reconciliation((), {}, ""), observed, master_pod=None, summary=None)
    answer = run(job, gone)
    assert [w.kind for w in answer.writes] == ["Pod"]
    assert answer.status["masterRestarts"] == 1


def test_a_master_seen_terminating_after_someone_deleted_it_is_counted_once() -> None:
    """The operator may look while a graceful deletion runs: the restart is counted then (the ready
    condition it would be counted by turns false there), and not again when the pod is gone."""
    job, observed = running(elastic_job())
    pod = json.loads(json.dumps(observed.master_pod))
    pod["metadata"]["deletionTimestamp"] = "2026-01-01T00:10:30Z"
    terminating = observed_after(Reconciliation((), {}, ""), observed, master_pod=pod, summary=None)
    seen = run(job, terminating)
    assert seen.writes == ()
    assert seen.status["masterRestarts"] == 1
    assert condition(seen, Condition.MASTER_READY)["reason"] == "MasterTerminating"
    assert run(with_status(job, seen), terminating).status["masterRestarts"] == 1  # seen again: not again
    gone = observed_after(Reconciliation((), {}, ""), observed, master_pod=None, summary=None)
    replaced = run(with_status(job, seen), gone)
    assert [w.kind for w in replaced.writes] == ["Pod"]
    assert replaced.status["masterRestarts"] == 1
    assert "replacement 1 of the master" in condition(replaced, Condition.MASTER_READY)["message"]


def _at(now: str, job: dict[str, Any], observed: Observed) -> Reconciliation:
    answer = reconcile(job, observed, SETTINGS, now=now, new_token=TOKEN)
    assert schema_errors(STATUS_SCHEMA, dict(answer.status), "status") == []
    return answer


def _not_ready_since(pod: dict[str, Any], since: str) -> dict[str, Any]:
    """As the node lifecycle controller leaves a pod of a node that stopped answering: Running, Ready=False."""
    out = pod_phase(pod, "Running")
    out["spec"]["nodeName"] = "node-0"
    out["status"]["conditions"] = [{"type": "Ready", "status": "False", "lastTransitionTime": since}]
    return out


def _terminating_until(pod: dict[str, Any], deletion: str) -> dict[str, Any]:
    """As the taint manager leaves it: a graceful deletion no kubelet finishes (deletionTimestamp: its end)."""
    out = _not_ready_since(pod, "2026-01-01T00:04:00Z")
    out["metadata"]["deletionTimestamp"] = deletion
    out["metadata"]["deletionGracePeriodSeconds"] = 30
    return out


def test_a_master_not_ready_past_the_timeout_is_force_deleted_and_replaced_once() -> None:
    job, observed = running(elastic_job())
    assert observed.master_pod is not None
    assert SETTINGS.master_unready_timeout_s == 120
    lost = attrs.evolve(observed, master_pod=_not_ready_since(observed.master_pod, "2026-01-01T00:00:00Z"))
    # Within the timeout: a node that may come back; nothing is written.
    early = _at("2026-01-01T00:02:00Z", job, lost)
    assert [w for w in early.writes if isinstance(w, DeleteObject)] == []
    assert early.status["masterRestarts"] == 0
    answer = _at("2026-01-01T00:02:01Z", job, lost)
    assert answer.writes == (DeleteObject("Pod", "job1-master", answer.writes[0].reason, 0, "uid-Pod-job1-master"),)
    assert "not been ready since 2026-01-01T00:00:00Z" in answer.writes[0].reason
    assert answer.status["masterRestarts"] == 1
    assert condition(answer, Condition.MASTER_READY)["reason"] == "MasterLost"
    # Seen again while the force delete shows: deleted again, not counted again; then replaced.
    again = _at("2026-01-01T00:02:02Z", with_status(job, answer), lost)
    assert [type(w) for w in again.writes] == [DeleteObject]
    assert again.status["masterRestarts"] == 1
    gone = attrs.evolve(observed, master_pod=None, summary=None)
    replaced = _at("2026-01-01T00:02:03Z", with_status(job, again), gone)
    assert [w.kind for w in replaced.writes if isinstance(w, CreateObject)] == ["Pod"]
    assert replaced.status["masterRestarts"] == 1


def test_a_master_left_terminating_past_its_grace_and_the_margin_is_force_deleted() -> None:
    job, observed = running(elastic_job())
    assert observed.master_pod is not None
    assert SETTINGS.master_terminating_margin_s == 30
    stuck = attrs.evolve(observed, master_pod=_terminating_until(observed.master_pod, "2026-01-01T00:05:00Z"))
    # Before its deletion time plus the margin: waited for (a live kubelet finishes it), not counted.
    waiting = _at("2026-01-01T00:05:30Z", job, stuck)
    assert waiting.writes == ()
    assert condition(waiting, Condition.MASTER_READY)["reason"] == "MasterTerminating"
    answer = _at("2026-01-01T00:05:31Z", job, stuck)
    assert answer.writes == (DeleteObject("Pod", "job1-master", answer.writes[0].reason, 0, "uid-Pod-job1-master"),)
    assert "Terminating since 2026-01-01T00:05:00Z" in answer.writes[0].reason
    assert answer.status["masterRestarts"] == 1
    assert condition(answer, Condition.MASTER_READY)["reason"] == "MasterLost"
    # Deleted with a long grace on a node lost long before: not ready past the timeout decides first.
    long_grace = attrs.evolve(observed, master_pod=_terminating_until(observed.master_pod, "2026-01-01T01:00:00Z"))
    assert "not been ready since" in _at("2026-01-01T00:06:01Z", job, long_grace).writes[0].reason


def test_a_ready_master_and_an_unreadable_time_are_never_taken_for_lost() -> None:
    job, observed = running(elastic_job())
    assert observed.master_pod is not None
    ready = _not_ready_since(observed.master_pod, "2026-01-01T00:00:00Z")
    ready["status"]["conditions"][0]["status"] = "True"
    assert _at("2027-01-01T00:00:00Z", job, attrs.evolve(observed, master_pod=ready)).writes == ()
    unready = attrs.evolve(observed, master_pod=_not_ready_since(observed.master_pod, "not a time"))
    assert _at("2027-01-01T00:00:00Z", job, unready).writes == ()
    assert _at("not a time", job, attrs.evolve(observed, master_pod=ready)).writes == ()


def test_a_suspended_jobs_master_stuck_terminating_on_a_lost_node_is_force_deleted() -> None:
    job, observed = running(elastic_job())
    assert observed.master_pod is not None
    suspended = edited(job, {"suspend": True})
    stuck = attrs.evolve(observed, master_pod=_terminating_until(observed.master_pod, "2026-01-01T00:05:00Z"))
    assert _at("2026-01-01T00:05:00Z", suspended, stuck).writes == ()
    answer = _at("2026-01-01T00:06:00Z", suspended, stuck)
    assert [(w.name, w.grace_period_s) for w in answer.writes if isinstance(w, DeleteObject)] == [("job1-master", 0)]
    assert answer.status["masterRestarts"] == 0  # a suspend, not a death


def test_the_lost_master_timeouts_are_validated() -> None:
    with pytest.raises(ValueError, match="master_unready_timeout_s"):
        ReconcileSettings(master_unready_timeout_s=0)
    with pytest.raises(ValueError, match="master_terminating_margin_s"):
        ReconcileSettings(master_terminating_margin_s=-1)


def _could_not_start(pod: dict[str, Any], finished: str) -> dict[str, Any]:
    out = pod_phase(pod, "Failed", exit_code=MASTER_EXIT_RETRY)
    out["status"]["containerStatuses"][0]["state"]["terminated"]["finishedAt"] = finished
    return out


def test_a_master_that_could_not_start_now_is_replaced_after_a_doubling_backoff_counted_once() -> None:
    job, observed = running(elastic_job())
    assert observed.master_pod is not None
    assert (SETTINGS.master_retry_backoff_s, SETTINGS.master_retry_backoff_max_s) == (5.0, 300.0)
    failed = attrs.evolve(
        observed, master_pod=_could_not_start(observed.master_pod, "2026-01-01T00:00:00Z"), summary=None
    )
    waiting = _at("2026-01-01T00:00:04Z", job, failed)
    assert waiting.writes == ()  # within the first backoff (5 s): the pod stays, nothing is written
    assert waiting.status["masterRestarts"] == 1
    assert condition(waiting, Condition.MASTER_READY)["reason"] == "MasterRetrying"
    assert waiting.status.get("phase") != "Failed"
    again = _at("2026-01-01T00:00:04Z", with_status(job, waiting), failed)
    assert again.status["masterRestarts"] == 1  # counted once however often it is seen
    due = _at("2026-01-01T00:00:06Z", with_status(job, again), failed)
    assert due.writes == (DeleteObject("Pod", "job1-master", due.writes[0].reason, 0, "uid-Pod-job1-master"),)
    assert due.status["masterRestarts"] == 1
    gone = attrs.evolve(observed, master_pod=None, summary=None)
    replaced = _at("2026-01-01T00:00:07Z", with_status(job, due), gone)
    assert [w.kind for w in replaced.writes if isinstance(w, CreateObject)] == ["Pod"]
    assert replaced.status["masterRestarts"] == 1
    # The replacement (another pod: another uid) could not start either: the second backoff is 10 s.
    replacement = _could_not_start(observed.master_pod, "2026-01-01T00:01:00Z")
    replacement["metadata"]["uid"] = "uid-Pod-job1-master-2"
    second = attrs.evolve(failed, master_pod=replacement)
    held = _at("2026-01-01T00:01:09Z", with_status(job, replaced), second)
    assert held.writes == ()
    assert held.status["masterRestarts"] == 2
    assert "backoff of 10 s" in condition(held, Condition.MASTER_READY)["message"]
    assert [type(w) for w in _at("2026-01-01T00:01:11Z", with_status(job, held), second).writes] == [DeleteObject]


def test_the_retry_backoff_doubles_up_to_its_maximum() -> None:
    settings = ReconcileSettings(master_retry_backoff_s=5, master_retry_backoff_max_s=30)
    assert [settings.retry_backoff_s(n) for n in (0, 1, 2, 3, 4, 9)] == [5, 5, 10, 20, 30, 30]


def test_retries_of_a_master_that_cannot_start_are_bounded_by_the_restart_budget() -> None:
    job, observed = running(elastic_job())
    assert observed.master_pod is not None
    job["status"]["masterRestarts"] = SETTINGS.max_master_restarts
    failed = attrs.evolve(
        observed, master_pod=_could_not_start(observed.master_pod, "2026-01-01T00:00:00Z"), summary=None
    )
    due = _at("2026-01-01T01:00:00Z", job, failed)
    assert [type(w) for w in due.writes] == [DeleteObject]
    gone = attrs.evolve(observed, master_pod=None, summary=None)
    ended = _at("2026-01-01T01:00:01Z", with_status(job, due), gone)
    assert ended.writes == ()
    assert condition(ended, Condition.FAILED)["reason"] == "MasterRestartsExhausted"


def test_a_master_dying_past_its_budget_fails_the_job() -> None:
    job, observed = running(elastic_job())
    job["status"]["masterRestarts"] = 2
    gone = observed_after(Reconciliation((), {}, ""), observed, master_pod=None, summary=None)
    answer = run(job, gone)
    assert answer.writes == ()
    assert condition(answer, Condition.FAILED)["reason"] == "MasterRestartsExhausted"
    assert run(with_status(job, answer), gone).writes == ()


@pytest.mark.parametrize(
    ("code", "phase", "reason"),
    [
        (0, "Succeeded", "JobSucceeded"),
        (1, "Failed", "JobFailed"),
        (3, "Failed", "JobStopped"),
        (2, "Failed", "MasterFailed"),
    ],
)
def test_a_master_that_exited_with_the_jobs_end_is_not_replaced(code: int, phase: str, reason: str) -> None:
    job, observed = running(elastic_job())
    assert observed.master_pod is not None
    pod_state = "Succeeded" if code == 0 else "Failed"
    ended = observed_after(
        Reconciliation((), {}, ""),
        observed,
        master_pod=pod_phase(observed.master_pod, pod_state, exit_code=code),
        summary=None,
    )
    answer = run(job, ended)
    assert answer.writes == ()
    assert answer.status["phase"] == phase
    kind = Condition.SUCCEEDED if code == 0 else Condition.FAILED
    assert condition(answer, kind)["reason"] == reason
    gone = observed_after(Reconciliation((), {}, ""), observed, master_pod=None, summary=None)
    assert run(with_status(job, answer), gone).writes == ()


def test_the_masters_last_word_decides_how_the_job_ended() -> None:
    job, observed = running(elastic_job())
    finished = observed_after(Reconciliation((), {}, ""), observed, summary=summary(JobState.SUCCEEDED))
    answer = run(job, finished)
    assert answer.status["phase"] == "Succeeded"
    assert condition(answer, Condition.SUCCEEDED)["status"] == "True"
    assert answer.writes == ()


def test_a_job_being_deleted_gets_no_writes() -> None:
    job = elastic_job()
    job["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    answer = run(job)
    assert answer.writes == ()
    assert "being deleted" in answer.reason


def test_a_condition_keeps_its_transition_time_while_its_status_holds() -> None:
    job = elastic_job()
    first = run(job)
    later = reconcile(
        with_status(job, first), observed_after(first), SETTINGS, now="2026-01-02T00:00:00Z", new_token=TOKEN
    )
    ready = next(c for c in later.status["conditions"] if c["type"] == Condition.MASTER_READY)
    assert ready["lastTransitionTime"] == "2026-01-01T00:00:00Z"


def test_the_default_tls_secret_turns_tls_on_and_must_exist() -> None:
    settings = ReconcileSettings(master=MasterSettings(tls_secret="site-tls"))
    job = elastic_job()
    assert (
        "--master-tls-secret: Secret 'site-tls' not found"
        in condition(run(job, settings=settings), Condition.FAILED)["message"]
    )
    pod = created(run(job, Observed(secrets=frozenset({"site-tls"})), settings), "Pod")
    assert "--tls-cert" in pod["spec"]["containers"][0]["command"]
    assert json.loads(pod["metadata"]["annotations"]["elastic.dlrover.io/applied-spec"])["replicaSpecs"][
        "worker"
    ].keys() == {"template"}


def test_a_lagging_view_of_a_master_pod_already_counted_or_deleted_on_suspend_counts_nothing_again() -> None:
    # Found by the state machine: a view that lags shows a pod whose end was counted, or one the operator deleted
    # to suspend the job, after the suspension was lifted; neither is another restart.
    job, observed = running(elastic_job())
    assert observed.master_pod is not None
    dead = attrs.evolve(observed, master_pod=pod_phase(observed.master_pod, "Failed", exit_code=137), summary=None)
    counted = _at("2026-01-01T00:00:01Z", job, dead)
    assert counted.status["masterRestarts"] == 1
    suspended = edited(with_status(job, counted), {"suspend": True})
    paused = _at("2026-01-01T00:00:02Z", suspended, dead)
    resumed = edited(with_status(suspended, paused), {"suspend": False})
    again = _at("2026-01-01T00:01:00Z", resumed, dead)
    assert again.status["masterRestarts"] == 1
    # A master deleted (gracefully) to suspend the job, then seen Terminating long past its grace by a lagging view.
    job, observed = running(elastic_job())
    assert observed.master_pod is not None
    suspended = edited(job, {"suspend": True})
    paused = _at("2026-01-01T00:00:02Z", suspended, observed)
    assert [type(w) for w in paused.writes] == [DeleteObject]
    terminating = copy.deepcopy(observed.master_pod)
    terminating["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:32Z"
    resumed = edited(with_status(suspended, paused), {"suspend": False})
    late = _at("2026-01-01T00:05:00Z", resumed, attrs.evolve(observed, master_pod=terminating, summary=None))
    assert [type(w) for w in late.writes] == [DeleteObject], "force-deleted: its node does not confirm"
    assert late.status["masterRestarts"] == 0


def _master_gone(observed: Observed) -> Observed:
    return observed_after(Reconciliation((), {}, ""), observed, master_pod=None, summary=None)


def _image(pod: dict[str, Any]) -> str:
    template = json.loads(pod["metadata"]["annotations"]["elastic.dlrover.io/applied-spec"])
    return str(template["replicaSpecs"]["worker"]["template"]["spec"]["containers"][0]["image"])


def test_a_running_job_with_an_invalid_edit_still_mirrors_and_replaces_its_master_from_the_spec_in_force() -> None:
    job, observed = running(elastic_job())
    broken = edited(job, {"replicaSpecs": {"worker": {"template": {"spec": {"containers": []}}, "minReplicas": 1}}})
    # The master still answers: mirrored, the refusal shown.
    watched = run(broken, observed_after(Reconciliation((), {}, ""), observed, summary=summary(goodput=0.5)))
    assert watched.writes == ()
    assert watched.status["goodput"] == 0.5
    refused = condition(watched, Condition.SPEC_CHANGE_REFUSED)
    assert (refused["status"], refused["reason"]) == ("True", "InvalidSpec")
    # It is deleted: replaced from the spec it was started with, the refusal standing.
    replaced = run(with_status(broken, watched), _master_gone(observed))
    pod = created(replaced, "Pod")
    assert _image(pod) == "dlrover:test"
    assert replaced.status["masterRestarts"] == 1
    assert condition(replaced, Condition.SPEC_CHANGE_REFUSED)["status"] == "True"
    assert replaced.status["appliedSpec"] == job["spec"]
    # Fixing the spec clears the refusal; the job runs on.
    fixed = edited(with_status(broken, replaced), {"replicaSpecs": job["spec"]["replicaSpecs"]})
    after = run(fixed, observed_after(replaced, observed, summary=summary()))
    assert condition(after, Condition.SPEC_CHANGE_REFUSED)["status"] == "False"


def test_a_master_replaced_while_an_edit_is_refused_does_not_take_the_edit() -> None:
    job, observed = running(elastic_job())
    new_template = {"spec": {"containers": [{"name": "main", "image": "new", "command": ["x"]}]}}
    changed = edited(job, {"replicaSpecs": {"worker": {"template": new_template, "minReplicas": 1, "maxReplicas": 2}}})
    refused = run(changed, observed)
    assert condition(refused, Condition.SPEC_CHANGE_REFUSED)["status"] == "True"
    replaced = run(with_status(changed, refused), _master_gone(observed))
    assert _image(created(replaced, "Pod")) == "dlrover:test"
    assert "spec.replicaSpecs.worker.template" in condition(replaced, Condition.SPEC_CHANGE_REFUSED)["message"]
    # Suspending ends the spec in force: the resumed master takes the edit.
    suspended = edited(with_status(changed, replaced), {"suspend": True})
    pause = run(suspended, _master_gone(observed))
    assert "appliedSpec" not in pause.status
    resumed = run(edited(with_status(suspended, pause), {"suspend": False}), _master_gone(observed))
    assert _image(created(resumed, "Pod")) == "new"
    assert condition(resumed, Condition.SPEC_CHANGE_REFUSED)["status"] == "False"


def test_a_node_count_carried_out_is_kept_in_the_spec_in_force() -> None:
    job, observed = running(elastic_job())
    observed = observed_after(Reconciliation((), {}, ""), observed, summary=summary(max_nodes=2, running=2, wanted=2))
    smaller = edited(job, {})
    smaller["spec"]["replicaSpecs"]["worker"]["maxReplicas"] = 1
    answer = run(smaller, observed)
    assert answer.writes == (ResizeJob(1, "spec.replicaSpecs.worker.maxReplicas is 1"),)
    assert answer.status["appliedSpec"]["replicaSpecs"]["worker"]["maxReplicas"] == 1


def test_a_resumed_job_brings_its_service_and_role_to_the_spec_it_resumes_with() -> None:
    job, observed = running(elastic_job())
    suspended = edited(job, {"suspend": True})
    pause = run(suspended, observed)
    gone = _master_gone(observed)
    pause = run(with_status(suspended, pause), gone)
    resumed = edited(with_status(suspended, pause), {"suspend": False, "master": {"port": 6000}})
    assert observed.service is not None
    service = copy.deepcopy(dict(observed.service))
    service["metadata"]["resourceVersion"] = "7"
    answer = run(resumed, attrs.evolve(gone, service=service))
    updates = [w for w in answer.writes if isinstance(w, UpdateObject)]
    assert [(w.kind, w.obj["metadata"]["resourceVersion"]) for w in updates] == [("Service", "7")]
    assert updates[0].obj["spec"]["ports"][0]["port"] == 6000
    assert updates[0].obj["metadata"]["uid"] == service["metadata"]["uid"]
    pod = created(answer, "Pod")
    assert pod["spec"]["containers"][0]["ports"][0]["containerPort"] == 6000
    # Once updated, nothing more.
    again = run(with_status(resumed, answer), attrs.evolve(gone, service=dict(updates[0].obj), master_pod=pod))
    assert not [w for w in again.writes if isinstance(w, UpdateObject)]


def test_a_role_with_other_rules_is_brought_to_the_masters() -> None:
    job, observed = running(elastic_job())
    assert observed.role is not None
    stale = copy.deepcopy(dict(observed.role))
    stale["rules"] = stale["rules"][:1]
    answer = run(job, attrs.evolve(observed, role=stale))
    (update,) = answer.writes
    assert isinstance(update, UpdateObject)
    assert update.kind == "Role"
    assert update.obj["rules"] == [r.as_policy_rule() for r in MASTER_ROLE_RULES]


def test_objects_another_owner_holds_are_waited_out_and_no_master_starts_meanwhile() -> None:
    # A deleted job of the same name: its Service and master pod are still being collected.
    answer = run(elastic_job(), Observed(foreign=frozenset({"Service", "Pod"})))
    kinds = sorted(w.kind for w in answer.writes if isinstance(w, CreateObject))
    assert kinds == ["Role", "RoleBinding", "Secret", "ServiceAccount"]
    ready = condition(answer, Condition.MASTER_READY)
    assert ready["reason"] == "MasterPending"
    assert "Pod, Service" in ready["message"]
    # Once they are gone, the rest is created.
    later = run(with_status(elastic_job(), answer), observed_after(answer))
    assert sorted(w.kind for w in later.writes if isinstance(w, CreateObject)) == ["Pod", "Service"]


def _nnodes(pod: dict[str, Any]) -> str:
    command = pod["spec"]["containers"][0]["command"]
    return str(command[command.index("--nnodes") + 1])


def _with_image_and_max(job: dict[str, Any], image: str, max_replicas: int) -> dict[str, Any]:
    worker = copy.deepcopy(job["spec"]["replicaSpecs"]["worker"])
    worker["template"]["spec"]["containers"][0]["image"] = image
    worker["maxReplicas"] = max_replicas
    return edited(job, {"replicaSpecs": {"worker": worker}})


def test_a_node_count_carried_out_with_a_refused_edit_is_kept_by_a_replacement() -> None:
    job, observed = running(elastic_job())
    both = _with_image_and_max(job, "new", 1)
    answer = run(both, observed_after(Reconciliation((), {}, ""), observed, summary=summary(wanted=2)))
    assert answer.writes == (ResizeJob(1, "spec.replicaSpecs.worker.maxReplicas is 1"),)
    assert "spec.replicaSpecs.worker.template" in condition(answer, Condition.SPEC_CHANGE_REFUSED)["message"]
    in_force = answer.status[APPLIED_SPEC_STATUS]["replicaSpecs"]["worker"]
    assert in_force["maxReplicas"] == 1
    assert in_force["template"]["spec"]["containers"][0]["image"] == "dlrover:test"
    replaced = run(with_status(both, answer), _master_gone(observed))
    pod = created(replaced, "Pod")
    assert (_image(pod), _nnodes(pod)) == ("dlrover:test", "1:1")


def test_a_refused_range_is_not_taken_by_a_replacement_and_its_refusal_stands() -> None:
    job, observed = running(elastic_job())
    wider = edited(job, {})
    wider["spec"]["replicaSpecs"]["worker"]["maxReplicas"] = 5
    refused = run(wider, observed)
    assert refused.writes == ()
    assert "1..5 is not the master's 1..2" in condition(refused, Condition.SPEC_CHANGE_REFUSED)["message"]
    # The master dies: no status to judge the range by; the replacement starts on the spec in force.
    replaced = run(with_status(wider, refused), _master_gone(observed))
    assert _nnodes(created(replaced, "Pod")) == "1:2"
    assert condition(replaced, Condition.SPEC_CHANGE_REFUSED) == condition(refused, Condition.SPEC_CHANGE_REFUSED)
    assert replaced.status[APPLIED_SPEC_STATUS]["replicaSpecs"]["worker"]["maxReplicas"] == 2
    # Once the replacement answers, the range is judged again (and still refused).
    started = observed_after(replaced, _master_gone(observed))
    assert started.master_pod is not None
    answering = attrs.evolve(started, master_pod=pod_phase(started.master_pod, "Running"), summary=summary())
    again = run(with_status(wider, replaced), answering)
    assert "1..5 is not the master's 1..2" in condition(again, Condition.SPEC_CHANGE_REFUSED)["message"]


def test_leaving_the_node_counts_to_the_masters_plan_waits_for_a_new_master() -> None:
    job, observed = running(elastic_job())
    planned = edited(job, {})
    del planned["spec"]["replicaSpecs"]["worker"]["minReplicas"]
    del planned["spec"]["replicaSpecs"]["worker"]["maxReplicas"]
    answer = run(planned, observed)
    assert answer.writes == ()
    assert "left to the master's plan" in condition(answer, Condition.SPEC_CHANGE_REFUSED)["message"]
    assert answer.status[APPLIED_SPEC_STATUS] == job["spec"]


def test_a_job_whose_status_lost_the_spec_in_force_reads_it_back_from_its_master_pod() -> None:
    # The status write after the master pod's create failed (or an older operator started it).
    job, observed = running(elastic_job())
    job["status"].pop(APPLIED_SPEC_STATUS)
    moved = _with_image_and_max(job, "new", 2)
    moved["spec"]["master"] = {"port": 6000}
    answer = run(moved, observed)
    assert not [w for w in answer.writes if isinstance(w, UpdateObject)], "the Service keeps the port in force"
    message = condition(answer, Condition.SPEC_CHANGE_REFUSED)["message"]
    assert "spec.master" in message
    assert "spec.replicaSpecs.worker.template" in message
    worker_in_force = answer.status[APPLIED_SPEC_STATUS]["replicaSpecs"]["worker"]
    assert worker_in_force["template"] == job["spec"]["replicaSpecs"]["worker"]["template"]
    assert (worker_in_force["minReplicas"], worker_in_force["maxReplicas"]) == (1, 2), "from the master's --nnodes"
    assert answer.status["masterAddress"].endswith(":50001")
    replaced = run(with_status(moved, answer), _master_gone(observed))
    pod = created(replaced, "Pod")
    assert (_image(pod), pod["spec"]["containers"][0]["ports"][0]["containerPort"]) == ("dlrover:test", 50001)


def test_a_job_resumed_while_its_suspended_master_terminates_starts_on_the_spec_as_it_then_is() -> None:
    job, observed = running(elastic_job())
    assert observed.master_pod is not None
    suspended = edited(job, {"suspend": True})
    pause = run(suspended, observed)
    assert APPLIED_SPEC_STATUS not in pause.status
    terminating = copy.deepcopy(dict(observed.master_pod))
    terminating["metadata"]["deletionTimestamp"] = "2026-01-01T00:00:30Z"
    resumed = _with_image_and_max(with_status(suspended, pause), "new", 2)
    resumed["spec"]["suspend"] = False
    waiting = run(resumed, attrs.evolve(observed, master_pod=terminating, summary=None))
    assert APPLIED_SPEC_STATUS not in waiting.status, "not read back from a master on its way out"
    started = run(with_status(resumed, waiting), _master_gone(observed))
    assert _image(created(started, "Pod")) == "new"


def test_the_master_pod_says_whether_it_serves_tls() -> None:
    plain = run(elastic_job())
    tls_settings = attrs.evolve(SETTINGS, master=MasterSettings(image="x", tls_secret="tls"))
    with_tls = run(elastic_job(), Observed(secrets=frozenset({"tls"})), settings=tls_settings)
    assert not serves_tls(created(plain, "Pod"))
    assert serves_tls(created(with_tls, "Pod"))


@pytest.mark.parametrize("annotation", ["not json", "[1]", '{"replicaSpecs": [1]}'])
def test_a_master_pod_whose_annotation_is_unreadable_gives_no_spec_in_force_and_nothing_fails(
    annotation: str,
) -> None:
    job, observed = running(elastic_job())
    job["status"].pop(APPLIED_SPEC_STATUS)
    assert observed.master_pod is not None
    pod = copy.deepcopy(dict(observed.master_pod))
    pod["metadata"]["annotations"]["elastic.dlrover.io/applied-spec"] = annotation
    answer = run(job, attrs.evolve(observed, master_pod=pod))
    # Nothing read back; the job's own spec, unedited, is recorded as carried out.
    assert answer.status.get(APPLIED_SPEC_STATUS, job["spec"]) == job["spec"]
    assert answer.writes == ()
