"""The Kubernetes backend against the test API server and its kubelet: real pods as local processes.

Faults come from the kubelet (a lost node, an eviction, a preemption, the kernel's OOM killer at a
container's memory limit) and from the API server (dropped watches, 410 Gone).
"""

# ruff: noqa: F811 (pytest fixtures imported by name are parameters of the tests)
from __future__ import annotations

import base64
import re
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from dlrover_testsupport.kube.cluster import KubeCluster
from dlrover_testsupport.kube.fixtures import kube_cluster  # noqa: F401 (a fixture)

from dlrover.autoscale import Resources, Role
from dlrover.common import ConfigError
from dlrover.master.kube import WatchSettings, names
from dlrover.master.scheduler.base import (
    REASON_DELETED,
    REASON_QUOTA_EXCEEDED,
    AdoptsNodes,
    BackendUnavailableError,
    HandsOverNodes,
    NodeRejectedError,
    NodeSpec,
    ObservedNode,
    ObservedState,
    SchedulerError,
)
from dlrover.master.scheduler.kubernetes import (
    KILL_GRACE_S,
    VERBS_USED,
    VERBS_USED_BY_TF_TASKS,
    KubernetesScheduler,
    KubernetesSettings,
    WorkerTemplate,
    read_worker_template,
)

kubernetes = pytest.importorskip("kubernetes")

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

NS = "default"
JOB = "j"
WAIT_S = 120.0
# A stand-in agent: sleeps SLEEP seconds (default: until stopped), then exits with EXIT; with HOG, first
# holds that many MiB.
AGENT = (
    "import os, sys, time\n"
    "hog = bytearray(int(os.environ.get('HOG', '0')) * 1024 * 1024)\n"
    "for i in range(0, len(hog), 4096): hog[i] = 1\n"
    "time.sleep(float(os.environ.get('SLEEP', '3600')))\n"
    "sys.exit(int(os.environ.get('EXIT', '0')))\n"
)


def template(command: list[str] | None = None) -> dict[str, Any]:
    return {
        "spec": {
            "containers": [{"name": "main", "image": "dlrover", "command": command or [sys.executable, "-c", AGENT]}]
        }
    }


def settings(**kw: Any) -> KubernetesSettings:
    fast = WatchSettings(backoff_initial_s=0.05, backoff_max_s=0.5, watch_timeout_s=30)
    return KubernetesSettings(
        namespace=NS, job=JOB, master_address="127.0.0.1:1", watch=fast, pod_deletion_grace_s=2, **kw
    )


def make_secret(core: Any) -> None:
    token = base64.b64encode(b"t" * 43).decode()
    core.create_namespaced_secret(NS, {"metadata": {"name": names.token_secret_name(JOB)}, "data": {"token": token}})


@pytest.fixture
def core(kube_cluster: KubeCluster) -> Iterator[Any]:
    with kubernetes.client.ApiClient(kubernetes.client.Configuration(host=kube_cluster.url)) as api:
        api_core = kubernetes.client.CoreV1Api(api)
        make_secret(api_core)
        yield api_core


@pytest.fixture
def make_backend(kube_cluster: KubeCluster, core: Any) -> Iterator[Callable[..., KubernetesScheduler]]:
    made: list[KubernetesScheduler] = []

    def make(worker: WorkerTemplate | None = None, **kw: Any) -> KubernetesScheduler:
        api = kubernetes.client.ApiClient(kubernetes.client.Configuration(host=kube_cluster.url))
        backend = KubernetesScheduler(api, settings(**kw), worker or WorkerTemplate(template()), owns_client=True)
        made.append(backend)
        return backend

    yield make
    for backend in made:
        backend.close()


def node(node_id: int, **env: str) -> NodeSpec:
    return NodeSpec(JOB, node_id, node_id, env=env)


def state_is(node_id: int, *states: ObservedState) -> Callable[[Mapping[int, ObservedNode]], bool]:
    return lambda seen: node_id in seen and seen[node_id].state in states


def wait(
    backend: KubernetesScheduler, predicate: Callable[[Mapping[int, ObservedNode]], bool]
) -> Mapping[int, ObservedNode]:
    assert backend.wait_for(predicate, WAIT_S), f"not reached; observed {dict(backend.observe())}"
    return backend.observe()


def read_pod(core: Any, node_id: int) -> dict[str, Any]:
    response = core.read_namespaced_pod(names.worker_pod_name(JOB, node_id), NS, _preload_content=False)
    import json

    return dict(json.loads(response.data))


def test_pods_run_exit_and_stop(
    make_backend: Callable[..., KubernetesScheduler], kube_cluster: KubeCluster, core: Any
) -> None:
    backend = make_backend()
    backend.launch(node(0))
    backend.launch(node(1, SLEEP="0", EXIT="3"))
    backend.launch(node(2, SLEEP="0", EXIT="0"))
    seen = wait(
        backend,
        lambda s: (
            state_is(0, ObservedState.RUNNING)(s)
            and state_is(1, ObservedState.FAILED)(s)
            and state_is(2, ObservedState.SUCCEEDED)(s)
        ),
    )
    assert seen[0].host in kube_cluster.kubelet.node_names
    assert (seen[1].exit_code, seen[1].disruption) == (3, False)
    assert seen[2].exit_code == 0
    pod = read_pod(core, 0)
    env = {e["name"]: e for e in pod["spec"]["containers"][0]["env"]}
    assert env["DLROVER_JOB_TOKEN"]["valueFrom"]["secretKeyRef"] == {"name": "j-token", "key": "token"}
    pid = kube_cluster.kubelet.pid(names.worker_pod_name(JOB, 0))
    assert pid is not None
    backend.stop(0)
    seen = wait(backend, state_is(0, ObservedState.STOPPED))
    # The pod is deleted once the kubelet has stopped its process.
    assert backend.wait_for(lambda _: kube_cluster.kubelet.pid(names.worker_pod_name(JOB, 0)) is None, WAIT_S)
    assert backend.wait_for(
        lambda s: names.worker_pod_name(JOB, 0) not in [p.metadata.name for p in core.list_namespaced_pod(NS).items],
        WAIT_S,
    )


def test_adopted_nodes_whose_pods_are_gone_are_disruptions_at_once_and_the_others_are_followed(
    make_backend: Callable[..., KubernetesScheduler], kube_cluster: KubeCluster
) -> None:
    first = make_backend()
    first.launch(node(0))
    first.launch(node(1))
    wait(first, lambda s: state_is(0, ObservedState.RUNNING)(s) and state_is(1, ObservedState.RUNNING)(s))
    first.detach()  # the master is replaced: its pods stay
    # While no master watches, node 1's pod is deleted; node 2 was journaled but its pod never created.
    core = kubernetes.client.CoreV1Api(
        kubernetes.client.ApiClient(kubernetes.client.Configuration(host=kube_cluster.url))
    )
    core.delete_namespaced_pod(names.worker_pod_name(JOB, 1), NS, grace_period_seconds=0)
    successor = make_backend()
    assert isinstance(successor, AdoptsNodes)
    successor.adopt([0, 1, 2])
    seen = successor.observe()  # at once: no event, no timeout needed
    assert seen[0].state is ObservedState.RUNNING
    for gone in (1, 2):
        assert seen[gone].state is ObservedState.FAILED
        assert (seen[gone].reason, seen[gone].disruption) == (REASON_DELETED, True)
        assert f"{names.worker_pod_name(JOB, gone)} of node {gone} was gone when the master resumed" in (
            seen[gone].evidence
        )
    successor.adopt([0, 1])  # known ids are left as they are
    assert successor.observe()[1] == seen[1]
    successor.stop(1)  # the master's own stop of a node it relaunches: a stop, not a second disruption
    assert successor.observe()[1].state is ObservedState.STOPPED
    successor.stop(0)
    wait(successor, state_is(0, ObservedState.STOPPED))
    core.api_client.close()


def test_a_watch_whose_handler_failed_is_started_again_and_its_relist_shows_what_went_meanwhile(
    make_backend: Callable[..., KubernetesScheduler], kube_cluster: KubeCluster, core: Any
) -> None:
    backend = make_backend()
    backend.launch(node(0))
    backend.launch(node(1))
    wait(backend, lambda s: state_is(0, ObservedState.RUNNING)(s) and state_is(1, ObservedState.RUNNING)(s))
    failed: list[bool] = []

    def fails_once() -> None:
        if not failed:
            failed.append(True)
            raise RuntimeError("a listener's defect")

    backend.on_change(fails_once)
    core.patch_namespaced_pod(names.worker_pod_name(JOB, 0), NS, {"metadata": {"labels": {"touched": "yes"}}})
    deadline = time.monotonic() + WAIT_S
    while backend._watcher.running and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not backend._watcher.running, "the handler's failure ended the watch"
    # While no watch runs, node 1's pod is deleted: the frozen cache would show it running for ever.
    core.delete_namespaced_pod(names.worker_pod_name(JOB, 1), NS, grace_period_seconds=0)
    backend.observe()  # notices the dead watch and starts another
    seen = wait(backend, state_is(1, ObservedState.FAILED))
    assert (seen[1].reason, seen[1].disruption) == (REASON_DELETED, True)
    assert seen[0].state is ObservedState.RUNNING
    assert backend._watcher.running
    backend.launch(node(2, SLEEP="0", EXIT="3"))  # and the new watch follows what happens next
    assert wait(backend, state_is(2, ObservedState.FAILED))[2].exit_code == 3


QUOTA = 'pods "j-worker-0" is forbidden: exceeded quota: q, requested: pods=1, used: pods=2, limited: pods=2'


def test_a_create_refused_for_quota_is_pending_with_the_apis_message_and_retried_at_each_observation(
    make_backend: Callable[..., KubernetesScheduler], kube_cluster: KubeCluster
) -> None:
    backend = make_backend()
    creates = lambda r: r.resource == "pods" and r.verb == "create"  # noqa: E731
    kube_cluster.server.faults.fail_next(2, 403, when=creates, message=QUOTA)
    backend.launch(node(0))  # not an error: the node waits for room
    seen = backend.observe()[0]  # the retry here is refused again
    assert (seen.state, seen.reason, seen.disruption) == (ObservedState.PENDING, REASON_QUOTA_EXCEEDED, False)
    assert QUOTA in seen.evidence
    # The master observes at every tick: the next observation's create goes through.
    deadline = time.monotonic() + WAIT_S
    while backend.observe()[0].state is not ObservedState.RUNNING:
        assert time.monotonic() < deadline, f"not running: {backend.observe()}"
        time.sleep(0.1)
    codes = [r.code for r in kube_cluster.server.requests() if creates(r)]
    assert codes == [403, 403, 201]


def test_a_forbidden_create_that_is_not_quota_and_an_invalid_pod_are_errors(
    make_backend: Callable[..., KubernetesScheduler], kube_cluster: KubeCluster
) -> None:
    backend = make_backend()
    creates = lambda r: r.resource == "pods" and r.verb == "create"  # noqa: E731
    kube_cluster.server.faults.fail_next(1, 403, when=creates, message='pods is forbidden: User "x" cannot create')
    with pytest.raises(SchedulerError, match="403") as forbidden:
        backend.launch(node(0))
    assert not isinstance(forbidden.value, NodeRejectedError)
    invalid = 'Pod "j-worker-1" is invalid: spec.containers[0].resources.requests: Invalid value: "2": must be <= 1'
    kube_cluster.server.faults.fail_next(1, 422, when=creates, message=invalid)
    with pytest.raises(NodeRejectedError, match=re.escape(invalid)):
        backend.launch(node(1))
    assert backend.observe() == {}  # neither node is held
    backend.launch(node(1))  # nothing of the refused launch is left behind


def test_a_lost_node_is_a_disruption_and_the_relaunch_avoids_it(
    make_backend: Callable[..., KubernetesScheduler], kube_cluster: KubeCluster, core: Any
) -> None:
    backend = make_backend()
    backend.launch(node(0))
    host = wait(backend, state_is(0, ObservedState.RUNNING))[0].host
    assert backend.placed_host(0) == host
    assert backend.placed_host(99) == ""
    kube_cluster.kubelet.lose_node(host)
    lost = wait(backend, state_is(0, ObservedState.FAILED))[0]
    assert (lost.reason, lost.disruption, lost.host) == ("NodeLost", True, host)
    assert "NodeLost" in lost.evidence
    backend.launch(NodeSpec(JOB, 1, 0, relaunch_count=1, avoid_hosts=frozenset({host})))
    moved = wait(backend, state_is(1, ObservedState.RUNNING))[1]
    assert moved.host != host
    terms = read_pod(core, 1)["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][
        "nodeSelectorTerms"
    ]
    assert {"key": "kubernetes.io/hostname", "operator": "NotIn", "values": [host]} in terms[0]["matchExpressions"]


def test_an_evicted_pod_is_a_disruption(
    make_backend: Callable[..., KubernetesScheduler], kube_cluster: KubeCluster
) -> None:
    backend = make_backend()
    backend.launch(node(0))
    wait(backend, state_is(0, ObservedState.RUNNING))
    kube_cluster.kubelet.evict(names.worker_pod_name(JOB, 0))
    seen = wait(backend, state_is(0, ObservedState.FAILED))[0]
    assert (seen.reason, seen.disruption) == ("Evicted", True)


def test_a_preempted_pod_is_a_disruption(
    make_backend: Callable[..., KubernetesScheduler], kube_cluster: KubeCluster
) -> None:
    backend = make_backend()
    backend.launch(node(0))
    wait(backend, state_is(0, ObservedState.RUNNING))
    kube_cluster.kubelet.preempt(names.worker_pod_name(JOB, 0))
    seen = wait(backend, state_is(0, ObservedState.FAILED))[0]
    assert (seen.reason, seen.disruption) == ("Preempted", True)


def test_a_container_over_its_memory_limit_is_oom_killed(
    make_backend: Callable[..., KubernetesScheduler], kube_cluster: KubeCluster, core: Any
) -> None:
    if not kube_cluster.kubelet.memory_enforced:
        pytest.skip(f"the test kubelet cannot enforce memory here: {kube_cluster.kubelet.memory_enforcement}")
    backend = make_backend(node_state_mb=1)
    backend.launch(NodeSpec(JOB, 0, 0, env={"HOG": "400"}, resources=Resources(cpu=1, memory_mb=100)))
    seen = wait(backend, state_is(0, ObservedState.FAILED))[0]
    assert (seen.reason, seen.exit_code, seen.disruption) == ("OOMKilled", 137, False)
    limits = read_pod(core, 0)["spec"]["containers"][0]["resources"]["limits"]
    assert limits["memory"] == "102Mi"  # 100 MiB for the node plus two 1 MiB snapshots in /dev/shm


def test_an_unschedulable_pod_is_pending_with_the_schedulers_message(
    make_backend: Callable[..., KubernetesScheduler],
) -> None:
    backend = make_backend()
    backend.launch(NodeSpec(JOB, 0, 0, resources=Resources(cpu=64, memory_mb=100)))
    seen = wait(backend, lambda s: 0 in s and s[0].reason == "Unschedulable")[0]
    assert seen.state is ObservedState.PENDING
    assert "cpu" in seen.evidence


def test_a_pod_without_its_token_secret_waits_and_says_why(
    make_backend: Callable[..., KubernetesScheduler], core: Any
) -> None:
    core.delete_namespaced_secret(names.token_secret_name(JOB), NS)
    backend = make_backend()
    backend.launch(node(0))
    seen = wait(backend, lambda s: 0 in s and s[0].reason == "CreateContainerConfigError")[0]
    assert seen.state is ObservedState.PENDING
    assert names.token_secret_name(JOB) in seen.evidence


def test_pod_writes_are_retried_then_a_launch_fails_cleanly(
    make_backend: Callable[..., KubernetesScheduler], kube_cluster: KubeCluster
) -> None:
    backend = make_backend(request_retries=2)
    faults = kube_cluster.server.faults
    creates = faults.fail_next(2, 500, when=lambda r: r.verb == "create" and r.resource == "pods")
    backend.launch(node(0))  # two 500s, then created
    assert creates.fired == 2
    wait(backend, state_is(0, ObservedState.RUNNING))
    faults.fail_next(3, 500, when=lambda r: r.verb == "create" and r.resource == "pods")
    with pytest.raises(SchedulerError, match="create pod j-worker-1: 500"):
        backend.launch(node(1))
    assert 1 not in backend.observe()  # refused: nothing changed
    deletes = faults.fail_next(3, 500, when=lambda r: r.verb == "delete")
    backend.stop(0)  # every attempt refused: retried at the next observation
    assert deletes.fired == 3
    assert kube_cluster.kubelet.pid(names.worker_pod_name(JOB, 0)) is not None
    assert backend.observe()[0].state is ObservedState.STOPPED  # and the delete is sent again
    assert backend.wait_for(lambda _: kube_cluster.kubelet.pid(names.worker_pod_name(JOB, 0)) is None, WAIT_S)


def test_detach_leaves_the_pods_to_a_successor_which_adopts_them(
    make_backend: Callable[..., KubernetesScheduler], kube_cluster: KubeCluster
) -> None:
    first = make_backend()
    assert isinstance(first, HandsOverNodes)
    first.launch(node(0))
    wait(first, state_is(0, ObservedState.RUNNING))
    pid = kube_cluster.kubelet.pid(names.worker_pod_name(JOB, 0))
    first.detach()
    first.close()  # after a detach: deletes nothing
    successor = make_backend()
    seen = successor.observe()
    assert seen[0].state is ObservedState.RUNNING  # adopted from the first list
    assert kube_cluster.kubelet.pid(names.worker_pod_name(JOB, 0)) == pid
    successor.stop(0)  # an adopted pod is stopped like any other
    assert successor.wait_for(lambda _: kube_cluster.kubelet.pid(names.worker_pod_name(JOB, 0)) is None, WAIT_S)


def test_watch_faults_lose_no_pod_event(
    make_backend: Callable[..., KubernetesScheduler], kube_cluster: KubeCluster
) -> None:
    backend = make_backend()
    faults = kube_cluster.server.faults
    expected: dict[int, tuple[ObservedState, int | None]] = {}
    for i in range(6):
        code = i % 3  # 0: succeeded; 1, 2: failed with that code
        backend.launch(node(i, SLEEP="0", EXIT=str(code)))
        expected[i] = (ObservedState.SUCCEEDED if code == 0 else ObservedState.FAILED, code)
        if i % 2:
            faults.drop_watches(abrupt=True)
        else:
            faults.fail_next(1, 410, when=lambda r: r.is_watch and r.resource == "pods")
            faults.drop_watches()
    seen = wait(
        backend,
        lambda s: all(
            nid in s and s[nid].state is not ObservedState.PENDING and s[nid].state is not ObservedState.RUNNING
            for nid in expected
        ),
    )
    assert {nid: (n.state, n.exit_code) for nid, n in seen.items()} == expected
    stats = backend.list_watch.stats
    assert stats.resumes >= 1
    assert stats.relists >= 1


def test_the_elastic_job_is_read_and_owns_the_pods(kube_cluster: KubeCluster, core: Any, tmp_path: Path) -> None:
    with kubernetes.client.ApiClient(kubernetes.client.Configuration(host=kube_cluster.url)) as api:
        kubernetes.client.ApiextensionsV1Api(api).create_custom_resource_definition(elastic_job_crd())
        job = kubernetes.client.CustomObjectsApi(api).create_namespaced_custom_object(
            names.CRD_GROUP, names.CRD_VERSION, NS, names.CRD_PLURAL, elastic_job(template())
        )
    kubeconfig = kube_cluster.write_kubeconfig(tmp_path / "kubeconfig")
    kube_cluster.server.clear_requests()
    backend = KubernetesScheduler.from_cluster(settings(kubeconfig=str(kubeconfig)))
    try:
        backend.launch(node(0))
        wait(backend, state_is(0, ObservedState.RUNNING))
        pod = backend.list_watch.objects()[f"{NS}/{names.worker_pod_name(JOB, 0)}"]
        owner = pod["metadata"]["ownerReferences"][0]
        assert (owner["kind"], owner["name"], owner["uid"]) == ("ElasticJob", JOB, job["metadata"]["uid"])
        backend.stop(0)
        wait(backend, state_is(0, ObservedState.STOPPED))
    finally:
        backend.close()
    assert backend.observe()[0].state is ObservedState.STOPPED
    # The master's Role grants exactly what the backend calls, in its namespace only.
    used = {(r.group, r.rbac_resource, r.verb) for r in kube_cluster.server.requests()}
    assert used == VERBS_USED
    assert {r.namespace for r in kube_cluster.server.requests()} == {NS}


def test_a_passing_failure_to_read_the_elastic_job_is_retried(kube_cluster: KubeCluster, tmp_path: Path) -> None:
    # A replacement master must not fail its job for a hiccup: two 503s, then the read succeeds.
    with kubernetes.client.ApiClient(kubernetes.client.Configuration(host=kube_cluster.url)) as api:
        kubernetes.client.ApiextensionsV1Api(api).create_custom_resource_definition(elastic_job_crd())
        kubernetes.client.CustomObjectsApi(api).create_namespaced_custom_object(
            names.CRD_GROUP, names.CRD_VERSION, NS, names.CRD_PLURAL, elastic_job(template())
        )
    kubeconfig = kube_cluster.write_kubeconfig(tmp_path / "kubeconfig")
    kube_cluster.server.clear_requests()
    kube_cluster.server.faults.fail_next(2, 503, when=lambda r: r.resource == names.CRD_PLURAL and r.verb == "get")
    backend = KubernetesScheduler.from_cluster(settings(kubeconfig=str(kubeconfig)))
    backend.close()
    reads = [r.code for r in kube_cluster.server.requests() if r.resource == names.CRD_PLURAL and r.verb == "get"]
    assert reads == [503, 503, 200]


def test_a_read_of_the_elastic_job_failing_past_its_retries_is_a_passing_unavailability(
    kube_cluster: KubeCluster, tmp_path: Path
) -> None:
    # dlrover-master exits 75 ("retry") for it, not 2: the configuration is fine, the API server is not.
    with kubernetes.client.ApiClient(kubernetes.client.Configuration(host=kube_cluster.url)) as api:
        kubernetes.client.ApiextensionsV1Api(api).create_custom_resource_definition(elastic_job_crd())
        kubernetes.client.CustomObjectsApi(api).create_namespaced_custom_object(
            names.CRD_GROUP, names.CRD_VERSION, NS, names.CRD_PLURAL, elastic_job(template())
        )
    kubeconfig = kube_cluster.write_kubeconfig(tmp_path / "kubeconfig")
    kube_cluster.server.faults.fail_next(50, 503, when=lambda r: r.resource == names.CRD_PLURAL and r.verb == "get")
    # (Every read fails: urllib3 itself may retry a 503 that carries Retry-After.)
    with pytest.raises(BackendUnavailableError, match=f"cannot read the ElasticJob {NS}/{JOB} .*3 attempts.*503"):
        KubernetesScheduler.from_cluster(settings(kubeconfig=str(kubeconfig), request_retries=2)).close()


def test_a_missing_elastic_job_is_a_clear_error(kube_cluster: KubeCluster, tmp_path: Path) -> None:
    kubeconfig = kube_cluster.write_kubeconfig(tmp_path / "kubeconfig")
    with pytest.raises(ConfigError, match=f"cannot read the ElasticJob {NS}/{JOB}: 404"):
        KubernetesScheduler.from_cluster(settings(kubeconfig=str(kubeconfig)))


def elastic_job_crd() -> dict[str, Any]:
    """A minimal ElasticJob CRD (the operator ships the full schema)."""
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": names.CRD_NAME},
        "spec": {
            "group": names.CRD_GROUP,
            "scope": "Namespaced",
            "names": {
                "plural": names.CRD_PLURAL,
                "singular": names.CRD_SINGULAR,
                "kind": names.CRD_KIND,
                "shortNames": [names.CRD_SHORT_NAME],
            },
            "versions": [
                {
                    "name": names.CRD_VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}},
                }
            ],
        },
    }


def elastic_job(worker_template: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": names.api_version(),
        "kind": names.CRD_KIND,
        "metadata": {"name": JOB, "namespace": NS},
        "spec": {"replicaSpecs": {"worker": {"template": worker_template}}},
    }


# ---------------------------------------------------------------- a parameter-server job's tasks

# A stand-in task: writes what its peer's DNS name became and its HOSTNAME to <dir>/<pod name>, then waits.
TASK = (
    "import os, pathlib, sys, time\n"
    "pathlib.Path(sys.argv[1], os.environ['POD_NAME']).write_text(os.environ['PEER'] + ' ' + "
    "os.environ['HOSTNAME'])\n"
    "time.sleep(3600)\n"
)


def test_a_ps_jobs_tasks_keep_their_dns_names_through_relaunches(
    make_backend: Callable[..., KubernetesScheduler], kube_cluster: KubeCluster, core: Any, tmp_path: Path
) -> None:
    task = template([sys.executable, "-c", TASK, str(tmp_path)])
    backend = make_backend(WorkerTemplate(template(), roles={"chief": task, "ps": task}), tf_tasks=True)
    peer = f"{backend.task_host('ps', 0)}:2345"
    assert peer == "j-ps-0.j-tasks.default.svc:2345"
    service = core.read_namespaced_service(names.task_service_name(JOB), NS)
    assert (service.spec.cluster_ip, service.spec.publish_not_ready_addresses) == ("None", True)

    def run(node_id: int, role: Role, index: int) -> tuple[str, str]:
        backend.launch(NodeSpec(JOB, node_id, index, env={"PEER": peer}, role=role))
        pod = f"j-{role.value}-{index}-{node_id}"
        written = tmp_path / pod
        deadline = time.monotonic() + WAIT_S
        while len(written.read_text().split() if written.exists() else ()) < 2:
            seen = backend.observe().get(node_id)
            if time.monotonic() > deadline or (seen is not None and seen.state is ObservedState.FAILED):
                log = kube_cluster.kubelet.read_log(NS, pod)
                raise AssertionError(f"node {node_id} did not start: {seen}\n{log}")
            time.sleep(0.05)
        address, hostname = written.read_text().split()
        return address, hostname

    chief_sees, chief_host = run(0, Role.CHIEF, 0)
    _, ps_host = run(1, Role.PS, 0)
    assert (chief_host, ps_host) == ("j-chief-0", "j-ps-0")
    ps_pod = core.read_namespaced_pod("j-ps-0-1", NS)
    assert chief_sees == f"{ps_pod.status.pod_ip}:2345"
    # The server is lost and relaunched as another node (another pod), and the chief after it: both answer and
    # dial where they did.
    kube_cluster.server.clear_requests()
    backend.kill(1)
    backend.kill(0)
    wait(backend, lambda s: state_is(1, ObservedState.STOPPED)(s) and state_is(0, ObservedState.STOPPED)(s))
    # Killed with the least grace, not none: the API keeps each pod until its processes ended, so the next
    # incarnation never runs beside the old one.
    deletes = [r for r in kube_cluster.server.requests() if r.verb == "delete" and r.resource == "pods"]
    assert [(r.name, r.query.get("gracePeriodSeconds")) for r in deletes] == [
        ("j-ps-0-1", [str(KILL_GRACE_S)]),
        ("j-chief-0-0", [str(KILL_GRACE_S)]),
    ]
    run(2, Role.PS, 0)
    again, _ = run(3, Role.CHIEF, 0)
    assert core.read_namespaced_pod("j-ps-0-2", NS).status.pod_ip == ps_pod.status.pod_ip
    assert again == chief_sees


def test_a_ps_jobs_backend_creates_its_task_service_owned_by_the_job(
    kube_cluster: KubeCluster, core: Any, tmp_path: Path
) -> None:
    with kubernetes.client.ApiClient(kubernetes.client.Configuration(host=kube_cluster.url)) as api:
        kubernetes.client.ApiextensionsV1Api(api).create_custom_resource_definition(elastic_job_crd())
        body = elastic_job(template())
        body["spec"]["replicaSpecs"].update({"chief": {"template": template()}, "ps": {"template": template()}})
        job = kubernetes.client.CustomObjectsApi(api).create_namespaced_custom_object(
            names.CRD_GROUP, names.CRD_VERSION, NS, names.CRD_PLURAL, body
        )
    kubeconfig = kube_cluster.write_kubeconfig(tmp_path / "kubeconfig")
    kube_cluster.server.clear_requests()
    backend = KubernetesScheduler.from_cluster(settings(kubeconfig=str(kubeconfig), tf_tasks=True))
    try:
        assert set(backend.templates.roles) == {"chief", "ps"}
        backend.launch(NodeSpec(JOB, 0, 0, role=Role.PS))
        wait(backend, state_is(0, ObservedState.RUNNING))
        backend.stop(0)
        wait(backend, state_is(0, ObservedState.STOPPED))
    finally:
        backend.close()
    # A second backend of the job (a master restarted) finds the Service there and keeps it.
    again = KubernetesScheduler.from_cluster(settings(kubeconfig=str(kubeconfig), tf_tasks=True))
    again.close()
    used = {(r.group, r.rbac_resource, r.verb) for r in kube_cluster.server.requests()}
    assert used == VERBS_USED_BY_TF_TASKS
    service = core.read_namespaced_service(names.task_service_name(JOB), NS)
    assert service.metadata.owner_references[0].uid == job["metadata"]["uid"]


def test_a_stopped_tf_task_reads_running_until_its_pod_has_ended(
    make_backend: Callable[..., KubernetesScheduler], tmp_path: Path
) -> None:
    # The task ignores SIGTERM, so its pod lives through the whole grace (2 s) whatever the machine's load.
    stubborn = template([sys.executable, "-c", "import pathlib, signal, sys, time\n"
                         "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
                         "pathlib.Path(sys.argv[1]).touch()\n"
                         "time.sleep(3600)\n", str(tmp_path / "up")])  # fmt: skip
    backend = make_backend(WorkerTemplate(template(), roles={"ps": stubborn}), tf_tasks=True)
    backend.launch(NodeSpec(JOB, 0, 0, role=Role.PS))
    deadline = time.monotonic() + WAIT_S
    while not (tmp_path / "up").exists():
        assert time.monotonic() < deadline, f"the task did not start: {dict(backend.observe())}"
        time.sleep(0.05)
    wait(backend, state_is(0, ObservedState.RUNNING))
    backend.stop(0)
    # Still running after the stop: the task's next pod (same DNS name) must wait for it.
    assert backend.observe()[0].state is ObservedState.RUNNING
    wait(backend, state_is(0, ObservedState.STOPPED))


def test_a_task_service_name_taken_by_another_service_is_refused(kube_cluster: KubeCluster, core: Any) -> None:
    core.create_namespaced_service(NS, {"metadata": {"name": names.task_service_name(JOB)},
                                        "spec": {"selector": {"app": "other"}, "ports": [{"port": 80}]}})  # fmt: skip
    config = kubernetes.client.Configuration(host=kube_cluster.url)
    with kubernetes.client.ApiClient(config) as api, pytest.raises(ConfigError, match="not this job's headless"):
        KubernetesScheduler(api, settings(tf_tasks=True), WorkerTemplate(template()))


def test_a_stopped_tf_task_on_a_lost_node_counts_as_ended_past_its_grace(
    make_backend: Callable[..., KubernetesScheduler], kube_cluster: KubeCluster
) -> None:
    # No kubelet confirms the deletion of a pod on a lost node: it would read running for ever.
    backend = make_backend(WorkerTemplate(template(), roles={"ps": template()}), tf_tasks=True, lost_pod_margin_s=0.5)
    backend.launch(NodeSpec(JOB, 0, 0, role=Role.PS))
    seen = wait(backend, state_is(0, ObservedState.RUNNING))
    kube_cluster.kubelet.lose_node(seen[0].host, unreachable=True)  # its pods stay Running, deleted or not
    backend.stop(0)
    assert backend.observe()[0].state is ObservedState.RUNNING
    deadline = time.monotonic() + WAIT_S  # nothing happens to the pod any more: look until the margin has passed
    while backend.observe()[0].state is not ObservedState.STOPPED:
        assert time.monotonic() < deadline, backend.observe()
        time.sleep(0.1)


class _OneJob:
    """A CustomObjectsApi that answers one ElasticJob."""

    def __init__(self, job: dict[str, Any]) -> None:
        self.job = job

    def get_namespaced_custom_object(self, *_args: Any, **_kw: Any) -> dict[str, Any]:
        return self.job


def test_the_templates_come_from_the_spec_in_force_where_the_operator_keeps_one() -> None:
    job = elastic_job(template(["python", "edited.py"]))
    job["metadata"]["uid"] = "u1"
    # No operator (or none yet): the spec.
    assert read_worker_template(_OneJob(job), settings()).template == template(["python", "edited.py"])
    # An operator refused the edit: a master it starts launches pods from the spec the job runs on.
    job["status"] = {names.APPLIED_SPEC_STATUS: elastic_job(template(["python", "train.py"]))["spec"]}
    read = read_worker_template(_OneJob(job), settings())
    assert read.template == template(["python", "train.py"])
    assert read.job_uid == "u1"
