"""A Kubernetes API server for tests: real REST and watch protocol over HTTP, in-memory objects,
and a kubelet that schedules pods onto simulated nodes and runs them as local processes.

Start one with `ApiServer` (a context manager) or the `kube_api` pytest fixture in
`dlrover_testsupport.kube.fixtures`; inject faults through `ApiServer.faults`. A cluster that runs
pods: `KubeCluster` (server + `Kubelet`) or the `kube_cluster` fixture; node loss, eviction,
preemption and killed processes through the `Kubelet`'s fault methods. See testsupport/README.md
for what they implement and how they differ from a real cluster.
"""

from .cluster import KubeCluster
from .errors import ApiError, status_body
from .faults import ApiRequest, FaultRule, Faults
from .kubelet import Kubelet
from .patches import PatchConflict, PatchError, json_merge_patch, json_patch, strategic_merge_patch
from .resources import BUILTIN_RESOURCES, ResourceType, resource_types_of_crd
from .selectors import FieldSelector, LabelSelector, SelectorError
from .server import ApiServer
from .simnodes import SimNode
from .store import Store, StoreEvent, Watch, WatchEvent

__all__ = [
    "ApiServer",
    "KubeCluster",
    "Kubelet",
    "SimNode",
    "Store",
    "Watch",
    "WatchEvent",
    "StoreEvent",
    "ApiError",
    "status_body",
    "ApiRequest",
    "FaultRule",
    "Faults",
    "ResourceType",
    "BUILTIN_RESOURCES",
    "resource_types_of_crd",
    "LabelSelector",
    "FieldSelector",
    "SelectorError",
    "json_merge_patch",
    "json_patch",
    "strategic_merge_patch",
    "PatchError",
    "PatchConflict",
]
