"""The Ray test cluster against real Ray: nodes registered, an actor pinned to a node dies with it
when the node is killed (with everything it started), nodes added and removed."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from dlrover_testsupport.ray import ProcessInfo, RayNode, RayTestCluster, alive
from dlrover_testsupport.ray.fixtures import import_ray

ray = import_ray()

from ray.exceptions import ActorDiedError, ActorUnavailableError  # noqa: E402
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy  # noqa: E402

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]

RAY_TEST_NODES = [{"num_cpus": 1}, {"num_cpus": 1, "resources": {"spare": 1}}]


@pytest.fixture(scope="module")
def driver(ray_cluster: RayTestCluster) -> Iterator[RayTestCluster]:
    ray_cluster.connect()
    yield ray_cluster
    ray_cluster.disconnect()


@ray.remote(num_cpus=1, max_restarts=0)
class Pinned:
    """An actor that can start a child in a new session, as torch elastic starts its workers."""

    def __init__(self, with_child: bool) -> None:
        self.child = (
            subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
            if with_child
            else None
        )

    def pids(self) -> tuple[int, int]:
        assert self.child is not None
        return os.getpid(), self.child.pid

    def node_id(self) -> str:
        return str(ray.get_runtime_context().get_node_id())


def _pinned_to(node: RayNode, with_child: bool = False) -> ray.actor.ActorHandle:
    strategy = NodeAffinitySchedulingStrategy(node.node_id, soft=False)
    return Pinned.options(scheduling_strategy=strategy).remote(with_child)


def _wait_dead(actor: ray.actor.ActorHandle, timeout_s: float = 60.0) -> None:
    """Until a call on `actor` raises ActorDiedError (ActorUnavailableError only means "maybe")."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            ray.get(actor.node_id.remote(), timeout=timeout_s)
        except ActorDiedError:
            return
        except ActorUnavailableError:
            pass
        assert time.monotonic() < deadline, "the actor of a killed node still answers"
        time.sleep(0.2)


def _wait_ended(processes: list[ProcessInfo], timeout_s: float = 60.0) -> None:
    """Until none of `processes` runs."""
    deadline = time.monotonic() + timeout_s
    while running := [p for p in processes if alive(p)]:
        assert time.monotonic() < deadline, f"still running after {timeout_s} s: {running}"
        time.sleep(0.2)


def test_nodes_are_registered_apart_from_the_head(ray_cluster: RayTestCluster) -> None:
    ids = {node.node_id for node in ray_cluster.nodes}
    assert len(ids) == 2
    assert ray_cluster.wait_for_nodes(2) == ids
    assert ray_cluster.head_node_id not in ids
    # Every Ray file of the cluster is under its own directory.
    assert any(p.name.startswith("session_") for p in Path(ray_cluster.temp_dir).iterdir())
    assert (Path(ray_cluster.temp_dir) / "ray" / "ray_current_cluster").read_text().strip() == ray_cluster.address
    for node in ray_cluster.nodes:
        names = [p.cmdline for p in ray_cluster.processes(node)]
        assert any("raylet" in name for name in names)


def test_killed_node_takes_its_actor_and_every_process_with_it(driver: RayTestCluster) -> None:
    victim, other = driver.nodes
    actor = _pinned_to(victim, with_child=True)
    actor_pid, child_pid = ray.get(actor.pids.remote(), timeout=60)
    assert ray.get(actor.node_id.remote(), timeout=60) == victim.node_id
    on_node = {p.pid: p for p in driver.processes(victim)}
    # The child left the raylet's session but is still found as the node's.
    assert {victim.raylet_pid, actor_pid, child_pid} <= set(on_node)
    assert not {p.pid for p in driver.processes(other)} & set(on_node)
    assert driver.node_running(child_pid) is victim
    assert driver.node_running(os.getpid()) is None

    killed = driver.kill_node(victim)

    assert {actor_pid, child_pid, victim.raylet_pid} <= {p.pid for p in killed}
    assert not [p for p in on_node.values() if alive(p)]
    assert driver.wait_for_nodes(1, timeout_s=60) == {other.node_id}
    _wait_dead(actor)
    assert victim not in driver.nodes


def test_added_node_takes_work(driver: RayTestCluster) -> None:
    before = driver.alive_node_ids()
    added = driver.add_node(num_cpus=1, resources={"fresh": 1})
    assert driver.wait_for_nodes(len(before) + 1) == {*before, added.node_id}
    actor = _pinned_to(added)
    assert ray.get(actor.node_id.remote(), timeout=60) == added.node_id
    ray.kill(actor)


def test_removed_node_stops_gracefully(driver: RayTestCluster) -> None:
    node = driver.nodes[-1]
    actor = _pinned_to(node, with_child=True)
    _, child_pid = ray.get(actor.pids.remote(), timeout=60)
    processes = driver.processes(node)
    others = driver.alive_node_ids() - {node.node_id}

    driver.remove_node(node)

    assert driver.wait_for_nodes(len(others), timeout_s=60) == others
    _wait_dead(actor)
    # Ray stops the node's own processes and its workers, but not what a worker started in a new
    # session (why DLRover's agents arm a parent-death signal): the test ends that one itself.
    # `remove_node` waits only for the node's own processes; its workers exit when they see their
    # raylet gone, and the head may call the actor dead before its worker has exited.
    child = next(p for p in processes if p.pid == child_pid)
    _wait_ended([p for p in processes if p is not child])
    if alive(child):
        os.kill(child.pid, signal.SIGKILL)
