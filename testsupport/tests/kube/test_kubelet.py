"""The test kubelet with real processes: phases and exit codes, environment, placement, faults.

Every test waits on conditions (never on time) and checks that the processes it started are gone.
"""

from __future__ import annotations

import datetime
import json
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from dlrover_testsupport.kube import KubeCluster, Kubelet, SimNode, Store

kubernetes = pytest.importorskip("kubernetes", reason="the kubernetes client is part of the dev install")
from kubernetes import client, watch  # noqa: E402

pytestmark = pytest.mark.timeout(120)
NS = "default"
PY = sys.executable
T = TypeVar("T")


def wait_until(check: Callable[[], T], what: str, timeout_s: float = 60.0) -> T:
    """Poll `check` until it returns something truthy; fail naming `what` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = check()
        if result:
            return result
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        time.sleep(0.05)


def alive(pid: int) -> bool:
    """Whether `pid` runs (a zombie waiting for its reaper counts as gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


@pytest.fixture
def v1(kube_cluster: KubeCluster) -> Iterator[client.CoreV1Api]:
    with client.ApiClient(client.Configuration(host=kube_cluster.url)) as api:
        yield client.CoreV1Api(api)


def pod(name: str, code: str, *, labels: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    container = {"name": "main", "image": "ignored", "command": [PY, "-c", code]}
    container.update(spec.pop("container", {}))
    return {
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {"restartPolicy": "Never", "containers": [container], **spec},
    }


def get(cluster: KubeCluster, name: str) -> dict[str, Any] | None:
    store = cluster.server.store
    try:
        return store.get(store.resource_type("", "v1", "pods"), NS, name)
    except Exception:
        return None


def phase(cluster: KubeCluster, name: str) -> str:
    obj = get(cluster, name)
    return "" if obj is None else str(obj["status"].get("phase"))


def terminated(cluster: KubeCluster, name: str) -> dict[str, Any]:
    obj = wait_until(lambda: (p := get(cluster, name)) and p["status"]["phase"] in ("Succeeded", "Failed") and p, name)
    return dict(obj["status"]["containerStatuses"][0]["state"]["terminated"])


def history_of(cluster: KubeCluster, name: str) -> list[dict[str, Any]]:
    """Every stored version of pod `name`, oldest first."""
    return [
        e.obj
        for e in cluster.server.store.history()
        if e.group_resource == ("", "pods") and e.obj["metadata"]["name"] == name
    ]


def condition(pod_obj: dict[str, Any], kind: str) -> dict[str, Any] | None:
    return next((c for c in pod_obj["status"].get("conditions") or [] if c["type"] == kind), None)


# ----------------------------------------------------------------- phases and exit codes


@pytest.mark.parametrize(
    "case",
    [
        ("pass", 0, "Completed", "Succeeded"),
        ("raise SystemExit(3)", 3, "Error", "Failed"),
        ("import os, signal; os.kill(os.getpid(), signal.SIGKILL)", 137, "Error", "Failed"),
        ("import os, signal; os.kill(os.getpid(), signal.SIGTERM)", 143, "Error", "Failed"),
    ],
)
def test_phase_and_exit_code_are_the_process_s(
    kube_cluster: KubeCluster, v1: client.CoreV1Api, case: tuple[str, int, str, str]
) -> None:
    code, exit_code, reason, want_phase = case
    v1.create_namespaced_pod(NS, pod("p", code))
    state = terminated(kube_cluster, "p")
    assert (state["exitCode"], state["reason"]) == (exit_code, reason)
    final = v1.read_namespaced_pod("p", NS)
    assert final.status.phase == want_phase
    assert final.spec.node_name in kube_cluster.kubelet.node_names
    assert final.status.container_statuses[0].ready is False
    phases = [p["status"]["phase"] for p in history_of(kube_cluster, "p")]
    assert phases[0] == "Pending"
    assert "Running" in phases
    assert phases[-1] == want_phase


def test_the_official_client_s_watch_sees_pending_running_and_succeeded(
    kube_cluster: KubeCluster, v1: client.CoreV1Api
) -> None:
    start = v1.list_namespaced_pod(NS).metadata.resource_version
    v1.create_namespaced_pod(NS, pod("w", "import time; time.sleep(0.2)"))
    seen: list[tuple[str, str, bool]] = []
    stream = watch.Watch().stream(
        v1.list_namespaced_pod, NS, field_selector="metadata.name=w", resource_version=start, timeout_seconds=60
    )
    for event in stream:
        obj = event["object"]
        running = bool(obj.status.container_statuses and obj.status.container_statuses[0].state.running)
        seen.append((event["type"], obj.status.phase, running))
        if obj.status.phase == "Succeeded":
            break
    assert seen[0] == ("ADDED", "Pending", False)
    assert ("MODIFIED", "Running", True) in seen
    assert seen[-1][:2] == ("MODIFIED", "Succeeded")


def test_restart_policy_on_failure_restarts_the_container_in_place(
    kube_cluster: KubeCluster, v1: client.CoreV1Api
) -> None:
    code = "import os, sys; p = '/data/tries'; n = len(open(p).read()) if os.path.exists(p) else 0; "
    code += "open(p, 'a').write('x'); sys.exit(0 if n else 1)"
    spec = pod("r", code, volumes=[{"name": "data", "emptyDir": {}}])
    spec["spec"]["restartPolicy"] = "OnFailure"
    spec["spec"]["containers"][0]["volumeMounts"] = [{"name": "data", "mountPath": "/data"}]
    v1.create_namespaced_pod(NS, spec)
    wait_until(lambda: phase(kube_cluster, "r") == "Succeeded", "the restarted container to succeed")
    status = v1.read_namespaced_pod("r", NS).status.container_statuses[0]
    assert status.restart_count == 1
    assert status.last_state.terminated.exit_code == 1
    assert status.state.terminated.exit_code == 0


# ----------------------------------------------------------------- environment


def test_env_resolves_secrets_config_maps_downward_api_and_expansion(
    kube_cluster: KubeCluster, v1: client.CoreV1Api
) -> None:
    v1.create_namespaced_secret(NS, {"metadata": {"name": "job-token"}, "data": {"token": "czNjcjN0"}})
    v1.create_namespaced_config_map(NS, {"metadata": {"name": "cfg"}, "data": {"mode": "fast", "extra": "1"}})
    env = [
        {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "job-token", "key": "token"}}},
        {"name": "MODE", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "mode"}}},
        {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
        {"name": "POD_NAMESPACE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}},
        {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
        {"name": "NODE", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}},
        {"name": "ROLE", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['role']"}}},
        {"name": "MEM_MIB", "valueFrom": {"resourceFieldRef": {"resource": "limits.memory", "divisor": "1Mi"}}},
        {"name": "CPUS", "valueFrom": {"resourceFieldRef": {"resource": "requests.cpu"}}},
        {"name": "ADDR", "value": "$(POD_IP):50001 $$(POD_IP) $(UNDEFINED)"},
    ]
    code = "import os, json; print(json.dumps({k: os.environ.get(k) for k in os.environ}))"
    spec = pod("e", code, labels={"role": "worker"})
    container = spec["spec"]["containers"][0]
    container["env"] = env
    container["envFrom"] = [{"configMapRef": {"name": "cfg"}, "prefix": "CFG_"}]
    container["resources"] = {"limits": {"memory": "256Mi", "cpu": "1500m"}}
    v1.create_namespaced_pod(NS, spec)
    assert terminated(kube_cluster, "e")["exitCode"] == 0
    seen = json.loads(kube_cluster.kubelet.read_log(NS, "e"))
    obj = v1.read_namespaced_pod("e", NS)
    assert seen["TOKEN"] == "s3cr3t"
    assert seen["MODE"] == "fast"
    assert seen["CFG_mode"] == "fast"
    assert seen["CFG_extra"] == "1"
    assert (seen["POD_NAME"], seen["POD_NAMESPACE"], seen["ROLE"]) == ("e", NS, "worker")
    assert seen["POD_IP"] == obj.status.pod_ip
    assert seen["POD_IP"].startswith("127.")
    assert seen["NODE"] == obj.spec.node_name
    assert (seen["MEM_MIB"], seen["CPUS"]) == ("256", "2")  # a request defaults to the limit; ceil(1.5)
    assert seen["ADDR"] == f"{obj.status.pod_ip}:50001 $(POD_IP) $(UNDEFINED)"
    assert seen["HOSTNAME"] == "e"
    assert Path(seen["KUBECONFIG"]).name == "kubeconfig"
    # The kubelet's own environment underneath, with the test interpreter's scripts on the PATH.
    assert seen["PATH"].endswith(os.environ["PATH"])
    assert str(Path(sys.executable).parent) in seen["PATH"].split(os.pathsep)
    assert seen.get("PYTHONPATH") == os.environ.get("PYTHONPATH")


def test_a_missing_secret_holds_the_container_until_it_exists(kube_cluster: KubeCluster, v1: client.CoreV1Api) -> None:
    spec = pod("s", "import os; print(os.environ['TOKEN'])")
    spec["spec"]["containers"][0]["env"] = [
        {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "later", "key": "token"}}}
    ]
    v1.create_namespaced_pod(NS, spec)

    def waiting() -> Any:
        statuses = v1.read_namespaced_pod("s", NS).status.container_statuses
        return statuses and statuses[0].state.waiting

    state = wait_until(waiting, "the container to wait for its secret")
    assert state.reason == "CreateContainerConfigError"
    assert 'secret "later" not found' in state.message
    assert v1.read_namespaced_pod("s", NS).status.phase == "Pending"
    v1.create_namespaced_secret(NS, {"metadata": {"name": "later"}, "stringData": {"token": "now"}})
    assert terminated(kube_cluster, "s")["exitCode"] == 0
    assert kube_cluster.kubelet.read_log(NS, "s").strip() == "now"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_service_dns_names_and_volume_paths_are_rewritten(kube_cluster: KubeCluster, v1: client.CoreV1Api) -> None:
    port = free_port()
    server = "import http.server as h; h.HTTPServer(('0.0.0.0', %d), h.SimpleHTTPRequestHandler).serve_forever()"
    v1.create_namespaced_pod(NS, pod("master", server % port, labels={"app": "master"}))
    v1.create_namespaced_service(
        NS,
        {
            "metadata": {"name": "job-master"},
            "spec": {"selector": {"app": "master"}, "ports": [{"name": "grpc", "port": 80, "targetPort": port}]},
        },
    )
    v1.create_namespaced_secret(NS, {"metadata": {"name": "creds"}, "stringData": {"key": "k3y"}})
    code = (
        "import os, sys, time, urllib.request\n"
        "addr = os.environ['ADDR']\n"
        "for _ in range(600):\n"
        "    try:\n"
        "        code = urllib.request.urlopen('http://' + addr + '/', timeout=5).status; break\n"
        "    except OSError:\n"
        "        time.sleep(0.1)\n"
        "open(sys.argv[1] + '/saved', 'w').write(str(code))\n"
        "e = os.environ\n"
        "print(addr, e['FULL'], e['NAME'], e['SHM'], open('/etc/creds/key').read(), os.getcwd())\n"
    )
    worker = pod("worker", code)
    worker["spec"]["volumes"] = [
        {"name": "ckpt", "persistentVolumeClaim": {"claimName": "shared"}},
        {"name": "shm", "emptyDir": {"medium": "Memory"}},
        {"name": "creds", "secret": {"secretName": "creds"}},
        {"name": "work", "emptyDir": {}},
    ]
    container = worker["spec"]["containers"][0]
    container["args"] = ["/checkpoints/run1"]
    container["workingDir"] = "/scratch"
    container["env"] = [
        {"name": "ADDR", "value": "job-master.default.svc:80"},
        {"name": "FULL", "value": "job-master.default.svc.cluster.local:80"},
        {"name": "NAME", "value": "job-master.default.svc"},
        {"name": "SHM", "value": "/dev/shm/x"},
    ]
    container["volumeMounts"] = [
        {"name": "ckpt", "mountPath": "/checkpoints"},
        {"name": "shm", "mountPath": "/dev/shm"},
        {"name": "creds", "mountPath": "/etc/creds"},
        {"name": "work", "mountPath": "/scratch"},
    ]
    pvc = kube_cluster.kubelet.root / "pvc" / NS / "shared"
    (pvc / "run1").mkdir(parents=True)
    # The code string is an argument after -c: the paths in it are rewritten as any argument is.
    v1.create_namespaced_pod(NS, worker)
    assert terminated(kube_cluster, "worker")["exitCode"] == 0, kube_cluster.kubelet.read_log(NS, "worker")
    master_ip = v1.read_namespaced_pod("master", NS).status.pod_ip
    addr, full, name, shm, key, cwd = kube_cluster.kubelet.read_log(NS, "worker").split()
    assert addr == f"{master_ip}:{port}"
    assert full == f"{master_ip}:{port}"
    assert name == "job-master.default.svc"  # not dialed (perhaps a TLS server name): as written
    assert shm == "/dev/shm/x"
    assert key == "k3y"
    assert Path(cwd).name == "work"
    assert str(kube_cluster.kubelet.root) in cwd
    assert (pvc / "run1" / "saved").read_text() == "200"
    assert v1.read_namespaced_pod("master", NS).status.pod_ip != v1.read_namespaced_pod("worker", NS).status.pod_ip


# ----------------------------------------------------------------- placement


def test_unschedulable_pod_gets_the_condition_kube_scheduler_writes(
    kube_cluster: KubeCluster, v1: client.CoreV1Api
) -> None:
    spec = pod("big", "pass")
    spec["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "64"}}
    v1.create_namespaced_pod(NS, spec)
    found = wait_until(lambda: (p := get(kube_cluster, "big")) and condition(p, "PodScheduled"), "a condition")
    assert found["status"] == "False"
    assert found["reason"] == "Unschedulable"
    assert found["message"] == "0/3 nodes are available: 3 Insufficient cpu."
    assert phase(kube_cluster, "big") == "Pending"
    assert not get(kube_cluster, "big")["spec"].get("nodeName")  # type: ignore[index]


def test_node_anti_affinity_and_pod_anti_affinity_decide_placement(
    kube_cluster: KubeCluster, v1: client.CoreV1Api
) -> None:
    avoid = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {
                        "matchExpressions": [
                            {"key": "kubernetes.io/hostname", "operator": "NotIn", "values": ["node-0", "node-1"]}
                        ]
                    }
                ]
            }
        }
    }
    v1.create_namespaced_pod(NS, pod("relaunched", "pass", affinity=avoid))
    wait_until(lambda: phase(kube_cluster, "relaunched") == "Succeeded", "the relaunched pod")
    assert v1.read_namespaced_pod("relaunched", NS).spec.node_name == "node-2"

    spread = {
        "podAntiAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": [
                {"labelSelector": {"matchLabels": {"app": "spread"}}, "topologyKey": "kubernetes.io/hostname"}
            ]
        }
    }
    for i in range(4):
        v1.create_namespaced_pod(
            NS, pod(f"s{i}", "import time; time.sleep(300)", labels={"app": "spread"}, affinity=spread)
        )
    nodes = wait_until(
        lambda: (
            [n for i in range(3) if (n := (get(kube_cluster, f"s{i}") or {}).get("spec", {}).get("nodeName"))]
            if all(phase(kube_cluster, f"s{i}") == "Running" for i in range(3))
            else None
        ),
        "three spread pods running",
    )
    # Which pod stays pending depends on the order they were seen; three of four run on three nodes.
    placed = {f"s{i}": (get(kube_cluster, f"s{i}") or {}).get("spec", {}).get("nodeName") for i in range(4)}
    assert sorted(n for n in placed.values() if n) == ["node-0", "node-1", "node-2"], placed
    pending = [name for name, node in placed.items() if not node]
    assert len(pending) == 1
    assert len(nodes) == 3
    cond = wait_until(lambda: condition(get(kube_cluster, pending[0]) or {"status": {}}, "PodScheduled"), "condition")
    assert cond["message"] == "0/3 nodes are available: 3 node(s) didn't match pod anti-affinity rules."
    # A freed node takes the pending pod.
    v1.delete_namespaced_pod("s0" if placed["s0"] else "s1", NS)
    wait_until(lambda: phase(kube_cluster, pending[0]) == "Running", "the pending pod to take the freed node")


# ----------------------------------------------------------------- faults


def running_pid(cluster: KubeCluster, name: str) -> int:
    wait_until(lambda: phase(cluster, name) == "Running", f"{name} running")
    pid = cluster.kubelet.pid(name)
    assert pid is not None
    return pid


def test_deleting_a_pod_sigterms_its_process_group_and_sigkills_after_the_grace(
    kube_cluster: KubeCluster, v1: client.CoreV1Api
) -> None:
    code = (
        "import signal, subprocess, sys, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "child = subprocess.Popen(['sleep', '300'])\n"
        "print(child.pid, flush=True)\n"
        "time.sleep(300)\n"
    )
    v1.create_namespaced_pod(NS, pod("d", code, terminationGracePeriodSeconds=1))
    pid = running_pid(kube_cluster, "d")
    child = int(wait_until(lambda: kube_cluster.kubelet.read_log(NS, "d").strip(), "the child's pid"))
    assert kube_cluster.kubelet.processes("d") == [pid, child]
    response = v1.delete_namespaced_pod("d", NS)
    assert response.metadata.deletion_timestamp is not None  # graceful: the kubelet finishes it
    wait_until(lambda: get(kube_cluster, "d") is None, "the pod to be deleted")
    if kube_cluster.kubelet.memory_enforced:  # the pod is deleted once its cgroup is empty
        assert not alive(pid)
        assert not alive(child)
    wait_until(lambda: not alive(pid) and not alive(child), "the pod's processes to die")
    last = history_of(kube_cluster, "d")[-1]
    state = last["status"]["containerStatuses"][0]["state"]["terminated"]
    assert state["exitCode"] == 137  # SIGTERM ignored, SIGKILL after the grace period


def test_lose_node_kills_its_pods_reports_them_lost_and_deletes_them(
    kube_cluster: KubeCluster, v1: client.CoreV1Api
) -> None:
    v1.create_namespaced_pod(
        NS, pod("victim", "import time; time.sleep(300)", nodeSelector={"kubernetes.io/hostname": "node-0"})
    )
    pid = running_pid(kube_cluster, "victim")
    assert kube_cluster.kubelet.lose_node("node-0") == ["victim"]
    wait_until(lambda: get(kube_cluster, "victim") is None, "the lost pod to be deleted")
    wait_until(lambda: not alive(pid), "the lost pod's process to die")
    failed = [p for p in history_of(kube_cluster, "victim") if p["status"].get("phase") == "Failed"]
    assert failed
    assert failed[0]["status"]["reason"] == "NodeLost"
    assert condition(failed[0], "DisruptionTarget")["reason"] == "DeletionByTaintManager"  # type: ignore[index]
    node = v1.read_node("node-0")
    ready = next(c for c in node.status.conditions if c.type == "Ready")
    assert ready.status == "Unknown"
    assert {t.key for t in node.spec.taints} == {"node.kubernetes.io/unreachable"}
    # Nothing new goes to the lost node.
    pinned = pod("pinned", "pass", nodeSelector={"kubernetes.io/hostname": "node-0"})
    v1.create_namespaced_pod(NS, pinned)
    cond = wait_until(lambda: condition(get(kube_cluster, "pinned") or {"status": {}}, "PodScheduled"), "condition")
    assert "1 node(s) had untolerated taint {node.kubernetes.io/unreachable: }" in cond["message"]
    kube_cluster.kubelet.restore_node("node-0")
    wait_until(lambda: phase(kube_cluster, "pinned") == "Succeeded", "the pinned pod after the node came back")


def test_an_unreachable_node_s_pods_stay_running_not_ready_then_terminating_until_force_deleted() -> None:
    nodes = [SimNode("node-0"), SimNode("node-1")]
    with (
        KubeCluster(nodes, node_lost_eviction_s=0.5) as cluster,
        client.ApiClient(client.Configuration(host=cluster.url)) as api,
    ):
        v1 = client.CoreV1Api(api)
        body = pod("victim", "import time; time.sleep(300)", nodeSelector={"kubernetes.io/hostname": "node-0"})
        body["spec"]["terminationGracePeriodSeconds"] = 1
        v1.create_namespaced_pod(NS, body)
        pid = running_pid(cluster, "victim")
        assert cluster.kubelet.lose_node("node-0", unreachable=True) == ["victim"]
        wait_until(lambda: not alive(pid), "the lost node's process to die")
        # As a real cluster shows it: not ready, still Running; then deleted by the taint manager and left
        # Terminating, since no kubelet on the node confirms the deletion.
        terminating = wait_until(
            lambda: (p := get(cluster, "victim")) is not None and p["metadata"].get("deletionTimestamp") and p,
            "the taint manager's deletion",
        )
        assert terminating["status"]["phase"] == "Running"
        assert condition(terminating, "Ready")["status"] == "False"  # type: ignore[index]
        assert condition(terminating, "DisruptionTarget")["reason"] == "DeletionByTaintManager"  # type: ignore[index]
        assert terminating["metadata"]["deletionGracePeriodSeconds"] == 1
        assert not any(p["status"].get("phase") == "Failed" for p in history_of(cluster, "victim"))
        # Still there once its grace is over (its kubelet is gone): only a force delete removes it.
        deadline = datetime.datetime.fromisoformat(terminating["metadata"]["deletionTimestamp"]).timestamp()
        wait_until(lambda: time.time() > deadline + 1.0, "the grace period to pass")
        stamp = terminating["metadata"]["resourceVersion"]
        v1.create_namespaced_pod(NS, pod("witness", "pass"))  # the kubelet's loop runs after the grace
        wait_until(lambda: phase(cluster, "witness") == "Succeeded", "a pod on the other node")
        current = get(cluster, "victim")
        assert current is not None
        assert current["metadata"]["resourceVersion"] == stamp
        v1.delete_namespaced_pod("victim", NS, grace_period_seconds=0)
        assert get(cluster, "victim") is None
        cluster.kubelet.restore_node("node-0")


def test_evict_fails_the_pod_with_reason_evicted_and_keeps_it(kube_cluster: KubeCluster, v1: client.CoreV1Api) -> None:
    v1.create_namespaced_pod(NS, pod("ev", "import time; time.sleep(300)"))
    pid = running_pid(kube_cluster, "ev")
    kube_cluster.kubelet.evict("ev")
    wait_until(lambda: phase(kube_cluster, "ev") == "Failed", "the evicted pod to fail")
    obj = v1.read_namespaced_pod("ev", NS)
    assert obj.status.reason == "Evicted"
    assert condition(get(kube_cluster, "ev") or {}, "DisruptionTarget")["reason"] == "TerminationByKubelet"  # type: ignore[index]
    assert obj.status.container_statuses[0].state.terminated.exit_code == 137
    assert not alive(pid)


def test_preempt_marks_the_pod_and_deletes_it_gracefully(kube_cluster: KubeCluster, v1: client.CoreV1Api) -> None:
    v1.create_namespaced_pod(NS, pod("pre", "import time; time.sleep(300)"))
    pid = running_pid(kube_cluster, "pre")
    kube_cluster.kubelet.preempt("pre")
    wait_until(lambda: get(kube_cluster, "pre") is None, "the preempted pod to be deleted")
    assert not alive(pid)
    versions = history_of(kube_cluster, "pre")
    marked = [p for p in versions if (condition(p, "DisruptionTarget") or {}).get("reason") == "PreemptionByScheduler"]
    assert marked
    assert marked[0]["metadata"].get("deletionTimestamp") is None
    assert versions[-1]["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 143


def test_kill_process_signals_the_container_s_main_process(kube_cluster: KubeCluster, v1: client.CoreV1Api) -> None:
    v1.create_namespaced_pod(NS, pod("k", "import time; time.sleep(300)"))
    pid = running_pid(kube_cluster, "k")
    with pytest.raises(TypeError, match="namespace must be a str"):
        kube_cluster.kubelet.kill_process("k", signal.SIGKILL)  # type: ignore[arg-type]
    assert kube_cluster.kubelet.kill_process("k", NS, signal.SIGKILL) == pid
    assert terminated(kube_cluster, "k")["exitCode"] == 137


def test_memory_limit_over_use_is_oom_killed(kube_cluster: KubeCluster, v1: client.CoreV1Api) -> None:
    if not kube_cluster.kubelet.memory_enforced:
        pytest.skip(f"no memory cgroup here: {kube_cluster.kubelet.memory_enforcement}")
    spec = pod("oom", "b = b'x' * (512 << 20); print(len(b))")
    spec["spec"]["containers"][0]["resources"] = {"limits": {"memory": "64Mi"}}
    v1.create_namespaced_pod(NS, spec)
    state = terminated(kube_cluster, "oom")
    assert (state["reason"], state["exitCode"]) == ("OOMKilled", 137)
    assert phase(kube_cluster, "oom") == "Failed"


def test_stop_leaves_no_process_cgroup_or_directory() -> None:
    code = "import subprocess, time; c = subprocess.Popen(['sleep', '300']); print(c.pid, flush=True); time.sleep(300)"
    with KubeCluster([SimNode("only", cpu="2", memory="2Gi")]) as cluster:
        kubelet: Kubelet = cluster.kubelet
        with client.ApiClient(client.Configuration(host=cluster.url)) as api:
            client.CoreV1Api(api).create_namespaced_pod(NS, pod("a", code))
        pid = running_pid(cluster, "a")
        child = int(wait_until(lambda: kubelet.read_log(NS, "a").strip(), "the child's pid"))
        root = kubelet.root
        enforced = kubelet.memory_enforced
        threads_before = {t for t in threading.enumerate() if t.name.startswith("kubelet-")}
        assert threads_before
    assert not alive(pid)
    assert not alive(child)
    assert not root.exists()
    assert not any(t.name.startswith("kubelet-") for t in threading.enumerate())
    if enforced:
        parent = Path(f"/proc/{os.getpid()}/cgroup").read_text()
        assert parent  # the groups were under our own memory cgroup; none named after us is left
        groups = _memory_cgroup_dir()
        assert groups is not None
        assert not [p.name for p in groups.iterdir() if p.name.startswith(f"kubelet-{os.getpid()}-")]


def _memory_cgroup_dir() -> Path | None:
    from dlrover.master.scheduler.cgroups import CgroupMemoryGroups, detect_memory_groups

    groups = detect_memory_groups(probe_name=f"test-kubelet-probe-{os.getpid()}")
    return groups.parent if isinstance(groups, CgroupMemoryGroups) else None


def test_a_store_without_graceful_deletion_still_gets_processes_killed() -> None:
    store = Store()
    with Kubelet(store, [SimNode("n")]) as kubelet:
        rt = store.resource_type("", "v1", "pods")
        store.create(rt, NS, pod("x", "import time; time.sleep(300)"))
        wait_until(lambda: store.get(rt, NS, "x")["status"]["phase"] == "Running", "x running")
        pid = kubelet.pid("x")
        assert pid is not None
        store.delete(rt, NS, "x")  # removed at once: the kubelet sees DELETED and stops the processes
        wait_until(lambda: not alive(pid), "the deleted pod's process to die")


def test_pod_logs_are_served_and_requests_carry_the_pod_s_service_account(
    kube_cluster: KubeCluster, v1: client.CoreV1Api
) -> None:
    code = (
        "import os\n"
        "from kubernetes import client, config\n"
        "config.load_kube_config()\n"
        "print('line 1')\n"
        "print(len(client.CoreV1Api().list_namespaced_pod(os.environ['NS']).items))\n"
    )
    spec = pod("logger", code, serviceAccountName="job-master")
    spec["spec"]["containers"][0]["env"] = [
        {"name": "NS", "valueFrom": {"fieldRef": {"fieldPath": "metadata.namespace"}}}
    ]
    v1.create_namespaced_pod(NS, spec)
    assert terminated(kube_cluster, "logger")["exitCode"] == 0, kube_cluster.kubelet.read_log(NS, "logger")
    assert v1.read_namespaced_pod_log("logger", NS) == "line 1\n1\n"
    assert v1.read_namespaced_pod_log("logger", NS, container="main", tail_lines=1) == "1\n"
    with pytest.raises(client.ApiException) as info:
        v1.read_namespaced_pod_log("logger", NS, container="nope")
    assert info.value.status == 400
    from_pod = [r for r in kube_cluster.server.requests() if r.user == "serviceaccount:default:job-master"]
    assert [(r.verb, r.resource, r.namespace) for r in from_pod] == [("list", "pods", NS)]


def test_without_cgroups_memory_is_unlimited_and_deletion_still_kills_strays() -> None:
    from dlrover.master.scheduler.cgroups import UnavailableMemoryGroups

    code = (
        "import signal, subprocess, time\n"
        "signal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "c = subprocess.Popen(['sleep', '300'], start_new_session=True)\n"
        "print(c.pid, flush=True)\n"
        "time.sleep(300)\n"
    )
    groups = UnavailableMemoryGroups("this test runs without them")
    with KubeCluster([SimNode("n")], memory_groups=groups) as cluster:
        assert not cluster.kubelet.memory_enforced
        assert "this test runs without them" in cluster.kubelet.memory_enforcement
        with client.ApiClient(client.Configuration(host=cluster.url)) as api:
            v1 = client.CoreV1Api(api)
            spec = pod("s", code, terminationGracePeriodSeconds=1)
            spec["spec"]["containers"][0]["resources"] = {"limits": {"memory": "16Mi"}}
            v1.create_namespaced_pod(NS, spec)
            pid = running_pid(cluster, "s")
            stray = int(wait_until(lambda: cluster.kubelet.read_log(NS, "s").strip(), "the stray's pid"))
            assert os.getsid(stray) == stray  # it left the pod's session
            v1.delete_namespaced_pod("s", NS)
            wait_until(lambda: get(cluster, "s") is None, "the pod to be deleted")
        wait_until(lambda: not alive(pid) and not alive(stray), "the pod's processes to die")


def test_what_cannot_run_fails_the_pod_saying_why(kube_cluster: KubeCluster, v1: client.CoreV1Api) -> None:
    missing = pod("missing", "pass")
    missing["spec"]["containers"][0]["command"] = ["no-such-command-here"]
    v1.create_namespaced_pod(NS, missing)
    state = terminated(kube_cluster, "missing")
    assert (state["exitCode"], state["reason"]) == (128, "StartError")
    assert 'exec: "no-such-command-here": executable file not found in $PATH' in state["message"]
    init = pod("init", "pass", initContainers=[{"name": "setup", "image": "x", "command": ["true"]}])
    v1.create_namespaced_pod(NS, init)
    wait_until(lambda: phase(kube_cluster, "init") == "Failed", "the pod with init containers to fail")
    status = v1.read_namespaced_pod("init", NS).status
    assert status.reason == "UnsupportedByTestKubelet"
    assert status.message == "initContainers are not run by the test kubelet"


def test_the_test_s_console_scripts_are_on_the_pod_s_path(kube_cluster: KubeCluster, v1: client.CoreV1Api) -> None:
    script = Path(sys.executable).parent / "dlrover-master"
    if not script.exists():
        pytest.skip(f"{script} is not installed in this environment")
    spec = pod("cli", "pass")
    spec["spec"]["containers"][0]["command"] = ["dlrover-master", "--help"]
    v1.create_namespaced_pod(NS, spec)
    assert terminated(kube_cluster, "cli")["exitCode"] == 0
    assert "--backend" in kube_cluster.kubelet.read_log(NS, "cli")


def test_every_container_of_a_pod_runs_and_the_pod_fails_if_one_fails(
    kube_cluster: KubeCluster, v1: client.CoreV1Api
) -> None:
    spec = pod("two", "print('first')")
    spec["spec"]["containers"].append({"name": "side", "image": "x", "command": [PY, "-c", "print('second'); exit(2)"]})
    v1.create_namespaced_pod(NS, spec)
    wait_until(lambda: phase(kube_cluster, "two") == "Failed", "the two-container pod to fail")
    codes = {s.name: s.state.terminated.exit_code for s in v1.read_namespaced_pod("two", NS).status.container_statuses}
    assert codes == {"main": 0, "side": 2}
    assert v1.read_namespaced_pod_log("two", NS, container="side") == "second\n"
    assert kube_cluster.kubelet.read_log(NS, "two") == "first\n"  # the first container by default


def test_the_kubelet_relists_when_the_history_is_compacted_under_it(
    kube_cluster: KubeCluster, v1: client.CoreV1Api
) -> None:
    v1.create_namespaced_pod(NS, pod("before", "import time; time.sleep(300)"))
    running_pid(kube_cluster, "before")
    for _ in range(3):
        kube_cluster.server.faults.compact()
        v1.create_namespaced_pod(NS, pod(f"after-{_}", "pass"))
    for i in range(3):
        wait_until(lambda i=i: phase(kube_cluster, f"after-{i}") == "Succeeded", f"after-{i} to run")
    kube_cluster.server.faults.compact()
    v1.delete_namespaced_pod("before", NS)
    wait_until(lambda: get(kube_cluster, "before") is None, "the deletion to be finished after a relist")


def test_pods_run_and_deletions_finish_with_a_history_of_three_events() -> None:
    # With so short a history the kubelet's watches fall behind and are answered 410 whenever the
    # writes outpace them; whether or not that happens in a run, every pod must run and go.
    from dlrover_testsupport.kube import ApiServer

    with ApiServer(Store(graceful_pod_deletion=True, history_limit=3)) as server, Kubelet(server.store) as kubelet:
        rt = server.store.resource_type("", "v1", "pods")
        for i in range(8):
            server.store.create(rt, NS, pod(f"p{i}", "pass"))
        for i in range(8):
            wait_until(lambda i=i: server.store.get(rt, NS, f"p{i}")["status"]["phase"] == "Succeeded", f"p{i}")
        server.store.create(rt, NS, pod("long", "import time; time.sleep(300)"))
        wait_until(lambda: server.store.get(rt, NS, "long")["status"]["phase"] == "Running", "long running")
        pid = kubelet.pid("long")
        assert pid is not None
        server.store.delete(rt, NS, "long")
        wait_until(lambda: "long" not in {p["metadata"]["name"] for p in server.store.list(rt, NS)[0]}, "deleted")
        wait_until(lambda: not alive(pid), "the deleted pod's process to die")
