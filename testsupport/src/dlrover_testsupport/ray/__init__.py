"""A real multi-node Ray cluster on this host for tests: `RayTestCluster` (a context manager) and
the module-scoped `ray_cluster` pytest fixture in `dlrover_testsupport.ray.fixtures`.

Nodes are added, removed gracefully or killed for real (`kill_node`: the raylet and every process
it started, SIGKILLed at once); `processes(node)` lists a node's live processes so a test can check
that nothing outlives its node. See testsupport/README.md.
"""

from .cluster import FAST_HEALTH_CHECKS, RayClusterError, RayClusterLeakError, RayNode, RayTestCluster
from .procfs import ProcessInfo, alive, descendants, process_table, with_environ

__all__ = [
    "RayTestCluster",
    "RayNode",
    "RayClusterError",
    "RayClusterLeakError",
    "FAST_HEALTH_CHECKS",
    "ProcessInfo",
    "alive",
    "descendants",
    "process_table",
    "with_environ",
]
