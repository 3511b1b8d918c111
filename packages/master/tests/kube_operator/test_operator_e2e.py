"""The operator with a real master in a pod: the test kubelet runs the master pod and the worker
pods the master creates as local processes. The master is killed and replaced without restarting a
worker, the job is resized through the spec, ends Succeeded, and deleting it leaves nothing."""

from __future__ import annotations

import base64
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from dlrover_testsupport.kube import KubeCluster
from ej_builders import elastic_job, wait_for
from kubernetes import client

from dlrover.master.kube.watch import WatchSettings
from dlrover.master.operator import MASTER_ROLE_RULES, MasterSettings, ReconcileSettings, crd_manifest
from dlrover.master.operator.cli import USER_AGENT
from dlrover.master.operator.controller import Operator, OperatorSettings
from dlrover.master.scheduler.kubernetes import VERBS_ADMITTED

pytestmark = [pytest.mark.integration, pytest.mark.timeout(420)]

GROUP, VERSION, PLURAL, NS = "elastic.dlrover.io", "v1alpha1", "elasticjobs", "default"
TEST_AGENT = "dlrover-operator-test"

# A stand-in for dlrover-run: registers with the node id the master gave it, heartbeats (riding out
# an unreachable master, as the agent does), appends its pid to <dir>/pids/<node id> at start, and
# reports success once <dir>/done exists; a stop action ends it.
AGENT = """
import os, socket, sys, time
import grpc
from dlrover.common import RpcError, load_token
from dlrover.master.client import MasterClient

node_id = int(os.environ["DLROVER_NODE_ID"])
folder = os.environ["TEST_DIR"]
os.makedirs(os.path.join(folder, "pids"), exist_ok=True)
with open(os.path.join(folder, "pids", str(node_id)), "a") as f:
    f.write(f"{os.getpid()}\\n")
with MasterClient(os.environ["DLROVER_MASTER_ADDR"], load_token()) as c:
    c.register(f"agent-{node_id}", socket.gethostname(), node_id=node_id)
    step, lost = 0, None
    while True:
        step += 1
        try:
            reply = c.heartbeat(step=step, samples=step)
            if os.path.exists(os.path.join(folder, "done")):
                c.report_success()
                sys.exit(0)
        except RpcError as exc:
            if exc.code not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                raise
            lost = lost or time.monotonic()
            if time.monotonic() - lost > 150:
                raise
            time.sleep(0.3)
            continue
        lost = None
        if any(a.kind.ends_node for a in reply.actions):
            sys.exit(0)
        time.sleep(0.3)
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def api(kube_cluster: KubeCluster) -> Iterator[Any]:
    with client.ApiClient(client.Configuration(host=kube_cluster.url)) as api:
        api.user_agent = TEST_AGENT
        client.ApiextensionsV1Api(api).create_custom_resource_definition(crd_manifest())
        yield api


def test_a_master_in_a_pod_is_replaced_resized_and_ends_the_job(
    kube_cluster: KubeCluster, api: Any, tmp_path: Path
) -> None:
    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
    core.create_namespaced_persistent_volume_claim(NS, {"metadata": {"name": "state"}, "spec": {}})
    job = elastic_job(master={"port": free_port(), "stateVolume": {"persistentVolumeClaim": {"claimName": "state"}}})
    main = job["spec"]["replicaSpecs"]["worker"]["template"]["spec"]["containers"][0]
    main.update(command=[sys.executable, "-c", AGENT], env=[{"name": "TEST_DIR", "value": str(tmp_path)}])
    job["metadata"] = {"name": "job1"}
    custom.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, job)

    def status() -> dict[str, Any]:
        return dict(custom.get_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, "job1").get("status") or {})

    def workers() -> dict[str, str]:
        pods = core.list_namespaced_pod(NS, label_selector="elastic.dlrover.io/component=worker").items
        return {p.metadata.name: p.metadata.uid for p in pods if p.status.phase == "Running"}

    settings = OperatorSettings(
        namespace=NS,
        reconcile=ReconcileSettings(
            master=MasterSettings(
                command=(sys.executable, "-m", "dlrover.master.cli"),
                extra_args=("--heartbeat-interval-s", "1", "--tick-interval-s", "0.5", "--linger-max-s", "2"),
                grace_period_s=5,
            )
        ),
        status_interval_s=0.5,
        resync_interval_s=2.0,
        retry_interval_s=0.5,
        master_call_timeout_s=5.0,
        watch=WatchSettings(watch_timeout_s=20, request_timeout_s=10, backoff_initial_s=0.05, backoff_max_s=1.0),
    )
    kubelet = kube_cluster.kubelet
    with client.ApiClient(client.Configuration(host=kube_cluster.url)) as operator_api:
        operator_api.user_agent = USER_AGENT
        with Operator(operator_api, settings) as operator:
            try:
                wait_for("two workers training", lambda: status().get("nodes", {}).get("running") == 2)
                assert status()["phase"] == "Running"
                before = workers()
                assert len(before) == 2
                old_master = core.read_namespaced_pod("job1-master", NS).metadata.uid

                kubelet.kill_process("job1-master", NS, signal.SIGKILL)
                wait_for("the master replaced", lambda: status().get("masterRestarts") == 1)
                wait_for(
                    "the new master serving",
                    lambda: (
                        core.read_namespaced_pod("job1-master", NS).metadata.uid != old_master
                        and any(
                            c["type"] == "MasterReady" and c["status"] == "True" for c in status().get("conditions", [])
                        )
                        and status().get("nodes", {}).get("running") == 2
                    ),
                )
                assert workers() == before, "a worker was restarted by the master's replacement"
                for pids in (tmp_path / "pids").iterdir():
                    assert len(pids.read_text().split()) == 1, f"agent {pids.name} started twice"

                custom.patch_namespaced_custom_object(
                    GROUP, VERSION, NS, PLURAL, "job1", {"spec": {"replicaSpecs": {"worker": {"maxReplicas": 1}}}}
                )
                wait_for("one worker", lambda: len(workers()) == 1 and status().get("targetNodes") == 1)
                (tmp_path / "done").write_text("")
                wait_for("the job succeeded", lambda: status().get("phase") == "Succeeded")
            finally:
                reason = operator.last_reason.get(f"{NS}/job1", "")
                log = kubelet.read_log(NS, "job1-master") if kubelet.pid("job1-master", NS) is None else ""
                print(f"operator: {reason}\nmaster log tail:\n{log[-3000:]}")

    # The master's own requests (neither the operator's nor this test's) used exactly its Role.
    master_verbs = {
        (r.group, r.rbac_resource, r.verb)
        for r in kube_cluster.server.requests()
        if r.user_agent not in (USER_AGENT, TEST_AGENT) and r.verb
    }
    granted = {
        (rule.api_group, res, verb) for rule in MASTER_ROLE_RULES for res in rule.resources for verb in rule.verbs
    }
    # (What admission alone checks is granted but never requested.)
    assert master_verbs == granted - VERBS_ADMITTED

    custom.delete_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, "job1")
    wait_for("no pod left", lambda: not core.list_namespaced_pod(NS).items)
    assert kubelet.pid("job1-master", NS) is None


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command to make a certificate")
def test_a_master_serves_tls_from_the_jobs_secret_and_the_operator_verifies_it(
    kube_cluster: KubeCluster, api: Any, tmp_path: Path
) -> None:
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
         "-keyout", str(key), "-out", str(cert), "-days", "1", "-subj", "/CN=job1-master.default.svc",
         "-addext", "subjectAltName=DNS:job1-master.default.svc"],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
    core.create_namespaced_secret(
        NS,
        {
            "metadata": {"name": "master-tls"},
            "type": "kubernetes.io/tls",
            "data": {
                "tls.crt": base64.b64encode(cert.read_bytes()).decode(),
                "tls.key": base64.b64encode(key.read_bytes()).decode(),
            },
        },
    )
    job = elastic_job(master={"port": free_port(), "tls": {"secretName": "master-tls"}})
    # The workers dial the master over TLS: their clients take the CA and the Service's name the master's
    # backend put in their pods (the Secret's tls.crt mounted), with no channel configuration of their own.
    main = job["spec"]["replicaSpecs"]["worker"]["template"]["spec"]["containers"][0]
    main.update(command=[sys.executable, "-c", AGENT], env=[{"name": "TEST_DIR", "value": str(tmp_path)}])
    job["metadata"] = {"name": "job1"}
    custom.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, job)
    settings = OperatorSettings(
        namespace=NS,
        reconcile=ReconcileSettings(master=MasterSettings(command=(sys.executable, "-m", "dlrover.master.cli"))),
        status_interval_s=0.5,
        resync_interval_s=2.0,
        master_tls_ca=str(cert),
        watch=WatchSettings(watch_timeout_s=20, backoff_initial_s=0.05, backoff_max_s=1.0),
    )

    def ready() -> bool:
        job = custom.get_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, "job1")
        conditions = (job.get("status") or {}).get("conditions", [])
        return any(c["type"] == "MasterReady" and c["status"] == "True" for c in conditions)

    with (
        client.ApiClient(client.Configuration(host=kube_cluster.url)) as operator_api,
        Operator(operator_api, settings),
    ):
        wait_for("the operator reading the TLS master's status", ready)

        def running() -> int:
            job = custom.get_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, "job1")
            return int(((job.get("status") or {}).get("nodes") or {}).get("running") or 0)

        try:
            wait_for("both workers registered with the TLS master", lambda: running() == 2)
        finally:
            for pod in core.list_namespaced_pod(NS).items:
                print(f"--- {pod.metadata.name}:\n{kube_cluster.kubelet.read_log(NS, pod.metadata.name)[-2000:]}")
    command = core.read_namespaced_pod("job1-master", NS).spec.containers[0].command
    assert command[command.index("--tls-cert") + 1] == "/etc/dlrover/tls/tls.crt"
    assert command[command.index("--kube-tls-secret") + 1] == "master-tls"
    worker = core.list_namespaced_pod(NS, label_selector="elastic.dlrover.io/component=worker").items[0]
    env = {e.name: e.value for e in worker.spec.containers[0].env}
    assert env["DLROVER_MASTER_TLS_CA"] == "/etc/dlrover/master-tls/ca.crt"
    assert env["DLROVER_MASTER_TLS_SERVER_NAME"] == "job1-master.default.svc"
    custom.delete_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, "job1")
    wait_for("no pod left", lambda: not core.list_namespaced_pod(NS).items)
