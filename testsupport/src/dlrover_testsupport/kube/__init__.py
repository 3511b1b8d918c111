"""A Kubernetes API server for tests: real REST and watch protocol over HTTP, in-memory objects.

Start one with `ApiServer` (a context manager) or the `kube_api` pytest fixture in
`dlrover_testsupport.kube.fixtures`; inject faults through `ApiServer.faults`. See
testsupport/README.md for what it implements and how it differs from a real API server.
"""

from .errors import ApiError, status_body
from .faults import ApiRequest, FaultRule, Faults
from .patches import PatchConflict, PatchError, json_merge_patch, json_patch, strategic_merge_patch
from .resources import BUILTIN_RESOURCES, ResourceType, resource_types_of_crd
from .selectors import FieldSelector, LabelSelector, SelectorError
from .server import ApiServer
from .store import Store, StoreEvent, Watch, WatchEvent

__all__ = [
    "ApiServer",
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
