"""The Ray backend and its `RayApiCluster` on a real local Ray cluster: what the in-memory `FakeRayCluster`
plays in packages/master/tests/test_ray_backend.py is what Ray does (agent exits, a command that cannot
start, an actor killed while its node lives), and the scheduler contract every backend passes."""

from __future__ import annotations

import importlib.util
import os
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

import psutil
import pytest
from dlrover_testsupport.ray import RayTestCluster

from dlrover.master.scheduler import NodeSpec, ObservedState
from dlrover.master.scheduler.ray import AgentFate, AgentLaunch, RayApiCluster, RayScheduler, RaySettings

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

WAIT_S = 120.0


def wait_for(what: str, predicate: Callable[[], bool], timeout_s: float = WAIT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def settings_for(cluster: RayTestCluster) -> RaySettings:
    return RaySettings(address=cluster.address, temp_dir=cluster.temp_dir, death_confirm_s=2.0, stop_grace_s=2.0)


@pytest.fixture
def ray_env(ray_cluster: RayTestCluster, monkeypatch: pytest.MonkeyPatch) -> RayTestCluster:
    for name, value in ray_cluster.env.items():
        monkeypatch.setenv(name, value)
    return ray_cluster


@pytest.fixture
def api(ray_env: RayTestCluster) -> Iterator[RayApiCluster]:
    cluster = RayApiCluster(settings_for(ray_env), f"contract-{uuid.uuid4().hex[:6]}")
    yield cluster
    cluster.close()


def _launch(api: RayApiCluster, cluster: RayTestCluster, node_id: int, code: str, marker: str) -> None:
    ray_node = sorted(cluster.alive_node_ids())[node_id % len(cluster.alive_node_ids())]
    command = [sys.executable, "-c", code]
    api.start_agent(AgentLaunch(node_id, ray_node, {"CPU": 1.0}, command, {"CONTRACT_MARKER": marker}))


def _processes_marked(marker: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get("CONTRACT_MARKER") == marker:
                found.append(proc)
        except psutil.Error:
            continue
    return found


def test_the_api_cluster_reports_exits_start_failures_and_killed_actors(
    api: RayApiCluster, ray_env: RayTestCluster
) -> None:
    marker = uuid.uuid4().hex
    _launch(api, ray_env, 0, "import sys, time; time.sleep(1); sys.exit(3)", marker)
    wait_for("the agent's exit", lambda: api.report(0).fate is AgentFate.EXITED)
    assert api.report(0).exit_code == 3
    api.release(0)

    api.start_agent(AgentLaunch(1, sorted(ray_env.alive_node_ids())[0], {"CPU": 1.0}, ["/nonexistent/dlrover-run"], {}))
    # The agent starts through the orphan guard, which cannot exec the command: exit 127, as a shell says.
    wait_for("the start to fail", lambda: api.report(1).fate is AgentFate.EXITED)
    assert api.report(1).exit_code == 127
    api.release(1)

    _launch(api, ray_env, 2, "import time; time.sleep(600)", marker)
    wait_for("the agent to run", lambda: api.report(2).fate is AgentFate.RUNNING and bool(_processes_marked(marker)))
    (agent,) = _processes_marked(marker)
    actor = psutil.Process(agent.ppid())
    assert api.wait(0.01) is False  # nothing changed
    actor.kill()  # the actor's process alone; its node lives
    assert api.wait(WAIT_S) is True
    wait_for("Ray to call it dead", lambda: api.report(2).fate is AgentFate.DIED)
    wait_for("the agent to die with its actor", lambda: not _processes_marked(marker))


@pytest.fixture
def backend(ray_env: RayTestCluster) -> Iterator[RayScheduler]:
    command = [sys.executable, "-c", "import time; time.sleep(600)"]
    scheduler = RayScheduler.connect(command, settings_for(ray_env), job_name=f"contract-{os.getpid()}")
    yield scheduler
    scheduler.close()


def _shared_contract() -> ModuleType:
    """packages/master/tests/test_scheduler_contract.py: the checks every backend passes (not a package: loaded
    by path)."""
    path = Path(__file__).resolve().parents[2] / "packages" / "master" / "tests" / "test_scheduler_contract.py"
    loader_spec = importlib.util.spec_from_file_location("dlrover_scheduler_contract", path)
    assert loader_spec is not None
    assert loader_spec.loader is not None
    module = importlib.util.module_from_spec(loader_spec)
    loader_spec.loader.exec_module(module)
    return module


CONTRACT = _shared_contract()


def test_contract_launch_observe_stop(backend: RayScheduler) -> None:
    CONTRACT.test_contract_launch_observe_stop(backend)


def test_contract_capacity_is_unknown_or_counts_held_nodes(backend: RayScheduler) -> None:
    assert backend.capacity() == 2  # the module's two one-CPU Ray nodes: a count, not None
    CONTRACT.test_contract_capacity_is_unknown_or_counts_held_nodes(backend)


def test_contract_close_stops_everything(backend: RayScheduler) -> None:
    CONTRACT.test_contract_close_stops_everything(backend)


def test_one_running_agent_per_ray_node(backend: RayScheduler, ray_env: RayTestCluster) -> None:
    for node_id in (0, 1):
        backend.launch(NodeSpec(job_name="j", node_id=node_id, rank=node_id))
    wait_for("both to run", lambda: all(n.state is ObservedState.RUNNING for n in backend.observe().values()))
    assert {backend.placed_host(0), backend.placed_host(1)} == ray_env.alive_node_ids()
