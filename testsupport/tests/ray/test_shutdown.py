"""Shutting a Ray test cluster down stops everything and names what it could not: a cluster of its
own (not the module fixture), so the leak it plants is its own."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from dlrover_testsupport.ray import RayClusterError, RayClusterLeakError, RayTestCluster, process_table, with_environ
from dlrover_testsupport.ray.fixtures import import_ray

import_ray()

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]


def test_shutdown_stops_every_process_and_names_a_leak() -> None:
    cluster = RayTestCluster(shutdown_grace_s=2.0)
    cluster.start()
    try:
        node = cluster.add_node()
        node_processes = cluster.processes(node)
        temp_dir = cluster.temp_dir
        # A process that talks to the cluster and is never stopped: the leak shutdown must name.
        stray = subprocess.Popen(["sleep", "600"], env=cluster.env)
    except BaseException:
        cluster.shutdown()
        raise
    try:
        with pytest.raises(RayClusterLeakError) as leak:
            cluster.shutdown()
    finally:
        stray.kill()
        stray.wait()
    named = [line.split(":")[0].strip() for line in str(leak.value).splitlines() if line.startswith("  ")]
    assert named == [str(stray.pid)]  # only the stray: Ray's own processes all ended
    assert stray.returncode is not None
    assert not Path(temp_dir).exists()
    assert not with_environ("RAY_TMPDIR", temp_dir, process_table())
    assert all(p.pid not in process_table() for p in node_processes)


def test_a_root_too_long_for_ray_sockets_is_refused(tmp_path: Path) -> None:
    with pytest.raises(RayClusterError, match="107 bytes"):
        RayTestCluster(root=tmp_path / ("x" * 40))
