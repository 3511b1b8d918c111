"""The operator's handling of a TensorFlow parameter-server ElasticJob (roles chief, ps, worker): the spec's
rules, the master it starts (`dlrover-master ps-job`), its Role, and edits it cannot carry out."""

from __future__ import annotations

import copy
from typing import Any

import pytest
from ej_builders import TOKEN, created, elastic_job, observed_after, pod_phase, summary, with_status

from dlrover.master.operator import (
    Condition,
    MasterSettings,
    Observed,
    ReconcileSettings,
    Reconciliation,
    check_spec,
    reconcile,
)
from dlrover.master.operator.objects import PS_MASTER_ROLE_RULES, applied_part
from dlrover.master.scheduler.kubernetes import VERBS_ADMITTED, VERBS_USED_BY_TF_TASKS

SETTINGS = ReconcileSettings(master=MasterSettings(image="dlrover:test"))
SERVER = {"spec": {"containers": [{"name": "main", "image": "rec:1"}]}}
CHIEF = {"spec": {"containers": [{"name": "main", "image": "rec:1", "command": ["python", "train.py"]}]}}
VOLUME = {"persistentVolumeClaim": {"claimName": "ckpt"}}


def ps_job(**replicas: Any) -> dict[str, Any]:
    roles: dict[str, Any] = {
        "chief": {"template": CHIEF},
        "ps": {"template": SERVER, "minReplicas": 2, "maxReplicas": 4, "resources": {"memory": "2Gi"}},
        "worker": {"template": SERVER, "minReplicas": 1, "maxReplicas": 3, "resources": {"cpu": "500m"}},
    }
    roles.update(replicas)
    return elastic_job(replicaSpecs=roles, checkpoint={"volume": VOLUME}, timeouts={"nodeStartSeconds": 300})


def run(job: dict[str, Any], observed: Observed | None = None,
        settings: ReconcileSettings = SETTINGS) -> Reconciliation:  # fmt: skip
    observed = observed or Observed(claims=frozenset({"ckpt"}))
    return reconcile(job, observed, settings, now="2026-01-01T00:00:00Z", new_token=TOKEN)


def condition(answer: Reconciliation, kind: str) -> dict[str, Any]:
    (found,) = [c for c in answer.status.get("conditions", []) if c["type"] == kind]
    return dict(found)


def test_a_ps_job_gets_a_ps_job_master_with_its_roles_checkpoint_volume_and_role() -> None:
    job = ps_job(evaluator={"template": CHIEF})
    answer = run(job)
    pod = created(answer, "Pod")
    (container,) = pod["spec"]["containers"]
    command = container["command"]
    assert command[:2] == ["dlrover-master", "ps-job"]
    expected = {
        "--backend": "kubernetes", "--kube-job": "job1", "--work-dir": "/var/lib/dlrover/journal",
        "--checkpoint-dir": "/checkpoints", "--ps": "2", "--max-ps": "4", "--workers": "3", "--min-workers": "1",
        "--ps-memory": "2Gi", "--worker-cpu": "0.5", "--task-start-timeout": "300",
    }  # fmt: skip
    assert {k: command[command.index(k) + 1] for k in expected} == expected
    assert "--evaluator" in command
    assert {"name": "checkpoints", "mountPath": "/checkpoints", "readOnly": True} in container["volumeMounts"]
    assert {"name": "checkpoints", **VOLUME} in pod["spec"]["volumes"]
    role = created(answer, "Role")
    granted = {(g, r, v) for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"]
               for v in rule["verbs"]}  # fmt: skip
    assert granted == VERBS_USED_BY_TF_TASKS | VERBS_ADMITTED
    assert PS_MASTER_ROLE_RULES


def test_a_ps_job_without_counts_leaves_them_to_the_masters_plan() -> None:
    job = ps_job(ps={"template": SERVER}, worker={"template": SERVER})
    command = created(run(job), "Pod")["spec"]["containers"][0]["command"]
    assert not {"--ps", "--max-ps", "--workers", "--min-workers"} & set(command)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"chief": None}, "spec.replicaSpecs.chief: a parameter-server job needs chief, ps and worker"),
        (
            {"chief": {"template": SERVER}},
            "spec.replicaSpecs.chief.template.spec.containers[0]: the main container needs a command",
        ),
        ({"chief": {"template": CHIEF, "maxReplicas": 2}}, "spec.replicaSpecs.chief.maxReplicas (2): a job has one"),
        ({"ps": {"template": SERVER, "minReplicas": 3, "maxReplicas": 2}}, "ps.minReplicas (3) exceeds maxReplicas"),
        (
            {"ps": {"template": SERVER, "resources": {"nvidia.com/gpu": "1"}}},
            "spec.replicaSpecs.ps.resources.nvidia.com/gpu: not a resource the master plans (cpu, memory)",
        ),
        ({"worker": {"template": SERVER, "spareReplicas": 1}}, "worker.spareReplicas: a parameter-server job keeps"),
    ],
)
def test_what_a_ps_job_cannot_have_is_refused_naming_the_field(change: dict[str, Any], message: str) -> None:
    job = ps_job()
    for role, replica in change.items():
        if replica is None:
            del job["spec"]["replicaSpecs"][role]
        else:
            job["spec"]["replicaSpecs"][role] = replica
    check = check_spec(job)
    assert check.spec is None
    assert any(message in error for error in check.errors), check.errors


def test_a_ps_job_needs_a_checkpoint_volume_and_no_rendezvous_tls_or_heartbeat() -> None:
    job = ps_job()
    job["spec"].pop("checkpoint")
    job["spec"]["rendezvous"] = {"minNodes": 1}
    job["spec"]["timeouts"] = {"heartbeatSeconds": 30}
    job["spec"]["master"] = {"tls": {"secretName": "tls"}}
    errors = "\n".join(check_spec(job).errors)
    for field in ("spec.checkpoint.volume", "spec.rendezvous", "spec.timeouts.heartbeatSeconds", "spec.master.tls"):
        assert field in errors
    answer = run(job)
    assert answer.status["phase"] == "Failed"
    assert not [w for w in answer.writes if getattr(w, "kind", "") == "Pod"], "nothing is created"
    # An operator that serves every master with TLS cannot run one.
    tls = ReconcileSettings(master=MasterSettings(image="dlrover:test", tls_secret="tls"))
    refused = run(ps_job(), settings=tls)
    assert "--master-tls-secret" in condition(refused, Condition.FAILED)["message"]


def test_an_edit_of_a_running_ps_jobs_counts_is_refused_and_the_job_runs_on() -> None:
    job = ps_job()
    first = run(job)
    observed = observed_after(first)
    assert observed.master_pod is not None
    observed = observed_after(first, master_pod=pod_phase(observed.master_pod, "Running"), summary=summary())
    job = with_status(job, run(with_status(job, first), observed))
    edit = copy.deepcopy(job)
    edit["spec"]["replicaSpecs"]["worker"]["maxReplicas"] = 2
    edit["metadata"]["generation"] += 1
    answer = run(edit, observed)
    refused = condition(answer, Condition.SPEC_CHANGE_REFUSED)
    assert "spec.replicaSpecs.worker" in refused["message"]
    assert not [w for w in answer.writes if type(w).__name__ == "ResizeJob"]
    assert "minReplicas" in applied_part(job["spec"])["replicaSpecs"]["ps"]
