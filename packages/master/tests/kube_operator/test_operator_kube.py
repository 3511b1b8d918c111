"""The operator's watch loop against the test API server (real REST and watch protocol): the objects
it creates, the status it writes, suspend, master replacement, resize, faults, RBAC, the CLI."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest
import yaml
from dlrover_testsupport.kube import ApiServer
from ej_builders import elastic_job, summary, wait_for
from kubernetes import client

from dlrover.common import DLRoverError
from dlrover.master.kube.watch import WatchSettings
from dlrover.master.operator import MasterSettings, ReconcileSettings, crd_manifest
from dlrover.master.operator.controller import MasterAddress, Operator, OperatorSettings
from dlrover.master.status import JobSummary

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

GROUP, VERSION, PLURAL, NS = "elastic.dlrover.io", "v1alpha1", "elasticjobs", "default"
DEPLOY = Path(__file__).resolve().parents[4] / "deploy" / "kubernetes"
OWNED = ("pod", "service", "secret", "service_account", "role", "role_binding")


class FakeMasters:
    """Stands in for the masters' JobService: answers what the test sets, records resizes."""

    def __init__(self) -> None:
        self.answer: JobSummary | None = None
        self.resizes: list[int] = []
        self.refuse_resizes = 0  # this many resize calls fail first
        self.targets: list[str] = []
        self.tls: list[bool] = []
        self._lock = threading.Lock()

    def status(self, address: MasterAddress) -> JobSummary:
        with self._lock:
            self.targets.append(address.target)
            self.tls.append(address.tls)
            assert len(address.token) >= 16
            if self.answer is None:
                raise ConnectionError("the master is not serving yet")
            return self.answer

    def resize(self, address: MasterAddress, nodes: int, reason: str) -> str:
        with self._lock:
            self.resizes.append(nodes)
            if self.refuse_resizes:
                self.refuse_resizes -= 1
                raise DLRoverError("the master cannot be reached")
            if self.answer is not None:  # as a master does: it now wants that many
                self.answer = attrs.evolve(self.answer, wanted_nodes=nodes)
            return f"resized to {nodes}"


class Cluster:
    def __init__(self, server: ApiServer, api: Any) -> None:
        self.server = server
        self.api = api
        self.core = client.CoreV1Api(api)
        self.rbac = client.RbacAuthorizationV1Api(api)
        self.custom = client.CustomObjectsApi(api)

    def create_job(self, job: dict[str, Any]) -> dict[str, Any]:
        body = {k: v for k, v in job.items() if k != "status"}
        body["metadata"] = {"name": job["metadata"]["name"]}
        return dict(self.custom.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, body))

    def job(self, name: str = "job1") -> dict[str, Any]:
        return dict(self.custom.get_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, name))

    def patch_job(self, patch: dict[str, Any], name: str = "job1") -> None:
        self.custom.patch_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, name, patch)

    def condition(self, kind: str, name: str = "job1") -> dict[str, Any] | None:
        for c in (self.job(name).get("status") or {}).get("conditions") or []:
            if c["type"] == kind:
                return dict(c)
        return None

    def owned(self, name: str = "job1") -> dict[str, Any]:
        """The job's objects by kind, each None when absent."""
        found: dict[str, Any] = {}
        for kind in OWNED:
            api = self.rbac if kind.startswith("role") else self.core
            target = f"{name}-token" if kind == "secret" else f"{name}-master"
            try:
                found[kind] = getattr(api, f"read_namespaced_{kind}")(target, NS)
            except client.exceptions.ApiException as exc:
                if exc.status != 404:
                    raise
                found[kind] = None
        return found

    def master_pod(self, name: str = "job1") -> Any:
        return self.owned(name)["pod"]

    def set_pod_status(self, pod: str, status: dict[str, Any]) -> None:
        current = self.core.read_namespaced_pod(pod, NS)
        body = self.api.sanitize_for_serialization(current)
        body["status"] = status
        self.core.replace_namespaced_pod_status(pod, NS, body)


@pytest.fixture
def cluster(kube_api: ApiServer) -> Iterator[Cluster]:
    with client.ApiClient(client.Configuration(host=kube_api.url)) as api:
        client.ApiextensionsV1Api(api).create_custom_resource_definition(crd_manifest())
        yield Cluster(kube_api, api)


def _settings(**kw: Any) -> OperatorSettings:
    base: dict[str, Any] = {
        "namespace": NS,
        "reconcile": ReconcileSettings(master=MasterSettings(image="dlrover:test"), max_master_restarts=3),
        "status_interval_s": 0.2,
        "resync_interval_s": 0.5,
        "retry_interval_s": 0.2,
        "watch": WatchSettings(watch_timeout_s=5, request_timeout_s=10, backoff_initial_s=0.05, backoff_max_s=0.5),
        "sync_timeout_s": 30,
    }
    base.update(kw)
    return OperatorSettings(**base)


@pytest.fixture
def masters() -> FakeMasters:
    return FakeMasters()


@pytest.fixture
def operator(cluster: Cluster, masters: FakeMasters) -> Iterator[Operator]:
    with Operator(cluster.api, _settings(), masters=masters) as op:  # type: ignore[arg-type]
        yield op
    assert op.failed_watch is None


def _terminated(code: int, reason: str) -> dict[str, Any]:
    return {
        "name": "master",
        "image": "dlrover:test",
        "imageID": "",
        "ready": False,
        "restartCount": 0,
        "state": {"terminated": {"exitCode": code, "reason": reason}},
    }


def _running_master(cluster: Cluster, masters: FakeMasters, **answer: Any) -> Any:
    pod = wait_for("the master pod", cluster.master_pod)
    masters.answer = summary(**answer)
    cluster.set_pod_status(pod.metadata.name, {"phase": "Running", "podIP": "127.0.0.7"})
    wait_for("the job running", lambda: (cluster.job().get("status") or {}).get("phase") == "Running")
    return pod


def test_the_operator_creates_the_jobs_objects_all_owned_by_it(cluster: Cluster, operator: Operator) -> None:
    job = cluster.create_job(elastic_job())
    objs = wait_for("every object", lambda: (o := cluster.owned()) and all(o.values()) and o)
    for kind, obj in objs.items():
        refs = obj.metadata.owner_references
        assert [(r.kind, r.name, r.uid, r.controller, r.block_owner_deletion) for r in refs] == [
            ("ElasticJob", "job1", job["metadata"]["uid"], True, True)
        ], kind
        assert obj.metadata.labels["elastic.dlrover.io/job"] == "job1"
    ready = wait_for("MasterReady", lambda: cluster.condition("MasterReady"))
    assert ready["status"] == "False"
    assert cluster.job()["status"]["phase"] == "Pending"
    assert cluster.job()["status"]["observedGeneration"] == job["metadata"]["generation"]


def test_a_template_without_a_container_fails_the_job_and_creates_nothing(cluster: Cluster, operator: Operator) -> None:
    job = elastic_job()
    job["spec"]["replicaSpecs"]["worker"]["template"] = {"spec": {"containers": []}}
    cluster.create_job(job)
    failed = wait_for("Failed", lambda: cluster.condition("Failed"))
    assert failed["status"] == "True"
    assert "spec.replicaSpecs.worker.template.spec.containers" in failed["message"]
    # Let the operator look again (resync) before checking nothing appeared.
    count = operator.reconciles
    wait_for("another pass", lambda: operator.reconciles >= count + 2)
    assert not any(cluster.owned().values())
    assert cluster.job()["status"]["phase"] == "Failed"


def test_a_missing_checkpoint_claim_holds_the_job_until_it_exists(cluster: Cluster, operator: Operator) -> None:
    cluster.create_job(elastic_job(checkpoint={"volume": {"persistentVolumeClaim": {"claimName": "ckpt"}}}))
    failed = wait_for("Failed", lambda: cluster.condition("Failed"))
    assert failed["reason"] == "StorageNotFound"
    assert "spec.checkpoint.volume: PersistentVolumeClaim 'ckpt' not found" in failed["message"]
    assert not any(cluster.owned().values())
    cluster.core.create_namespaced_persistent_volume_claim(
        NS,
        {
            "metadata": {"name": "ckpt"},
            "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "1Gi"}}},
        },
    )
    wait_for("the master pod", cluster.master_pod)
    assert wait_for("Failed cleared", lambda: (c := cluster.condition("Failed")) and c["status"] == "False")


def test_the_status_mirrors_the_master(cluster: Cluster, operator: Operator, masters: FakeMasters) -> None:
    cluster.create_job(elastic_job())
    _running_master(cluster, masters, running=2, goodput=0.75)
    status = cluster.job()["status"]
    assert status["nodes"]["running"] == 2
    assert status["goodput"] == 0.75
    assert status["relaunches"] == 3
    assert status["masterAddress"] == "127.0.0.7:50001"
    assert cluster.condition("MasterReady")["status"] == "True"  # type: ignore[index]
    assert "127.0.0.7:50001" in masters.targets


def test_a_failed_master_pod_is_replaced(cluster: Cluster, operator: Operator, masters: FakeMasters) -> None:
    cluster.create_job(elastic_job())
    pod = _running_master(cluster, masters)
    masters.answer = None
    cluster.set_pod_status(
        "job1-master",
        {"phase": "Failed", "containerStatuses": [_terminated(137, "OOMKilled")]},
    )
    new = wait_for("a new master pod", lambda: (p := cluster.master_pod()) and p.metadata.uid != pod.metadata.uid and p)
    assert new.status.phase == "Pending"
    assert wait_for("masterRestarts", lambda: cluster.job()["status"].get("masterRestarts") == 1)


def test_a_deleted_master_pod_is_replaced(cluster: Cluster, operator: Operator, masters: FakeMasters) -> None:
    cluster.create_job(elastic_job())
    pod = _running_master(cluster, masters)
    cluster.core.delete_namespaced_pod("job1-master", NS)
    wait_for("a new master pod", lambda: (p := cluster.master_pod()) and p.metadata.uid != pod.metadata.uid)
    assert wait_for("masterRestarts", lambda: cluster.job()["status"].get("masterRestarts") == 1)


def test_a_master_that_exits_with_the_jobs_end_is_kept(
    cluster: Cluster, operator: Operator, masters: FakeMasters
) -> None:
    cluster.create_job(elastic_job())
    pod = _running_master(cluster, masters)
    masters.answer = None
    cluster.set_pod_status(
        "job1-master",
        {"phase": "Succeeded", "containerStatuses": [_terminated(0, "Completed")]},
    )
    wait_for("Succeeded", lambda: cluster.job()["status"]["phase"] == "Succeeded")
    count = operator.reconciles
    wait_for("another pass", lambda: operator.reconciles >= count + 2)
    assert cluster.master_pod().metadata.uid == pod.metadata.uid


def test_suspend_stops_the_master_and_workers_and_resume_restarts_the_master(
    cluster: Cluster, operator: Operator, masters: FakeMasters
) -> None:
    cluster.create_job(elastic_job(master={"stateVolume": {"persistentVolumeClaim": {"claimName": "state"}}}))
    cluster.core.create_namespaced_persistent_volume_claim(NS, {"metadata": {"name": "state"}, "spec": {}})
    _running_master(cluster, masters)
    labels = {
        "app.kubernetes.io/managed-by": "dlrover",
        "elastic.dlrover.io/job": "job1",
        "elastic.dlrover.io/component": "worker",
    }
    for i in range(2):
        cluster.core.create_namespaced_pod(
            NS,
            {
                "metadata": {"name": f"job1-worker-{i}", "labels": labels},
                "spec": {"containers": [{"name": "main", "image": "x"}]},
            },
        )
    cluster.patch_job({"spec": {"suspend": True}})
    wait_for("Suspended", lambda: cluster.job()["status"]["phase"] == "Suspended")
    wait_for("no pods", lambda: not cluster.core.list_namespaced_pod(NS).items)
    assert cluster.condition("Suspended")["status"] == "True"  # type: ignore[index]
    assert cluster.owned()["service"] is not None  # the rest stays for the resume
    cluster.patch_job({"spec": {"suspend": False}})
    wait_for("the master back", cluster.master_pod)
    wait_for("Suspended False", lambda: cluster.condition("Suspended")["status"] == "False")  # type: ignore[index]
    assert cluster.job()["status"]["masterRestarts"] == 0


def test_a_template_edit_is_refused_and_a_new_max_is_resized(
    cluster: Cluster, operator: Operator, masters: FakeMasters
) -> None:
    job = elastic_job()
    job["spec"]["replicaSpecs"]["worker"]["maxReplicas"] = 4
    cluster.create_job(job)
    pod = _running_master(cluster, masters, max_nodes=4, wanted=4)
    cluster.patch_job({"spec": {"replicaSpecs": {"worker": {"maxReplicas": 3}}}})
    wait_for("the resize", lambda: masters.resizes == [3])
    template = {"spec": {"containers": [{"name": "main", "image": "new", "command": ["dlrover-run"]}]}}
    cluster.patch_job({"spec": {"replicaSpecs": {"worker": {"template": template}}}})
    refused = wait_for("refused", lambda: (c := cluster.condition("SpecChangeRefused")) and c["status"] == "True" and c)
    assert "spec.replicaSpecs.worker.template" in refused["message"]
    assert cluster.master_pod().metadata.uid == pod.metadata.uid
    assert cluster.job()["status"]["phase"] == "Running"
    assert masters.resizes == [3]


def test_an_invalid_edit_leaves_the_job_on_its_spec_and_a_deleted_master_is_still_replaced(
    cluster: Cluster, operator: Operator, masters: FakeMasters
) -> None:
    cluster.create_job(elastic_job())
    pod = _running_master(cluster, masters)
    cluster.patch_job({"spec": {"replicaSpecs": {"worker": {"template": {"spec": {"containers": []}}}}}})
    refused = wait_for("refused", lambda: (c := cluster.condition("SpecChangeRefused")) and c["status"] == "True" and c)
    assert refused["reason"] == "InvalidSpec"
    masters.answer = None
    cluster.core.delete_namespaced_pod("job1-master", NS)
    new = wait_for("a new master pod", lambda: (p := cluster.master_pod()) and p.metadata.uid != pod.metadata.uid and p)
    assert new.spec.containers[0].command == pod.spec.containers[0].command
    assert wait_for("masterRestarts", lambda: cluster.job()["status"].get("masterRestarts") == 1)
    assert cluster.condition("SpecChangeRefused")["status"] == "True"  # type: ignore[index]
    assert cluster.condition("Failed") is None


def test_a_refused_port_and_tls_edit_leaves_the_status_calls_on_what_the_master_serves(
    cluster: Cluster, operator: Operator, masters: FakeMasters
) -> None:
    cluster.create_job(elastic_job())
    _running_master(cluster, masters)
    cluster.patch_job({"spec": {"master": {"port": 6000, "tls": {"secretName": "tls"}}}})
    wait_for("refused", lambda: (c := cluster.condition("SpecChangeRefused")) and c["status"] == "True")
    polled = len(masters.targets)
    wait_for("two more status calls", lambda: len(masters.targets) >= polled + 2)
    assert set(masters.targets[polled:]) == {"127.0.0.7:50001"}
    assert not any(masters.tls[polled:])
    assert cluster.owned()["service"].spec.ports[0].port == 50001


def test_a_port_changed_while_suspended_moves_the_service_with_the_resumed_master(
    cluster: Cluster, masters: FakeMasters
) -> None:
    cluster.create_job(elastic_job())
    with client.ApiClient(client.Configuration(host=cluster.server.url)) as own_api:
        own_api.user_agent = "the-operator"  # its requests told from this test's own
        with Operator(own_api, _settings(), masters=masters) as op:  # type: ignore[arg-type]
            _running_master(cluster, masters)
            cluster.patch_job({"spec": {"suspend": True}})
            wait_for("Suspended", lambda: cluster.job()["status"]["phase"] == "Suspended")
            wait_for("no master", lambda: cluster.master_pod() is None)
            cluster.patch_job({"spec": {"suspend": False, "master": {"port": 6000}}})
            new = wait_for("the master back", cluster.master_pod)
            assert new.spec.containers[0].ports[0].container_port == 6000
            wait_for("the Service on 6000", lambda: cluster.owned()["service"].spec.ports[0].port == 6000)
        assert op.failed_watch is None
    used = {(r.group, r.rbac_resource, r.verb) for r in cluster.server.requests() if r.user_agent == "the-operator"}
    assert ("", "services", "update") in used
    assert used <= _cluster_role_rules(), used - _cluster_role_rules()


def test_an_object_of_the_jobs_name_that_another_owner_holds_is_left_alone_and_waited_out(
    cluster: Cluster, masters: FakeMasters
) -> None:
    # As a deleted job of the same name leaves it while the garbage collector works: labelled as the job's. (Made
    # before the operator starts, so its first list has it: a watch event could come after the job's.)
    labels = {"app.kubernetes.io/managed-by": "dlrover", "elastic.dlrover.io/job": "job1"}
    owner = {"apiVersion": "v1", "kind": "ConfigMap", "name": "someone", "uid": "uid-other"}
    cluster.core.create_namespaced_service(
        NS,
        {
            "metadata": {"name": "job1-master", "labels": labels, "ownerReferences": [owner]},
            "spec": {"ports": [{"port": 1234}]},
        },
    )
    with Operator(cluster.api, _settings(), masters=masters) as operator:  # type: ignore[arg-type]
        cluster.create_job(elastic_job())
        wait_for("the wait said", lambda: "another owner holds" in operator.last_reason.get("default/job1", ""))
        count = operator.reconciles
        wait_for("another pass", lambda: operator.reconciles >= count + 2)
        assert cluster.master_pod() is None
        service = cluster.owned()["service"]
        assert service.spec.ports[0].port == 1234
        assert [r.uid for r in service.metadata.owner_references] == ["uid-other"]
        cluster.core.delete_namespaced_service("job1-master", NS)
        wait_for("the master pod", cluster.master_pod)
        service = wait_for("the job's Service", lambda: cluster.owned()["service"])
        assert [r.uid for r in service.metadata.owner_references] == [cluster.job()["metadata"]["uid"]]
    assert operator.failed_watch is None


def test_a_resize_that_failed_is_sent_again(cluster: Cluster, operator: Operator, masters: FakeMasters) -> None:
    job = elastic_job()
    job["spec"]["replicaSpecs"]["worker"]["maxReplicas"] = 4
    cluster.create_job(job)
    _running_master(cluster, masters, max_nodes=4, wanted=4)
    masters.refuse_resizes = 1
    cluster.patch_job({"spec": {"replicaSpecs": {"worker": {"maxReplicas": 3}}}})
    wait_for("the resize sent again and taken", lambda: masters.resizes == [3, 3])
    wait_for(
        "the edit recorded in the spec in force",
        lambda: cluster.job()["status"]["appliedSpec"]["replicaSpecs"]["worker"]["maxReplicas"] == 3,
    )
    assert masters.resizes == [3, 3]


def test_deleting_the_job_deletes_what_it_owns(cluster: Cluster, operator: Operator) -> None:
    cluster.create_job(elastic_job())
    wait_for("every object", lambda: all(cluster.owned().values()))
    cluster.custom.delete_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, "job1")
    wait_for("nothing left", lambda: not any(cluster.owned().values()))


def test_failed_creates_and_cut_watches_are_retried(cluster: Cluster, masters: FakeMasters) -> None:
    server = cluster.server
    failing = server.faults.fail_next(3, 500, when=lambda r: r.verb == "create" and r.resource == "pods")
    with Operator(cluster.api, _settings(), masters=masters) as op:  # type: ignore[arg-type]
        server.faults.drop_watches(abrupt=True)
        cluster.create_job(elastic_job())
        wait_for("the master pod", cluster.master_pod)
        server.faults.compact()
        server.faults.drop_watches()
        cluster.core.delete_namespaced_pod("job1-master", NS)
        wait_for("the master pod again", cluster.master_pod)
    assert failing.fired == 3
    assert op.failed_watch is None


def _cluster_role_rules() -> set[tuple[str, str, str]]:
    docs = list(yaml.safe_load_all((DEPLOY / "rbac.yaml").read_text()))
    role = next(d for d in docs if d["kind"] == "ClusterRole")
    return {
        (g, r, v) for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"] for v in rule["verbs"]
    }


def test_the_operator_uses_only_what_its_cluster_role_grants(cluster: Cluster, masters: FakeMasters) -> None:
    cluster.core.create_namespaced_persistent_volume_claim(NS, {"metadata": {"name": "ckpt"}, "spec": {}})
    cluster.create_job(elastic_job(checkpoint={"volume": {"persistentVolumeClaim": {"claimName": "ckpt"}}}))
    cluster.server.clear_requests()
    with Operator(cluster.api, _settings(), masters=masters) as op:  # type: ignore[arg-type]
        # Waiting on the operator's own view: this test makes no request of its own meanwhile.
        wait_for("the master created", lambda: "master pod is not running" in op.last_reason.get("default/job1", ""))
    used = cluster.server.verbs_used()
    granted = _cluster_role_rules()
    assert used, "the operator made no request"
    assert used <= granted, used - granted
    assert ("", "pods", "create") in used
    assert ("elastic.dlrover.io", "elasticjobs/status", "update") in used


def test_the_operator_command_runs_against_a_kubeconfig(cluster: Cluster, tmp_path: Path) -> None:
    kubeconfig = cluster.server.write_kubeconfig(tmp_path / "kubeconfig")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    env.pop("KUBERNETES_SERVICE_HOST", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "dlrover.master.operator.cli", "--kubeconfig", str(kubeconfig), "--namespace", NS,
         "--master-image", "dlrover:cli", "--master-fs-group", "1000", "--status-interval-s", "0.5"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    try:
        cluster.create_job(elastic_job())
        pod = wait_for("the master pod", cluster.master_pod)
        assert pod.spec.containers[0].image == "dlrover:cli"
        assert pod.spec.security_context.fs_group == 1000
    finally:
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0, out
    assert "watching ElasticJobs" in out
