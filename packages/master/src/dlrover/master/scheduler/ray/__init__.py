"""The Ray backend: one agent actor per Ray node, placed by node id, relaunched only by the master.

`RayScheduler` (the backend), `RayCluster` (the Protocol it drives) with `RayApiCluster` (Ray's public
API) and `FakeRayCluster` (in memory, for tests), the actor `NodeAgentActor`, and `RaySettings`. Ray (the
`ray` extra) is imported when a cluster is connected, not when this package is.
"""

from dlrover.master.scheduler.ray.actor import NodeAgentActor
from dlrover.master.scheduler.ray.backend import REASON_ACTOR_DIED, REASON_AGENT_START_FAILED, RayScheduler
from dlrover.master.scheduler.ray.cluster import (
    AgentFate,
    AgentLaunch,
    AgentReport,
    RayApiCluster,
    RayCluster,
    RayNode,
    actor_request,
    node_shape,
)
from dlrover.master.scheduler.ray.fake import FakeRayCluster
from dlrover.master.scheduler.ray.settings import SUPPORTED_RAY_VERSIONS, RaySettings

__all__ = [
    "REASON_ACTOR_DIED",
    "REASON_AGENT_START_FAILED",
    "SUPPORTED_RAY_VERSIONS",
    "AgentFate",
    "AgentLaunch",
    "AgentReport",
    "FakeRayCluster",
    "NodeAgentActor",
    "RayApiCluster",
    "RayCluster",
    "RayNode",
    "RayScheduler",
    "RaySettings",
    "actor_request",
    "node_shape",
]
