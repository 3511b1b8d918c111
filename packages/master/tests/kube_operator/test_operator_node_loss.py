"""The operator replaces masters that nothing reports dead or that could not start yet, on the test kubelet:
a master pod whose node is lost (`Kubelet.lose_node(unreachable=True)`, as a real cluster shows it: the pod
stays Running with Ready=False, then the taint manager's graceful deletion leaves it Terminating), and a
master that exited 75 ("could not start now, retry")."""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from dlrover_testsupport.kube import KubeCluster, SimNode
from ej_builders import elastic_job, summary, wait_for
from kubernetes import client

from dlrover.master.kube.watch import WatchSettings
from dlrover.master.operator import MasterSettings, ReconcileSettings, crd_manifest
from dlrover.master.operator.controller import MasterAddress, Operator, OperatorSettings
from dlrover.master.status import JobSummary

pytestmark = [pytest.mark.integration, pytest.mark.timeout(180)]

GROUP, VERSION, PLURAL, NS = "elastic.dlrover.io", "v1alpha1", "elasticjobs", "default"
# The master pod's process: the operator only needs a pod that runs (its status comes from `Masters`).
IDLE_MASTER = (sys.executable, "-c", "import time; time.sleep(600)")


class Masters:
    """Stands in for the masters' JobService: every master answers that the job runs."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.targets: list[str] = []

    def status(self, address: MasterAddress) -> JobSummary:
        with self._lock:
            self.targets.append(address.target)
        return summary()

    def resize(self, address: MasterAddress, nodes: int, reason: str) -> str:
        raise AssertionError("no resize in these tests")


@pytest.fixture
def two_nodes(request: pytest.FixtureRequest) -> Iterator[KubeCluster]:
    eviction_s = float(request.param)
    nodes = [SimNode("node-0"), SimNode("node-1")]
    with KubeCluster(nodes, restart_backoff_s=0.2, max_restart_backoff_s=2.0, node_lost_eviction_s=eviction_s) as c:
        yield c


@pytest.mark.parametrize(
    ("two_nodes", "unready_timeout_s", "terminating_margin_s", "seen"),
    [
        # The taint manager waits longer than the operator: the pod is still Running, not ready.
        (600.0, 1.0, 600.0, "not been ready since"),
        # The taint manager deletes it first: it stays Terminating past its grace (1 s) and the margin.
        (0.2, 600.0, 0.5, "Terminating since"),
    ],
    indirect=["two_nodes"],
)
def test_a_master_on_a_lost_node_is_force_deleted_and_replaced_on_another(
    two_nodes: KubeCluster,
    unready_timeout_s: float,
    terminating_margin_s: float,
    seen: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="dlrover.master.operator")
    settings = OperatorSettings(
        namespace=NS,
        reconcile=ReconcileSettings(
            master=MasterSettings(image="dlrover:test", command=IDLE_MASTER, grace_period_s=1),
            master_unready_timeout_s=unready_timeout_s,
            master_terminating_margin_s=terminating_margin_s,
        ),
        status_interval_s=0.3,
        resync_interval_s=1.0,
        retry_interval_s=0.3,
        watch=WatchSettings(watch_timeout_s=20, request_timeout_s=10, backoff_initial_s=0.05, backoff_max_s=1.0),
    )
    with client.ApiClient(client.Configuration(host=two_nodes.url)) as api:
        client.ApiextensionsV1Api(api).create_custom_resource_definition(crd_manifest())
        core, custom = client.CoreV1Api(api), client.CustomObjectsApi(api)
        job = elastic_job()
        job["metadata"] = {"name": "job1"}
        custom.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, job)

        def status() -> dict[str, Any]:
            return dict(custom.get_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, "job1").get("status") or {})

        def ready() -> bool:
            return any(c["type"] == "MasterReady" and c["status"] == "True" for c in status().get("conditions", []))

        def master() -> Any:
            try:
                return core.read_namespaced_pod("job1-master", NS)
            except client.exceptions.ApiException as exc:
                if exc.status == 404:
                    return None
                raise

        with Operator(api, settings, masters=Masters()) as operator:  # type: ignore[arg-type]
            try:
                wait_for("the master serving", lambda: ready() and status().get("phase") == "Running")
                old = master()
                lost_node = old.spec.node_name
                assert two_nodes.kubelet.lose_node(lost_node, unreachable=True) == ["job1-master"]
                wait_for("the lost master replaced", lambda: status().get("masterRestarts") == 1)
                wait_for(
                    "the replacement serving on the other node",
                    lambda: (
                        (pod := master()) is not None
                        and pod.metadata.uid != old.metadata.uid
                        and pod.status.phase == "Running"
                        and pod.spec.node_name != lost_node
                        and ready()
                    ),
                )
                assert status()["masterRestarts"] == 1  # one loss, counted once
                # Nothing reported the old pod dead: it never showed phase Failed (the operator decided).
                events = core.list_namespaced_event(NS).items
                assert not any(e.reason == "NodeLost" for e in events)
            finally:
                print(f"operator: {operator.last_reason.get(f'{NS}/job1', '')}")
    deletes = [r.getMessage() for r in caplog.records if "delete Pod job1-master" in r.getMessage()]
    assert deletes
    assert all(seen in d for d in deletes), deletes


def test_a_master_that_could_not_start_now_is_replaced_after_its_backoff(
    kube_cluster: KubeCluster, tmp_path: Path
) -> None:
    # The first master exits 75 (as dlrover-master does while a predecessor holds the state directory); the
    # replacement runs. Exit 2 would have failed the job for good.
    marker = tmp_path / "refused-once"
    flaky_master = (
        sys.executable,
        "-c",
        f"import os, sys, time\nif not os.path.exists({str(marker)!r}):\n"
        f"    open({str(marker)!r}, 'w').close()\n    sys.exit(75)\ntime.sleep(600)",
    )
    settings = OperatorSettings(
        namespace=NS,
        reconcile=ReconcileSettings(
            master=MasterSettings(image="dlrover:test", command=flaky_master, grace_period_s=1),
            master_retry_backoff_s=0.5,
        ),
        status_interval_s=0.3,
        resync_interval_s=1.0,
        retry_interval_s=0.3,
        watch=WatchSettings(watch_timeout_s=20, request_timeout_s=10, backoff_initial_s=0.05, backoff_max_s=1.0),
    )
    with client.ApiClient(client.Configuration(host=kube_cluster.url)) as api:
        client.ApiextensionsV1Api(api).create_custom_resource_definition(crd_manifest())
        custom = client.CustomObjectsApi(api)
        job = elastic_job()
        job["metadata"] = {"name": "job1"}
        custom.create_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, job)

        def status() -> dict[str, Any]:
            return dict(custom.get_namespaced_custom_object(GROUP, VERSION, NS, PLURAL, "job1").get("status") or {})

        def serving() -> bool:
            ready = {c["type"]: c for c in status().get("conditions", [])}.get("MasterReady", {})
            return ready.get("status") == "True"

        with Operator(api, settings, masters=Masters()) as operator:  # type: ignore[arg-type]
            try:
                # (The first may look ready for a moment: its pod runs before its process exits 75.)
                wait_for("the second master serving", lambda: status().get("masterRestarts") == 1 and serving())
            finally:
                print(f"operator: {operator.last_reason.get(f'{NS}/job1', '')}")
            final = status()
    assert marker.exists()
    assert final["masterRestarts"] == 1
    assert final["phase"] == "Running"
    assert not any(c["type"] == "Failed" and c["status"] == "True" for c in final.get("conditions", []))
