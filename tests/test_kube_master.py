"""A real `dlrover-master --backend kubernetes` runs an ElasticJob's worker pods on the test API server and its
kubelet: each pod runs a real `dlrover-run` agent (and its training process) that registers with the master.

- a worker killed for memory: the node is relaunched with more memory, in the new pod's spec, and finishes;
- a node lost: the new pod carries the anti-affinity, lands on another node, and finishes;
- a pod evicted: relaunched although the job allows no relaunch and no failure (a disruption is not charged);
- a worker no node can hold: announced with the scheduler's message, and the job below its minimum stops, saying why.

In the last two the master's pod watches are dropped, cut and answered 410 throughout: no pod event is lost.

Only against the test API server (see testsupport/README.md for what differs from a real cluster).
"""

# ruff: noqa: F811 (pytest fixtures imported by name are parameters of the tests)
from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from dlrover_testsupport.kube.cluster import KubeCluster
from dlrover_testsupport.kube.fixtures import kube_cluster  # noqa: F401 (a fixture)
from dlrover_testsupport.kube.kubelet import SimNode

from dlrover.common import DLRoverError, generate_token, write_token_file
from dlrover.master import MasterClient, read_event_log
from dlrover.master.kube import names

kubernetes = pytest.importorskip("kubernetes")

pytestmark = [pytest.mark.integration, pytest.mark.timeout(400)]

NS = "default"
JOB = "j"
WAIT_S = 240.0
# The first attempt of a node marks that it ran, then does what FIRST says; later attempts finish.
SCRIPT = textwrap.dedent(
    """
    import os, sys, time
    out = sys.argv[1]
    marker = os.path.join(out, "attempted")
    if not os.path.exists(marker):
        open(marker, "w").close()
        if os.environ.get("FIRST") == "wait":
            while not os.path.exists(os.path.join(out, "release")):
                time.sleep(0.1)
            with open(os.path.join(out, "done"), "w") as f:
                f.write(os.environ.get("POD_NAME", ""))
            sys.exit(0)
        if os.environ.get("FIRST") == "hog":
            hog = bytearray(900 * 1024 * 1024)
            for i in range(0, len(hog), 4096):
                hog[i] = 1
        time.sleep(600)  # until the test's fault ends it
        sys.exit(3)
    with open(os.path.join(out, "done"), "w") as f:
        f.write(os.environ.get("POD_NAME", ""))
    """
)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for(predicate: Callable[[], bool], what: str, timeout_s: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def crd() -> dict[str, Any]:
    version = {
        "name": names.CRD_VERSION,
        "served": True,
        "storage": True,
        "subresources": {"status": {}},
        "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}},
    }
    kind = {"plural": names.CRD_PLURAL, "singular": names.CRD_SINGULAR, "kind": names.CRD_KIND}
    spec = {"group": names.CRD_GROUP, "scope": "Namespaced", "names": kind, "versions": [version]}
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": names.CRD_NAME},
        "spec": spec,
    }


class Job:
    """An ElasticJob on the test cluster and the master process running it."""

    def __init__(self, cluster: KubeCluster, tmp_path: Path, procs: list[subprocess.Popen[str]]) -> None:
        self.cluster = cluster
        self.tmp = tmp_path
        self.procs = procs
        self.out = tmp_path / "out"
        self.out.mkdir()
        self.state = tmp_path / "state"
        self.log = tmp_path / "master.log"
        self.api = kubernetes.client.ApiClient(kubernetes.client.Configuration(host=cluster.url))
        self.core = kubernetes.client.CoreV1Api(self.api)
        self.proc: subprocess.Popen[str] | None = None
        self.cmd: list[str] = []

    def start(self, *flags: str, first: str = "", nnodes: str = "1") -> None:
        script = self.tmp / "train.py"
        script.write_text(SCRIPT)
        agent = [
            sys.executable, "-m", "dlrover.launcher.cli", f"--nnodes={nnodes}", "--nproc-per-node=1",
            "--local-addr=127.0.0.1", "--monitor-interval=0.1", "--heartbeat-interval=0.5", "--prewarm=none",
            "--max-restarts=0", str(script), str(self.out),
        ]  # fmt: skip
        container = {"name": "main", "image": "dlrover", "command": agent, "env": [{"name": "FIRST", "value": first}]}
        token = generate_token()
        token_file = write_token_file(self.tmp / "token", token)
        secret = {
            "metadata": {"name": names.token_secret_name(JOB)},
            "data": {"token": base64.b64encode(token.encode()).decode()},
        }
        self.core.create_namespaced_secret(NS, secret)
        kubernetes.client.ApiextensionsV1Api(self.api).create_custom_resource_definition(crd())
        job = {
            "apiVersion": names.api_version(),
            "kind": names.CRD_KIND,
            "metadata": {"name": JOB},
            "spec": {"replicaSpecs": {"worker": {"template": {"spec": {"containers": [container]}}}}},
        }
        kubernetes.client.CustomObjectsApi(self.api).create_namespaced_custom_object(
            names.CRD_GROUP, names.CRD_VERSION, NS, names.CRD_PLURAL, job
        )
        kubeconfig = self.cluster.write_kubeconfig(self.tmp / "kubeconfig")
        port = free_port()
        self.address = f"127.0.0.1:{port}"
        self.token = token
        cmd = [
            sys.executable, "-m", "dlrover.master.cli", "--backend=kubernetes", f"--kube-namespace={NS}",
            f"--kube-job={JOB}", f"--kubeconfig={kubeconfig}", f"--kube-master-address=127.0.0.1:{port}",
            f"--port={port}", f"--token-file={token_file}", "--nnodes=1", f"--state-dir={self.state}",
            "--heartbeat-interval-s=0.5", "--rdzv-last-call-s=0", "--node-stop-grace-s=2",
            "--kube-backoff-max-s=1", *flags,
        ]  # fmt: skip
        self.cmd = cmd
        self.start_master()

    def start_master(self) -> None:
        """Start the master process (again: a successor on the same state directory and port)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("DLROVER_") and k != "KUBECONFIG"}
        with open(self.log, "a") as handle:
            self.proc = subprocess.Popen(
                self.cmd, cwd=self.tmp, env=env, stdout=handle, stderr=subprocess.STDOUT, text=True,
                start_new_session=True,
            )  # fmt: skip
        self.procs.append(self.proc)

    def pod(self, node_id: int) -> dict[str, Any] | None:
        try:
            response = self.core.read_namespaced_pod(names.worker_pod_name(JOB, node_id), NS, _preload_content=False)
        except kubernetes.client.exceptions.ApiException as exc:
            if exc.status == 404:
                return None
            raise
        return dict(json.loads(response.data))

    def running_on(self, node_id: int) -> str:
        """Wait until the node's first attempt runs its training process; the node its pod runs on."""
        wait_for((self.out / "attempted").exists, "the first attempt to run")
        pod = self.pod(node_id)
        assert pod is not None
        return str(pod["spec"]["nodeName"])

    def finish(self, returncode: int = 0) -> dict[str, list[dict[str, Any]]]:
        assert self.proc is not None
        self.proc.wait(timeout=WAIT_S)
        text = self.log.read_text()
        assert self.proc.returncode == returncode, text[-6000:]
        if returncode == 0:
            assert (self.out / "done").exists(), text[-3000:]
        self.api.close()
        by_kind: dict[str, list[dict[str, Any]]] = {}
        for event in read_event_log(self.state / "events.jsonl"):
            by_kind.setdefault(str(event["kind"]), []).append(event)
        return by_kind


@contextlib.contextmanager
def watch_faults_throughout(cluster: KubeCluster) -> Iterator[list[int]]:
    """Drop the master's pod watches (cleanly or cut) and answer them 410 Gone, again and again, while the
    job runs; yields a one-item list counting the rounds of faults."""
    rounds = [0]
    stop = threading.Event()

    def inject() -> None:
        while not stop.wait(0.3):
            faults = cluster.server.faults
            if rounds[0] % 3 == 0:
                faults.fail_next(1, 410, when=lambda r: r.is_watch)
            faults.drop_watches(abrupt=rounds[0] % 2 == 1)
            rounds[0] += 1

    thread = threading.Thread(target=inject, name="watch-faults")
    thread.start()
    try:
        yield rounds
    finally:
        stop.set()
        thread.join()


def memory_limit(pod: dict[str, Any] | None) -> str:
    assert pod is not None
    return str(pod["spec"]["containers"][0]["resources"]["limits"]["memory"])


def test_a_worker_killed_for_memory_comes_back_with_more_in_its_pod(
    kube_cluster: KubeCluster, tmp_path: Path, procs: list[subprocess.Popen[str]]
) -> None:
    if not kube_cluster.kubelet.memory_enforced:
        pytest.skip(f"the test kubelet cannot enforce memory here: {kube_cluster.kubelet.memory_enforcement}")
    job = Job(kube_cluster, tmp_path, procs)
    job.start("--node-memory=700Mi", "--max-node-memory=2Gi", "--kube-node-state-mb=1", first="hog")
    first: list[dict[str, Any] | None] = []
    wait_for(lambda: bool(first.append(job.pod(0)) or first[-1]), "the first pod")
    events = job.finish()
    # 700 MiB for the node plus /dev/shm for two 1 MiB snapshots; then 1.5x after the OOM kill.
    assert memory_limit(first[-1]) == "702Mi"
    assert memory_limit(job.pod(1)) == "1052Mi"
    (relaunch,) = events["oom_relaunch"]
    assert (relaunch["data"]["memory_mb"], relaunch["data"]["new_memory_mb"]) == (700, 1050)
    # The agent reported its worker SIGKILLed with the kernel's record; the master decided host OOM.
    (replaced,) = events["relaunch"]
    assert "host_oom" in replaced["message"]


@pytest.fixture
def slow_taint_manager() -> Iterator[KubeCluster]:
    """The test cluster with a lost node's pods kept (Failed, NodeLost) for 10 s before they are deleted, as the
    taint manager keeps them for their toleration (300 s by default on a real cluster). A pod that failed and was
    deleted within one gap of the watch (a relist after 410) is seen only as deleted, without its reason."""
    nodes = [SimNode(f"node-{i}") for i in range(3)]
    with KubeCluster(nodes, restart_backoff_s=0.2, max_restart_backoff_s=2.0, node_lost_eviction_s=10.0) as cluster:
        yield cluster


def test_a_lost_node_is_replaced_on_another_node(
    slow_taint_manager: KubeCluster, tmp_path: Path, procs: list[subprocess.Popen[str]]
) -> None:
    kube_cluster = slow_taint_manager
    job = Job(kube_cluster, tmp_path, procs)
    # No relaunch and no failure allowed: losing a node is not the job's fault.
    job.start("--max-relaunches=0", "--max-job-failures=0")
    with watch_faults_throughout(kube_cluster) as rounds:  # no pod event is lost to them
        lost = job.running_on(0)
        kube_cluster.kubelet.lose_node(lost)
        events = job.finish()
    assert rounds[0] >= 1
    replacement = job.pod(1)
    assert replacement is not None
    assert replacement["spec"]["nodeName"] != lost
    terms = replacement["spec"]["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]
    assert {"key": "kubernetes.io/hostname", "operator": "NotIn", "values": [lost]} in terms["nodeSelectorTerms"][0][
        "matchExpressions"
    ]
    (disruption,) = events["disruption"]
    assert disruption["data"]["reason"] == "NodeLost"
    assert disruption["data"]["host_avoided"] is True
    assert "failure" not in events
    assert (job.out / "done").read_text() == names.worker_pod_name(JOB, 1)


def test_an_evicted_pod_is_relaunched_without_charging_the_budget(
    kube_cluster: KubeCluster, tmp_path: Path, procs: list[subprocess.Popen[str]]
) -> None:
    job = Job(kube_cluster, tmp_path, procs)
    job.start("--max-relaunches=0", "--max-job-failures=0")
    with watch_faults_throughout(kube_cluster) as rounds:  # no pod event is lost to them
        job.running_on(0)
        kube_cluster.kubelet.evict(names.worker_pod_name(JOB, 0))
        events = job.finish()
    assert rounds[0] >= 1
    (disruption,) = events["disruption"]
    assert disruption["data"]["reason"] == "Evicted"
    assert "failure" not in events
    assert job.pod(1) is not None
    # Nothing of the job runs any more.
    assert kube_cluster.kubelet.pid(names.worker_pod_name(JOB, 1)) is None


@pytest.fixture
def one_big_node() -> Iterator[KubeCluster]:
    """A cluster where only one 5 GiB worker fits: node-0 has 8 GiB, node-1 1 GiB."""
    nodes = [SimNode("node-0", memory="8Gi"), SimNode("node-1", memory="1Gi")]
    with KubeCluster(nodes, restart_backoff_s=0.2, max_restart_backoff_s=2.0) as cluster:
        yield cluster


def test_a_worker_that_cannot_be_placed_stops_the_job_with_the_schedulers_reason(
    one_big_node: KubeCluster, tmp_path: Path, procs: list[subprocess.Popen[str]]
) -> None:
    job = Job(one_big_node, tmp_path, procs)
    job.start(
        "--nnodes=2", "--node-memory=5Gi", "--kube-node-state-mb=1", "--node-pending-timeout-s=1",
        "--insufficient-nodes-window-s=5", nnodes="2",
    )  # fmt: skip
    events = job.finish(returncode=1)
    # Node 0 goes to node-0; node 1 fits nowhere, and the announcement says why, in the scheduler's words.
    # (Node 0 may still be starting when the 1 s pending timeout passes on a loaded host: then it is
    # announced too, with no reason, since it is placed.)
    why = "Unschedulable: 0/2 nodes are available: 2 Insufficient memory."
    pending = [e for e in events["nodes_pending"] if 1 in e["data"]["nodes"]]
    assert len(pending) == 1, events["nodes_pending"]
    assert f"node 1: {why}" in pending[0]["message"]
    assert "node 0:" not in pending[0]["message"]
    assert "failure" not in events
    (end,) = events["job_end"]
    assert re.search(r"insufficient nodes: [01] running < min_nodes 2", end["message"]), end["message"]
    assert f"node 1 pending: {why}" in end["message"]


def test_a_worker_that_cannot_be_placed_leaves_the_job_training_at_its_minimum(
    one_big_node: KubeCluster, tmp_path: Path, procs: list[subprocess.Popen[str]]
) -> None:
    job = Job(one_big_node, tmp_path, procs)
    job.start(
        "--nnodes=1:2", "--node-memory=5Gi", "--kube-node-state-mb=1", "--node-pending-timeout-s=1",
        "--insufficient-nodes-window-s=5", first="wait", nnodes="1:2",
    )  # fmt: skip
    job.running_on(0)

    def announced() -> bool:
        path = job.state / "events.jsonl"
        return path.exists() and any(
            e["kind"] == "nodes_pending" and 1 in e["data"]["nodes"] for e in read_event_log(path)
        )

    wait_for(announced, "node 1 announced pending")
    # Well past the insufficient-nodes window: one node is the minimum, so nothing stops the job.
    (job.out / "release").write_text("")
    events = job.finish()
    # (Its wording on whether the job goes on depends on whether node 0 had registered by then.)
    (pending,) = [e for e in events["nodes_pending"] if 1 in e["data"]["nodes"]]
    assert "node 1: Unschedulable: 0/2 nodes are available: 2 Insufficient memory." in pending["message"]
    assert "failure" not in events
    (end,) = events["job_end"]
    assert end["data"]["state"] == "succeeded", end


def test_a_master_stopped_by_its_platform_hands_the_running_pods_to_its_successor(
    kube_cluster: KubeCluster, tmp_path: Path, procs: list[subprocess.Popen[str]]
) -> None:
    job = Job(kube_cluster, tmp_path, procs)
    job.start(first="wait")
    job.running_on(0)
    worker = kube_cluster.kubelet.pid(names.worker_pod_name(JOB, 0))
    assert job.proc is not None
    # The master pod is deleted or evicted: SIGTERM. The job is not over: the pods stay, the journal says running.
    os.killpg(job.proc.pid, signal.SIGTERM)
    assert job.proc.wait(timeout=WAIT_S) == 128 + signal.SIGTERM, job.log.read_text()[-3000:]
    assert "the job goes on" in job.log.read_text()
    pod = job.pod(0)
    assert pod is not None
    assert pod["status"]["phase"] == "Running"
    assert "deletionTimestamp" not in pod["metadata"]
    # A successor that cannot start (here: another node range than the journaled job's) exits 2 and leaves
    # the running pods alone: its failure is not the job's end.
    env = {k: v for k, v in os.environ.items() if not k.startswith("DLROVER_") and k != "KUBECONFIG"}
    refused = subprocess.run(
        [*job.cmd, "--nnodes=1:2"],
        check=False,
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=WAIT_S,
    )
    assert refused.returncode == 2, refused.stdout[-2000:] + refused.stderr[-2000:]
    assert "another job" in refused.stderr
    pod = job.pod(0)
    assert pod is not None
    assert pod["status"]["phase"] == "Running"
    assert "deletionTimestamp" not in pod["metadata"]
    # Its successor (the operator starts one on the same state volume) adopts the pod; the worker never restarted.
    job.start_master()

    # The successor restarts every node's heartbeat clock when it resumes; a heartbeat that reaches it shows
    # as that clock going back: the agent is back in touch (before that, the worker must not finish).
    client = MasterClient(job.address, job.token)
    since: list[float] = []

    def heartbeat_arrived() -> bool:
        try:
            nodes = {n.node_id: n for n in client.job_status().nodes}
        except DLRoverError:
            return False  # not serving yet
        since.append(nodes[0].seconds_since_heartbeat)
        return len(since) > 1 and since[-1] < since[-2]

    try:
        wait_for(heartbeat_arrived, "a heartbeat of the running agent at the successor")
    finally:
        client.close()
    (job.out / "release").touch()
    events = job.finish()
    assert kube_cluster.kubelet.pid(names.worker_pod_name(JOB, 0)) is None
    assert worker is not None
    assert (job.out / "done").read_text() == names.worker_pod_name(JOB, 0)
    assert job.pod(1) is None  # nothing relaunched
    assert "failure" not in events
    assert [e["kind"] for e in events["job_end"]] == ["job_end"]
    assert "succeeded" in events["job_end"][0]["message"]


def test_a_pod_deleted_while_no_master_watched_is_relaunched_at_once_without_charge(
    kube_cluster: KubeCluster, tmp_path: Path, procs: list[subprocess.Popen[str]]
) -> None:
    # No relaunch and no failure allowed, and timeouts far beyond the test's: only the successor's first look
    # at the pods (the journal holds node 0 alive, no pod has it) can relaunch it, as a disruption.
    job = Job(kube_cluster, tmp_path, procs)
    job.start(
        "--max-relaunches=0", "--max-job-failures=0", "--heartbeat-timeout-s=3600", "--node-start-timeout-s=3600",
        first="wait",
    )  # fmt: skip
    job.running_on(0)
    assert job.proc is not None
    os.killpg(job.proc.pid, signal.SIGKILL)
    job.proc.wait(timeout=WAIT_S)
    pod_name = names.worker_pod_name(JOB, 0)
    job.core.delete_namespaced_pod(pod_name, NS, grace_period_seconds=0)
    wait_for(lambda: job.pod(0) is None and kube_cluster.kubelet.pid(pod_name) is None, "the pod and its process gone")
    job.start_master()
    events = job.finish()
    (disruption,) = events["disruption"]
    assert disruption["data"]["reason"] == "Deleted", disruption
    assert "gone when the master resumed the job" in disruption["message"] + json.dumps(disruption["data"])
    assert "failure" not in events
    assert (job.out / "done").read_text() == names.worker_pod_name(JOB, 1)  # the relaunch finished the job
    assert kube_cluster.kubelet.pid(names.worker_pod_name(JOB, 1)) is None


QUOTA = 'pods "j-worker-0" is forbidden: exceeded quota: q, requested: pods=1, used: pods=2, limited: pods=2'


def test_a_pod_a_quota_refuses_waits_pending_with_the_quotas_message_and_starts_once_there_is_room(
    kube_cluster: KubeCluster, tmp_path: Path, procs: list[subprocess.Popen[str]]
) -> None:
    creates = lambda r: r.resource == "pods" and r.verb == "create"  # noqa: E731
    quota = kube_cluster.server.faults.fail_next(10_000, 403, when=creates, message=QUOTA)
    job = Job(kube_cluster, tmp_path, procs)
    job.start("--max-relaunches=0", "--max-job-failures=0", "--node-pending-timeout-s=1", first="wait")

    def announced() -> bool:
        events = read_event_log(job.state / "events.jsonl") if (job.state / "events.jsonl").exists() else []
        return any(e["kind"] == "nodes_pending" and "exceeded quota" in e["message"] for e in events)

    wait_for(announced, "the pending announcement with the quota's message")
    assert quota.fired >= 2  # the create was sent again
    kube_cluster.server.faults.remove(quota)  # room in the quota
    job.running_on(0)
    (job.out / "release").touch()
    events = job.finish()
    assert "failure" not in events
    assert (job.out / "done").read_text() == names.worker_pod_name(JOB, 0)


def test_a_create_the_api_server_keeps_failing_for_a_while_is_sent_again_later_without_charge(
    kube_cluster: KubeCluster, tmp_path: Path, procs: list[subprocess.Popen[str]]
) -> None:
    # The backend tries a create 4 times (--kube-request-retries 3) before the launch fails; 8 answers of
    # 503 fail two launches, and the master's third launch of the node gets through.
    creates = lambda r: r.resource == "pods" and r.verb == "create"  # noqa: E731
    outage = kube_cluster.server.faults.fail_next(8, 503, when=creates, message="the API server is restarting")
    job = Job(kube_cluster, tmp_path, procs)
    job.start(
        "--max-relaunches=0",
        "--max-job-failures=0",
        "--launch-retry-initial-s=0.2",
        "--launch-retry-max-s=0.5",
        first="wait",
    )
    job.running_on(0)
    (job.out / "release").touch()
    events = job.finish()
    assert outage.fired == 8
    assert "failure" not in events  # no budget was there to charge: the job would have failed
    assert [e["data"]["launches"] for e in events["launch_retry"]] == [1, 2]
    assert "the API server is restarting" in events["launch_retry"][0]["message"]
    assert (job.out / "done").read_text() == names.worker_pod_name(JOB, 0)


def test_a_pod_the_api_server_finds_invalid_fails_the_job_with_its_message(
    kube_cluster: KubeCluster, tmp_path: Path, procs: list[subprocess.Popen[str]]
) -> None:
    invalid = 'Pod "j-worker-0" is invalid: spec.containers[0].resources.requests: Invalid value: "2": must be <= 1'
    creates = lambda r: r.resource == "pods" and r.verb == "create"  # noqa: E731
    kube_cluster.server.faults.fail_next(1, 422, when=creates, message=invalid)
    job = Job(kube_cluster, tmp_path, procs)
    job.start()
    events = job.finish(returncode=1)
    (end,) = events["job_end"]
    assert end["data"]["state"] == "failed", end
    assert invalid in end["message"]
    assert "failure" not in events  # not charged as a node's failure: the job stops at once
    assert job.pod(0) is None
    assert job.pod(1) is None
