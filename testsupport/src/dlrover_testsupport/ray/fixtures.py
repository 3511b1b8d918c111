"""pytest fixture of the Ray test cluster. A suite's conftest.py imports it by name:

from dlrover_testsupport.ray.fixtures import ray_cluster  # noqa: F401 (fixture)

and a test module that imports ray itself does so with `ray = import_ray()`.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import pytest

from .cluster import RayTestCluster

__all__ = ["DEFAULT_NODES", "REQUIRE_RAY_ENV", "import_ray", "ray_cluster"]

# Set by `nox -s tests-ray`, which installs Ray: there a missing Ray is a failure, not a skip.
REQUIRE_RAY_ENV = "DLROVER_REQUIRE_RAY"

# The worker nodes a module gets unless it sets `RAY_TEST_NODES` (a list of `add_node` keyword
# arguments, one per node): two with one CPU each.
DEFAULT_NODES: list[dict[str, Any]] = [{"num_cpus": 1}, {"num_cpus": 1}]
# The root conftest fails the test that leaves a process running. A Ray cluster shared by a module
# outlives single tests (nodes a test adds, the raylets' pooled workers), so its nodes' processes
# carry the root conftest's mark of a process held by a wider fixture: the per-test check leaves
# them to the cluster's own shutdown check at the end of the module (which also finds what they
# started), and the session's check still counts them.
_HELD_BY_FIXTURE = {"PYTEST_DLROVER_HELD_BY_FIXTURE": "1"}


def import_ray() -> ModuleType:
    """The `ray` module; without it the calling test module is skipped, or fails where
    `DLROVER_REQUIRE_RAY=1` (the `tests-ray` session)."""
    try:
        return importlib.import_module("ray")
    except ImportError as exc:
        if os.environ.get(REQUIRE_RAY_ENV) == "1":
            pytest.fail(f"{REQUIRE_RAY_ENV}=1 but Ray cannot be imported: {exc}", pytrace=False)
        pytest.skip(f"Ray is not installed ({exc}); `nox -s tests-ray` installs it", allow_module_level=True)


@pytest.fixture(scope="module")
def ray_cluster(request: pytest.FixtureRequest) -> Iterator[RayTestCluster]:
    """One running Ray cluster per test module: a head with num_cpus=0 and fast health checks, and
    the worker nodes of the module's `RAY_TEST_NODES` (default: two with 1 CPU). Tests of a module
    share it: one that kills or removes nodes adds what the next ones need (`add_node`). At the end
    of the module every process is stopped and the cluster checks nothing was left
    (`RayClusterLeakError`, reported as the last test's teardown error)."""
    import_ray()
    wanted = getattr(request.module, "RAY_TEST_NODES", DEFAULT_NODES)
    with RayTestCluster(node_env=_HELD_BY_FIXTURE) as cluster:
        by_kind: dict[str, tuple[dict[str, Any], int]] = {}
        for args in wanted:
            key = repr(sorted(args.items()))
            by_kind[key] = (args, by_kind.get(key, (args, 0))[1] + 1)
        for args, count in by_kind.values():
            cluster.add_nodes(count, **args)
        yield cluster
