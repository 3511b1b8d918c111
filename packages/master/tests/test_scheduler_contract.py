"""The contract every scheduler backend passes, plus what only the local backend does."""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from dlrover.common import ConfigError
from dlrover.master.scheduler import (
    ExternalScheduler,
    FakeScheduler,
    LocalScheduler,
    NodeSpec,
    ObservedState,
    SchedulerBackend,
    SchedulerError,
)
from dlrover.master.scheduler.base import NodeRejectedError

# An "agent" that starts a grandchild in its group, writes both pids, and waits.
AGENT = r"""
import os, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
path = os.environ["PID_FILE"]
with open(path + ".tmp", "w") as f:
    f.write(f"{os.getpid()} {child.pid}")
os.replace(path + ".tmp", path)
time.sleep(600)
"""


def wait_for(predicate: Callable[[], bool], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError("condition not met in time")
        time.sleep(0.02)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie is dead for our purposes; /proc tells them apart on Linux.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split()[2] != "Z"
    except FileNotFoundError:
        return False


def local_backend(tmp_path: Path) -> LocalScheduler:
    return LocalScheduler([sys.executable, "-c", "import time; time.sleep(600)"], stop_grace_s=5.0)


REAL_CLUSTER_ENV_VAR = "DLROVER_TEST_KUBECONFIG"
"""A kubeconfig: the kubernetes backend's contract also runs against that cluster (namespace
`DLROVER_TEST_KUBE_NAMESPACE`, default `default`); skipped when unset."""


def _kube_settings(namespace: str, kubeconfig: str | None = None) -> Any:
    from dlrover.master.scheduler.kubernetes import KubernetesSettings

    job = f"contract-{os.getpid()}-{time.monotonic_ns() % 10**6}"
    return KubernetesSettings(namespace=namespace, job=job, master_address="127.0.0.1:1", kubeconfig=kubeconfig)


_TEMPLATE = {"spec": {"containers": [{"name": "main", "image": "dlrover", "command": ["dlrover-run"]}]}}


def kubernetes_backend(_tmp_path: Path, stack: contextlib.ExitStack) -> SchedulerBackend:
    """Worker pods on the test API server (no kubelet runs them: they stay pending)."""
    pytest.importorskip("kubernetes")
    from dlrover_testsupport.kube import ApiServer
    from kubernetes import client

    from dlrover.master.scheduler.kubernetes import KubernetesScheduler, WorkerTemplate

    server = stack.enter_context(ApiServer())
    api = stack.enter_context(client.ApiClient(client.Configuration(host=server.url)))
    return KubernetesScheduler(api, _kube_settings("default"), WorkerTemplate(_TEMPLATE))


def real_kubernetes_backend(_tmp_path: Path, _stack: contextlib.ExitStack) -> SchedulerBackend:
    """Worker pods on the cluster `DLROVER_TEST_KUBECONFIG` names (they may stay pending: the image is a stand-in)."""
    kubeconfig = os.environ.get(REAL_CLUSTER_ENV_VAR)
    if not kubeconfig:
        pytest.skip(f"no real cluster: set {REAL_CLUSTER_ENV_VAR} to a kubeconfig to run the contract against one")
    pytest.importorskip("kubernetes")
    from dlrover.master.kube import load_api_client
    from dlrover.master.scheduler.kubernetes import KubernetesScheduler, WorkerTemplate

    namespace = os.environ.get("DLROVER_TEST_KUBE_NAMESPACE", "default")
    api = load_api_client(kubeconfig)
    return KubernetesScheduler(api, _kube_settings(namespace, kubeconfig), WorkerTemplate(_TEMPLATE), owns_client=True)


def ray_backend_on_fake_cluster(_tmp_path: Path, _stack: contextlib.ExitStack) -> SchedulerBackend:
    """The Ray backend on an in-memory cluster of two one-CPU nodes (the real cluster runs the same contract
    in tests/ray/test_ray_backend_contract.py)."""
    from dlrover.master.scheduler.ray import FakeRayCluster, RayScheduler

    cluster = FakeRayCluster()
    for name in ("ray-node-a", "ray-node-b"):
        cluster.add_node(name, CPU=1.0)
    return RayScheduler(["dlrover-run", "train.py"], cluster)


BACKENDS: dict[str, Callable[[Path, contextlib.ExitStack], SchedulerBackend]] = {
    "fake": lambda _p, _s: FakeScheduler(),
    "external": lambda _p, _s: ExternalScheduler(),
    "local": lambda p, _s: local_backend(p),
    "kubernetes": kubernetes_backend,
    "kubernetes-real-cluster": real_kubernetes_backend,
    "ray-fake-cluster": ray_backend_on_fake_cluster,
}


@pytest.fixture(params=sorted(BACKENDS))
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SchedulerBackend]:
    with contextlib.ExitStack() as stack:
        b = BACKENDS[request.param](tmp_path, stack)
        yield b
        b.close()


def spec(node_id: int) -> NodeSpec:
    return NodeSpec(job_name="j", node_id=node_id, rank=node_id)


def test_contract_launch_observe_stop(backend: SchedulerBackend) -> None:
    assert isinstance(backend, SchedulerBackend)
    assert backend.observe() == {}
    backend.launch(spec(0))
    backend.launch(spec(1))
    seen = backend.observe()
    assert sorted(seen) == [0, 1]
    assert all(n.state in (ObservedState.PENDING, ObservedState.RUNNING) for n in seen.values())
    with pytest.raises(SchedulerError, match="node 0 was already launched"):
        backend.launch(spec(0))
    backend.stop(0)
    backend.stop(0)  # idempotent
    backend.stop(99)  # unknown: no-op
    wait_for(lambda: backend.observe()[0].state is ObservedState.STOPPED)
    assert backend.observe()[1].state in (ObservedState.PENDING, ObservedState.RUNNING)


def test_contract_capacity_is_unknown_or_counts_held_nodes(backend: SchedulerBackend) -> None:
    """None (unknown or unbounded) stays None; a count drops by one per node held and comes back
    as soon as a node is told to stop."""
    if isinstance(backend, FakeScheduler):
        backend.slots = 2  # the fake plays a bounded backend; unbounded is None as for the others
    if isinstance(backend, LocalScheduler):
        backend.set_slots(2)
    before = backend.capacity()
    backend.launch(spec(0))
    if before is None:
        assert backend.capacity() is None
        return
    assert backend.capacity() == before - 1
    backend.launch(spec(1))
    backend.launch(spec(2))  # one more than fits: it waits (pending) or is held over the room
    assert backend.capacity() == before - 3
    assert backend.observe()[2].state is ObservedState.PENDING
    backend.stop(0)
    assert backend.capacity() == before - 2


def test_contract_close_stops_everything(backend: SchedulerBackend) -> None:
    backend.launch(spec(0))
    backend.close()
    backend.close()
    assert all(n.state is ObservedState.STOPPED for n in backend.observe().values())


@pytest.mark.integration
def test_local_stop_kills_the_whole_process_group(tmp_path: Path) -> None:
    pid_file = tmp_path / "pids"
    sched = LocalScheduler([sys.executable, "-c", AGENT], stop_grace_s=5.0)
    try:
        sched.launch(NodeSpec("j", 0, 0, env={"PID_FILE": str(pid_file)}))
        wait_for(pid_file.exists)
        agent, grandchild = (int(x) for x in pid_file.read_text().split())
        assert sched.pid(0) == agent
        assert sched.observe()[0].state is ObservedState.RUNNING
        sched.stop(0)
        wait_for(lambda: sched.observe()[0].state is ObservedState.STOPPED)
        wait_for(lambda: not alive(grandchild))
    finally:
        sched.close()
    assert not alive(agent)


def test_local_kill_ends_a_node_that_ignores_sigterm_without_its_grace(tmp_path: Path) -> None:
    pid_file = tmp_path / "pids"
    stubborn = "import signal; signal.signal(signal.SIGTERM, signal.SIG_IGN)\n" + AGENT
    sched = LocalScheduler([sys.executable, "-c", stubborn], stop_grace_s=3600.0)
    try:
        sched.launch(NodeSpec("j", 0, 0, env={"PID_FILE": str(pid_file)}))
        wait_for(pid_file.exists)
        agent, grandchild = (int(x) for x in pid_file.read_text().split())
        sched.kill(0)
        sched.kill(0)  # idempotent
        wait_for(lambda: sched.observe()[0].state is ObservedState.STOPPED)
        wait_for(lambda: not alive(grandchild))
        assert not alive(agent)
        sched.kill(99)  # unknown: nothing
    finally:
        sched.close()


@pytest.mark.integration
def test_local_close_leaves_no_orphans_and_reports_exits(tmp_path: Path) -> None:
    pid_file = tmp_path / "pids"
    sched = LocalScheduler([sys.executable, "-c", AGENT], stop_grace_s=0.5)
    sched.launch(NodeSpec("j", 0, 0, env={"PID_FILE": str(pid_file)}))
    wait_for(pid_file.exists)
    _agent, grandchild = (int(x) for x in pid_file.read_text().split())
    sched.close()
    wait_for(lambda: not alive(grandchild))
    with pytest.raises(SchedulerError, match="closed"):
        sched.launch(NodeSpec("j", 1, 1))

    exits = LocalScheduler([sys.executable, "-c", "import os, sys; sys.exit(int(os.environ['CODE']))"])
    try:
        exits.launch(NodeSpec("j", 0, 0, env={"CODE": "0"}))
        exits.launch(NodeSpec("j", 1, 1, env={"CODE": "3"}))
        wait_for(lambda: all(n.state is not ObservedState.RUNNING for n in exits.observe().values()))
        seen = exits.observe()
        assert seen[0].state is ObservedState.SUCCEEDED
        assert (seen[1].state, seen[1].exit_code) == (ObservedState.FAILED, 3)
    finally:
        exits.close()


def test_local_refuses_bad_settings_and_avoided_hosts() -> None:
    with pytest.raises(ConfigError, match="agent command"):
        LocalScheduler([])
    sched = LocalScheduler(["/nonexistent/agent"])
    try:
        # Refusals that every relaunch would meet alike: the master stops the job with them.
        with pytest.raises(NodeRejectedError, match=r"cannot start node 0 .*every node of this backend starts with"):
            sched.launch(spec(0))
        import socket

        with pytest.raises(NodeRejectedError, match="avoided, and every node of the local backend runs on it"):
            sched.launch(NodeSpec("j", 1, 1, avoid_hosts=frozenset({socket.gethostname()})))
    finally:
        sched.close()


def test_a_master_whose_local_agent_command_cannot_run_stops_the_job_at_once_with_the_reason() -> None:
    from dlrover.common import ManualClock
    from dlrover.master.config import LifecycleConfig, MasterConfig, NodeRange
    from dlrover.master.journal import MemoryJournal
    from dlrover.master.master import Master
    from dlrover.master.states import JobState

    sched = LocalScheduler(["/nonexistent/agent"])
    config = MasterConfig(job_name="t", lifecycle=LifecycleConfig(nodes=NodeRange(2, 2)))
    master = Master(config, sched, MemoryJournal(), ManualClock())
    try:
        master.start()
        status = master.status()
        assert status.state is JobState.FAILED
        assert "cannot be started: cannot start node 0 ('/nonexistent/agent')" in status.exit_reason
        assert "relaunch" not in [e.kind for e in master.events(limit=1000)]  # no launch retried in a loop
    finally:
        sched.close()
