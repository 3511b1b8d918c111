"""The Kubernetes backend's pure cores: NodeSpec -> pod manifest, pod -> ObservedNode."""

from __future__ import annotations

from typing import Any

import pytest

from dlrover.autoscale import Resources, Role
from dlrover.common import ConfigError
from dlrover.master.scheduler.base import NodeSpec, ObservedState
from dlrover.master.scheduler.kubernetes import (
    TF_SERVER_COMMAND,
    KubernetesSettings,
    WorkerTemplate,
    master_address,
    observe_deleted_pod,
    observe_pod,
    shm_size_mb,
    worker_pod,
)

SETTINGS = KubernetesSettings(namespace="team", job="gpt")
TEMPLATE: dict[str, Any] = {
    "metadata": {"labels": {"app": "gpt"}, "annotations": {"note": "x"}},
    "spec": {
        "containers": [
            {"name": "sidecar", "image": "busybox"},
            {
                "name": "main",
                "image": "dlrover",
                "command": ["dlrover-run", "train.py"],
                "env": [{"name": "USER_VAR", "value": "1"}, {"name": "DLROVER_MASTER_ADDR", "value": "stale"}],
                "volumeMounts": [{"name": "old-shm", "mountPath": "/dev/shm"}, {"name": "data", "mountPath": "/d"}],
            },
        ],
        "volumes": [{"name": "data", "emptyDir": {}}],
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]},
                        {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["b"]}]},
                    ]
                }
            }
        },
    },
}
WORKER = WorkerTemplate(TEMPLATE, job_uid="uid-1", checkpoint_volume={"persistentVolumeClaim": {"claimName": "ck"}})


def spec(**kw: Any) -> NodeSpec:
    env = {
        "DLROVER_MASTER_ADDR": "0.0.0.0:50001",
        "DLROVER_JOB_TOKEN": "secret-literal",
        "DLROVER_JOB_TOKEN_FILE": "/tmp/token",
        "DLROVER_NODE_ID": "7",
        "DLROVER_NODE_RANK": "2",
    }
    return NodeSpec(job_name="gpt", node_id=7, rank=2, env=env, **kw)


def main(pod: dict[str, Any]) -> dict[str, Any]:
    return next(c for c in pod["spec"]["containers"] if c["name"] == "main")


def env_of(pod: dict[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in main(pod)["env"]}


def test_names_labels_owner_and_restart_policy() -> None:
    pod = worker_pod(spec(), SETTINGS, WORKER)
    meta = pod["metadata"]
    assert (meta["name"], meta["namespace"]) == ("gpt-worker-7", "team")
    assert meta["labels"] == {
        "app": "gpt",
        "app.kubernetes.io/managed-by": "dlrover",
        "elastic.dlrover.io/job": "gpt",
        "elastic.dlrover.io/component": "worker",
        "elastic.dlrover.io/role": "worker",
        "elastic.dlrover.io/node-id": "7",
        "elastic.dlrover.io/rank": "2",
    }
    assert meta["annotations"] == {"note": "x"}
    assert meta["ownerReferences"] == [
        {
            "apiVersion": "elastic.dlrover.io/v1alpha1",
            "kind": "ElasticJob",
            "name": "gpt",
            "uid": "uid-1",
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    assert pod["spec"]["restartPolicy"] == "Never"
    assert pod["spec"]["terminationGracePeriodSeconds"] == 30
    assert TEMPLATE["spec"]["containers"][1]["env"][1]["value"] == "stale"  # the template is not changed


def test_no_owner_without_a_job_uid() -> None:
    assert "ownerReferences" not in worker_pod(spec(), SETTINGS, WorkerTemplate(TEMPLATE))["metadata"]


def test_the_token_comes_only_from_the_secret() -> None:
    pod = worker_pod(spec(), SETTINGS, WORKER)
    env = env_of(pod)
    assert env["DLROVER_JOB_TOKEN"] == {"secretKeyRef": {"name": "gpt-token", "key": "token"}}
    assert "DLROVER_JOB_TOKEN_FILE" not in env
    assert "secret-literal" not in repr(pod)
    assert env["DLROVER_MASTER_ADDR"] == "gpt-master.team.svc:50001"
    assert [e["name"] for e in main(pod)["env"]].count("DLROVER_MASTER_ADDR") == 1
    assert env["DLROVER_NODE_ID"] == "7"
    assert env["DLROVER_NODE_RANK"] == "2"
    assert env["USER_VAR"] == "1"
    assert env["POD_NAME"] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert env["POD_NAMESPACE"] == {"fieldRef": {"fieldPath": "metadata.namespace"}}
    assert env["POD_IP"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    # The sidecar is the user's: untouched.
    assert "env" not in pod["spec"]["containers"][0]


def test_a_tls_master_is_verified_with_its_secret_mounted_in_the_worker() -> None:
    tls = KubernetesSettings(namespace="team", job="gpt", tls_secret="gpt-tls", tls_ca_key="ca.crt")
    node = spec()
    # The master's own agent variables (its local paths) never reach a pod: the pod's are its own.
    node = NodeSpec(job_name="gpt", node_id=7, rank=2, env={**node.env, "DLROVER_MASTER_TLS_CA": "/master/ca.pem"})
    pod = worker_pod(node, tls, WORKER)
    env = env_of(pod)
    assert env["DLROVER_MASTER_TLS_CA"] == "/etc/dlrover/master-tls/ca.crt"
    assert env["DLROVER_MASTER_TLS_SERVER_NAME"] == "gpt-master.team.svc"
    assert [e["name"] for e in main(pod)["env"]].count("DLROVER_MASTER_TLS_CA") == 1
    volume = next(v for v in pod["spec"]["volumes"] if v["name"] == "dlrover-master-tls")
    assert volume["secret"] == {"secretName": "gpt-tls", "items": [{"key": "ca.crt", "path": "ca.crt"}]}
    mount = next(m for m in main(pod)["volumeMounts"] if m["name"] == "dlrover-master-tls")
    assert mount == {"name": "dlrover-master-tls", "mountPath": "/etc/dlrover/master-tls", "readOnly": True}
    # A plaintext master: nothing of it.
    plain = worker_pod(spec(), SETTINGS, WORKER)
    assert "DLROVER_MASTER_TLS_CA" not in env_of(plain)
    assert all(v["name"] != "dlrover-master-tls" for v in plain["spec"]["volumes"])
    # An address given explicitly: the certificate must be valid for it, so no name is imposed.
    given = KubernetesSettings(namespace="team", job="gpt", master_address="10.0.0.1:9", tls_secret="gpt-tls")
    assert "DLROVER_MASTER_TLS_SERVER_NAME" not in env_of(worker_pod(spec(), given, WORKER))


def test_the_master_address_can_be_given_and_must_be_known() -> None:
    given = KubernetesSettings(namespace="team", job="gpt", master_address="10.0.0.1:9")
    assert master_address(spec(), given) == "10.0.0.1:9"
    with pytest.raises(ConfigError, match="port is unknown"):
        master_address(NodeSpec("gpt", 1, 1, env={}), SETTINGS)


def test_resources_are_requests_and_limits_with_the_shm_counted() -> None:
    resources = Resources(cpu=1.5, memory_mb=4096, gpu=2, gpu_type="nvidia-h100")
    pod = worker_pod(spec(resources=resources), SETTINGS, WORKER)
    shm = 2 * 1024  # two snapshots of a quarter of the node's memory
    amounts = {"cpu": "1500m", "memory": f"{4096 + shm}Mi", "nvidia.com/gpu": "2"}
    assert main(pod)["resources"] == {"requests": amounts, "limits": amounts}
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert volumes["dlrover-shm"] == {"name": "dlrover-shm", "emptyDir": {"medium": "Memory", "sizeLimit": f"{shm}Mi"}}
    assert pod["spec"]["nodeSelector"] == {"nvidia.com/gpu.product": "nvidia-h100"}


def test_shm_sizing_rule() -> None:
    assert shm_size_mb(Resources(cpu=1, memory_mb=1000), SETTINGS) == 500
    assert shm_size_mb(None, SETTINGS) == 0
    stated = KubernetesSettings(namespace="a", job="b", node_state_mb=3000)
    assert shm_size_mb(Resources(cpu=1, memory_mb=1000), stated) == 6000
    assert shm_size_mb(None, stated) == 6000


def test_no_resources_means_no_limits_and_an_unsized_shm() -> None:
    pod = worker_pod(spec(), SETTINGS, WORKER)
    assert "resources" not in main(pod)
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert volumes["dlrover-shm"]["emptyDir"] == {"medium": "Memory"}


def test_shm_and_checkpoint_mounts_replace_the_templates() -> None:
    pod = worker_pod(spec(), SETTINGS, WORKER)
    mounts = {m["mountPath"]: m["name"] for m in main(pod)["volumeMounts"]}
    assert mounts == {"/dev/shm": "dlrover-shm", "/d": "data", "/checkpoints": "dlrover-checkpoints"}
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert volumes["dlrover-checkpoints"] == {
        "name": "dlrover-checkpoints",
        "persistentVolumeClaim": {"claimName": "ck"},
    }
    assert "data" in volumes


def test_a_templates_own_checkpoint_mount_is_kept_when_the_job_names_no_checkpoint_volume() -> None:
    # The user mounts their own claim at /checkpoints and leaves spec.checkpoint out: dropping the mount
    # would leave the volume unmounted and every checkpoint on the container's disk, lost at a relaunch.
    template = {
        "spec": {
            "containers": [
                {"name": "main", "volumeMounts": [{"name": "mine", "mountPath": "/checkpoints"}]},
            ],
            "volumes": [{"name": "mine", "persistentVolumeClaim": {"claimName": "user-claim"}}],
        }
    }
    pod = worker_pod(spec(), SETTINGS, WorkerTemplate(template, job_uid="uid-1"))
    mounts = {m["mountPath"]: m["name"] for m in main(pod)["volumeMounts"]}
    assert mounts == {"/dev/shm": "dlrover-shm", "/checkpoints": "mine"}
    assert {v["name"] for v in pod["spec"]["volumes"]} == {"mine", "dlrover-shm"}
    # Naming one, the job's volume takes the path.
    named = WorkerTemplate(template, job_uid="uid-1", checkpoint_volume={"persistentVolumeClaim": {"claimName": "ck"}})
    mounts = {m["mountPath"]: m["name"] for m in main(worker_pod(spec(), SETTINGS, named))["volumeMounts"]}
    assert mounts["/checkpoints"] == "dlrover-checkpoints"


def test_the_agent_publishes_its_pod_ip_unless_the_template_says_otherwise() -> None:
    env = env_of(worker_pod(spec(), SETTINGS, WORKER))
    assert env["PET_LOCAL_ADDR"] == {"fieldRef": {"fieldPath": "status.podIP"}}
    own = WorkerTemplate(
        {"spec": {"containers": [{"name": "main", "env": [{"name": "PET_LOCAL_ADDR", "value": "gpt-0.gpt"}]}]}}
    )
    pod = worker_pod(spec(), SETTINGS, own)
    assert [e for e in main(pod)["env"] if e["name"] == "PET_LOCAL_ADDR"] == [
        {"name": "PET_LOCAL_ADDR", "value": "gpt-0.gpt"}
    ]


def test_the_templates_other_resources_are_kept() -> None:
    from dlrover.autoscale import Resources

    own = WorkerTemplate(
        {
            "spec": {
                "containers": [
                    {
                        "name": "main",
                        "resources": {
                            "requests": {"ephemeral-storage": "10Gi", "cpu": "1"},
                            "limits": {"ephemeral-storage": "20Gi", "hugepages-2Mi": "1Gi"},
                        },
                    }
                ]
            }
        }
    )
    pod = worker_pod(spec(resources=Resources(cpu=4, memory_mb=1024)), SETTINGS, own)
    resources = main(pod)["resources"]
    assert resources["requests"]["ephemeral-storage"] == "10Gi"
    assert resources["limits"]["hugepages-2Mi"] == "1Gi"
    assert resources["requests"]["cpu"] == resources["limits"]["cpu"] == "4"
    assert resources["requests"]["memory"] == resources["limits"]["memory"]


def test_avoided_hosts_are_excluded_in_every_node_selector_term() -> None:
    pod = worker_pod(spec(avoid_hosts=frozenset({"n2", "n1"})), SETTINGS, WORKER)
    terms = pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    avoid = {"key": "kubernetes.io/hostname", "operator": "NotIn", "values": ["n1", "n2"]}
    by_name = {"key": "metadata.name", "operator": "NotIn", "values": ["n1", "n2"]}
    assert len(terms) == 2
    assert all(term["matchExpressions"][-1] == avoid for term in terms)
    # The hostname label need not equal the node's name (the host is a pod's nodeName): both are excluded.
    assert all(term["matchFields"] == [by_name] for term in terms)
    bare = WorkerTemplate({"spec": {"containers": [{"name": "c"}]}})
    pod = worker_pod(spec(avoid_hosts=frozenset({"n1"})), SETTINGS, bare)
    assert pod["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"] == {
        "nodeSelectorTerms": [
            {"matchExpressions": [{**avoid, "values": ["n1"]}], "matchFields": [{**by_name, "values": ["n1"]}]}
        ]
    }
    assert "affinity" not in worker_pod(spec(), SETTINGS, bare)["spec"]


def test_bad_settings_and_templates_are_refused() -> None:
    with pytest.raises(ConfigError, match="namespace"):
        KubernetesSettings(namespace="Bad_NS", job="x")
    with pytest.raises(ConfigError, match="job"):
        KubernetesSettings(namespace="ns", job="")
    with pytest.raises(ConfigError, match="pod_deletion_grace_s"):
        KubernetesSettings(namespace="ns", job="x", pod_deletion_grace_s=-1)
    with pytest.raises(ConfigError, match=r"no spec\.containers"):
        WorkerTemplate({"spec": {"containers": []}})


# ----------------------------------------------------------------- observations


def pod(phase: str, **status: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "gpt-worker-7", "namespace": "team"},
        "spec": {"nodeName": "n1", "containers": [{"name": "main"}]},
        "status": {"phase": phase, **status},
    }


def terminated(reason: str, code: int) -> list[dict[str, Any]]:
    return [{"name": "main", "state": {"terminated": {"reason": reason, "exitCode": code}}}]


def test_pending_running_and_succeeded() -> None:
    assert observe_pod(7, pod("Pending")).state is ObservedState.PENDING
    running = observe_pod(7, pod("Running"))
    assert (running.state, running.host) == (ObservedState.RUNNING, "n1")
    done = observe_pod(7, pod("Succeeded", containerStatuses=terminated("Completed", 0)))
    assert (done.state, done.exit_code) == (ObservedState.SUCCEEDED, 0)


def test_unschedulable_carries_the_schedulers_message() -> None:
    message = "0/3 nodes are available: 3 Insufficient memory."
    seen = observe_pod(
        7,
        pod(
            "Pending",
            conditions=[{"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": message}],
        ),
    )
    assert (seen.state, seen.reason) == (ObservedState.PENDING, "Unschedulable")
    assert message in seen.evidence


def test_a_container_that_cannot_start_says_why() -> None:
    waiting = [
        {
            "name": "main",
            "state": {"waiting": {"reason": "CreateContainerConfigError", "message": 'secret "gpt-token" not found'}},
        }
    ]
    seen = observe_pod(7, pod("Pending", containerStatuses=waiting))
    assert (seen.state, seen.reason) == (ObservedState.PENDING, "CreateContainerConfigError")
    assert 'secret "gpt-token" not found' in seen.evidence
    creating = [{"name": "main", "state": {"waiting": {"reason": "ContainerCreating"}}}]
    seen = observe_pod(7, pod("Pending", containerStatuses=creating))
    assert (seen.state, seen.reason) == (ObservedState.PENDING, "")


def test_oom_killed_is_charged_with_its_evidence() -> None:
    seen = observe_pod(7, pod("Failed", containerStatuses=terminated("OOMKilled", 137)))
    assert (seen.state, seen.exit_code, seen.reason, seen.disruption) == (ObservedState.FAILED, 137, "OOMKilled", False)
    assert "container main terminated: reason OOMKilled, exitCode 137" in seen.evidence


def test_an_ordinary_failure_keeps_the_exit_code() -> None:
    seen = observe_pod(7, pod("Failed", containerStatuses=terminated("Error", 3)))
    assert (seen.state, seen.exit_code, seen.reason, seen.disruption) == (ObservedState.FAILED, 3, "Error", False)


@pytest.mark.parametrize(
    ("status", "reason"),
    [
        ({"reason": "Evicted", "message": "The node was low on resource: memory."}, "Evicted"),
        ({"reason": "NodeLost"}, "NodeLost"),
        (
            {"conditions": [{"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler"}]},
            "Preempted",
        ),
        (
            {"conditions": [{"type": "DisruptionTarget", "status": "True", "reason": "DeletionByTaintManager"}]},
            "NodeLost",
        ),
        ({"conditions": [{"type": "DisruptionTarget", "status": "True", "reason": "TerminationByKubelet"}]}, "Evicted"),
    ],
)
def test_platform_disruptions(status: dict[str, Any], reason: str) -> None:
    seen = observe_pod(7, pod("Failed", containerStatuses=terminated("Error", 137), **status))
    assert (seen.state, seen.reason, seen.disruption, seen.host) == (ObservedState.FAILED, reason, True, "n1")


def test_deadline_exceeded_is_the_jobs_own_limit() -> None:
    seen = observe_pod(7, pod("Failed", reason="DeadlineExceeded", message="Pod was active too long"))
    assert (seen.state, seen.reason, seen.disruption) == (ObservedState.FAILED, "DeadlineExceeded", False)
    assert "Pod was active too long" in seen.evidence


def test_a_stop_the_master_asked_for_is_a_stop() -> None:
    assert observe_pod(7, pod("Failed"), stop_requested=True).state is ObservedState.STOPPED
    assert observe_deleted_pod(7, pod("Running"), stop_requested=True).state is ObservedState.STOPPED


def test_a_pod_deleted_by_someone_else_is_a_disruption() -> None:
    preempted = pod(
        "Running", conditions=[{"type": "DisruptionTarget", "status": "True", "reason": "PreemptionByScheduler"}]
    )
    seen = observe_deleted_pod(7, preempted, stop_requested=False)
    assert (seen.state, seen.reason, seen.disruption, seen.host) == (ObservedState.FAILED, "Preempted", True, "n1")
    seen = observe_deleted_pod(7, pod("Running"), stop_requested=False)
    assert (seen.reason, seen.disruption) == ("Deleted", True)
    seen = observe_deleted_pod(7, None, stop_requested=False)
    assert (seen.state, seen.reason) == (ObservedState.FAILED, "Deleted")
    # One that had already ended keeps how it ended.
    ended = observe_deleted_pod(7, pod("Failed", containerStatuses=terminated("OOMKilled", 137)), stop_requested=False)
    assert (ended.reason, ended.disruption) == ("OOMKilled", False)


def test_a_pod_that_failed_because_someone_else_deletes_it_is_a_disruption() -> None:
    # `kubectl delete pod` with a grace period: the kubelet stops the container, reports phase Failed
    # (exit 143, reason Error) while the object is still there, with no condition saying why.
    def deleting(finished_at: str | None) -> dict[str, Any]:
        state: dict[str, Any] = {"reason": "Error", "exitCode": 143}
        if finished_at is not None:
            state["finishedAt"] = finished_at
        seen = pod("Failed", containerStatuses=[{"name": "main", "state": {"terminated": state}}])
        seen["metadata"].update(deletionTimestamp="2026-12-03T10:00:30Z", deletionGracePeriodSeconds=30)
        return seen

    for finished_at in ("2026-12-03T10:00:02Z", None):  # after the deletion was asked for (10:00:00), or unsaid
        seen = observe_pod(7, deleting(finished_at))
        assert (seen.state, seen.exit_code, seen.reason, seen.disruption) == (
            ObservedState.FAILED,
            143,
            "Deleted",
            True,
        )
        gone = observe_deleted_pod(7, deleting(finished_at), stop_requested=False)
        assert (gone.reason, gone.disruption) == ("Deleted", True)
    # A container that had failed on its own before anyone deleted the pod is charged as it failed.
    own = observe_pod(7, deleting("2026-12-03T09:59:00Z"))
    assert (own.reason, own.disruption) == ("Error", False)
    assert observe_pod(7, pod("Failed", containerStatuses=terminated("Error", 3))).disruption is False


# ---------------------------------------------------------------- a parameter-server job's tasks

TF_SETTINGS = KubernetesSettings(namespace="team", job="rec", tf_tasks=True)
SERVER_TEMPLATE: dict[str, Any] = {"spec": {"containers": [{"name": "main", "image": "rec:1"}]}}
CHIEF_TEMPLATE: dict[str, Any] = {
    "spec": {"containers": [{"name": "main", "image": "rec:1", "command": ["python", "train.py"]}]}
}
TF_TEMPLATES = WorkerTemplate(SERVER_TEMPLATE, roles={"chief": CHIEF_TEMPLATE, "ps": SERVER_TEMPLATE})


def tf_spec(role: Role, index: int, node_id: int, **kw: Any) -> NodeSpec:
    env = {"DLROVER_MASTER_ADDR": "0.0.0.0:50001", "TF_CONFIG": "{}"}
    return NodeSpec(job_name="rec", node_id=node_id, rank=index, env=env, role=role, **kw)


def test_a_tf_task_has_its_roles_template_and_a_dns_name_its_relaunches_keep() -> None:
    first = worker_pod(tf_spec(Role.PS, 1, 4), TF_SETTINGS, TF_TEMPLATES)
    again = worker_pod(tf_spec(Role.PS, 1, 9, relaunch_count=1), TF_SETTINGS, TF_TEMPLATES)
    assert (first["metadata"]["name"], again["metadata"]["name"]) == ("rec-ps-1-4", "rec-ps-1-9")
    for pod in (first, again):
        assert (pod["spec"]["hostname"], pod["spec"]["subdomain"]) == ("rec-ps-1", "rec-tasks")
        assert pod["metadata"]["labels"]["elastic.dlrover.io/role"] == "ps"
        # A server's template that runs nothing runs TensorFlow's server.
        assert main(pod)["command"] == list(TF_SERVER_COMMAND)
        # No /dev/shm is added (nor charged to the memory): on Kubernetes TF checkpoints go to storage.
        assert [v["name"] for v in pod["spec"]["volumes"]] == []
        assert "PET_LOCAL_ADDR" not in env_of(pod)
    chief = worker_pod(tf_spec(Role.CHIEF, 0, 0), TF_SETTINGS, TF_TEMPLATES)
    assert chief["metadata"]["name"] == "rec-chief-0-0"
    assert main(chief)["command"] == ["python", "train.py"]
    assert env_of(chief)["TF_CONFIG"] == "{}"
    assert env_of(chief)["DLROVER_MASTER_ADDR"] == "rec-master.team.svc:50001"


def test_a_tf_tasks_resources_are_its_own_without_shm() -> None:
    pod = worker_pod(tf_spec(Role.WORKER, 0, 2, resources=Resources(cpu=2, memory_mb=1024)), TF_SETTINGS,
                     TF_TEMPLATES)  # fmt: skip
    assert main(pod)["resources"]["limits"] == {"cpu": "2", "memory": "1024Mi"}


def test_a_tf_worker_waits_for_its_parameter_servers_whatever_its_template_runs() -> None:
    own_command = {"spec": {"containers": [{"name": "main", "image": "rec:1", "command": ["python", "serve.py"]}]}}
    own_setting = {"spec": {"containers": [{"name": "main", "image": "rec:1",
                                            "env": [{"name": "GRPC_FAIL_FAST", "value": "use_caller"}]}]}}  # fmt: skip
    for template, expected in ((SERVER_TEMPLATE, "false"), (own_command, "false"), (own_setting, "use_caller")):
        pod = worker_pod(tf_spec(Role.WORKER, 0, 2), TF_SETTINGS, WorkerTemplate(template))
        assert env_of(pod)["GRPC_FAIL_FAST"] == expected, "the job's own setting wins"
        assert [e["name"] for e in main(pod)["env"]].count("GRPC_FAIL_FAST") == 1
    for role in (Role.PS, Role.CHIEF):
        assert "GRPC_FAIL_FAST" not in env_of(worker_pod(tf_spec(role, 0, 3), TF_SETTINGS, TF_TEMPLATES))


def test_a_role_without_a_template_and_a_name_too_long_are_refused() -> None:
    with pytest.raises(ConfigError, match=r"no evaluator template \(spec.replicaSpecs.evaluator.template\)"):
        worker_pod(tf_spec(Role.EVALUATOR, 0, 5), TF_SETTINGS, TF_TEMPLATES)
    long_job = KubernetesSettings(namespace="team", job="r" * 60, tf_tasks=True)
    with pytest.raises(ConfigError, match="at most 63 characters"):
        worker_pod(tf_spec(Role.PS, 0, 1), long_job, TF_TEMPLATES)


def test_the_chiefs_command_is_its_main_containers() -> None:
    assert TF_TEMPLATES.command_of("chief") == ["python", "train.py"]
    with pytest.raises(ConfigError, match=r"the ps's main container .* has no command"):
        TF_TEMPLATES.command_of("ps")
    with pytest.raises(ConfigError, match=r"the chief template .* has no spec\.containers"):
        WorkerTemplate(SERVER_TEMPLATE, roles={"chief": {"spec": {}}})
