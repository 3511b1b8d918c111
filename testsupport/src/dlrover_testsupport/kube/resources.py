"""The resource types the test API server serves: built-in ones and those CRDs add."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["BUILTIN_RESOURCES", "ResourceType", "resource_types_of_crd"]

_ALL_VERBS = ("create", "delete", "deletecollection", "get", "list", "patch", "update", "watch")
# Field selectors a real API server accepts beyond metadata.name and metadata.namespace: a selector
# on any other field is refused there, so it is refused here too.
_POD_FIELDS = (
    "spec.nodeName",
    "spec.restartPolicy",
    "spec.schedulerName",
    "spec.serviceAccountName",
    "spec.hostNetwork",
    "status.phase",
    "status.podIP",
    "status.nominatedNodeName",
)
_EVENT_FIELDS = (
    "involvedObject.kind",
    "involvedObject.namespace",
    "involvedObject.name",
    "involvedObject.uid",
    "involvedObject.apiVersion",
    "involvedObject.resourceVersion",
    "involvedObject.fieldPath",
    "reason",
    "reportingComponent",
    "source",
    "type",
)


@dataclasses.dataclass(frozen=True)
class ResourceType:
    """One resource of one API group version, as discovery lists it.

    Objects are stored per (group, plural): a resource served in several versions is one set of
    objects, returned with the apiVersion a request names (no conversion between versions).
    """

    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool
    has_status: bool = False
    short_names: tuple[str, ...] = ()
    selectable_fields: tuple[str, ...] = ()
    builtin: bool = True

    @property
    def group_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def group_resource(self) -> tuple[str, str]:
        return (self.group, self.plural)

    @property
    def singular(self) -> str:
        return self.kind.lower()

    @property
    def supports_strategic_merge(self) -> bool:
        """Custom resources take only JSON and merge patches, as on a real server."""
        return self.builtin

    def field_selectable(self, field: str) -> bool:
        return field in ("metadata.name", "metadata.namespace") or field in self.selectable_fields

    def discovery(self) -> list[dict[str, Any]]:
        """The APIResource entries of this resource and its status subresource."""
        entry: dict[str, Any] = {
            "name": self.plural,
            "singularName": self.singular,
            "namespaced": self.namespaced,
            "kind": self.kind,
            "verbs": list(_ALL_VERBS),
        }
        if self.short_names:
            entry["shortNames"] = list(self.short_names)
        entries = [entry]
        if self.has_status:
            entries.append(
                {
                    "name": f"{self.plural}/status",
                    "singularName": "",
                    "namespaced": self.namespaced,
                    "kind": self.kind,
                    "verbs": ["get", "patch", "update"],
                }
            )
        return entries


def _core(plural: str, kind: str, namespaced: bool = True, **kw: Any) -> ResourceType:
    return ResourceType("", "v1", plural, kind, namespaced, **kw)


_RBAC = "rbac.authorization.k8s.io"
BUILTIN_RESOURCES: tuple[ResourceType, ...] = (
    _core("pods", "Pod", has_status=True, short_names=("po",), selectable_fields=_POD_FIELDS),
    _core("services", "Service", has_status=True, short_names=("svc",)),
    _core("secrets", "Secret", selectable_fields=("type",)),
    _core("configmaps", "ConfigMap", short_names=("cm",)),
    _core("events", "Event", short_names=("ev",), selectable_fields=_EVENT_FIELDS),
    _core("serviceaccounts", "ServiceAccount", short_names=("sa",)),
    _core("persistentvolumeclaims", "PersistentVolumeClaim", has_status=True, short_names=("pvc",)),
    _core("namespaces", "Namespace", False, has_status=True, short_names=("ns",), selectable_fields=("status.phase",)),
    _core("nodes", "Node", False, has_status=True, short_names=("no",), selectable_fields=("spec.unschedulable",)),
    ResourceType(_RBAC, "v1", "roles", "Role", True),
    ResourceType(_RBAC, "v1", "rolebindings", "RoleBinding", True),
    ResourceType(_RBAC, "v1", "clusterroles", "ClusterRole", False),
    ResourceType(_RBAC, "v1", "clusterrolebindings", "ClusterRoleBinding", False),
    ResourceType(
        "apiextensions.k8s.io", "v1", "customresourcedefinitions", "CustomResourceDefinition", False, True, ("crd",)
    ),
    ResourceType("coordination.k8s.io", "v1", "leases", "Lease", True),
    ResourceType("apps", "v1", "deployments", "Deployment", True, True, ("deploy",)),
)


def _selectable_fields(version: Mapping[str, Any], spec: Mapping[str, Any]) -> tuple[str, ...]:
    fields: Iterable[Mapping[str, Any]] = version.get("selectableFields") or spec.get("selectableFields") or ()
    return tuple(str(f.get("jsonPath", "")).lstrip(".") for f in fields if f.get("jsonPath"))


def resource_types_of_crd(crd: Mapping[str, Any]) -> list[ResourceType]:
    """The resource types a CustomResourceDefinition serves, one per served version.

    Raises:
        ValueError: the CRD lacks the group, names or versions a server needs, naming the field.
    """
    spec = crd.get("spec") or {}
    names = spec.get("names") or {}
    group, plural, kind = spec.get("group"), names.get("plural"), names.get("kind")
    for field, value in (("spec.group", group), ("spec.names.plural", plural), ("spec.names.kind", kind)):
        if not isinstance(value, str) or not value:
            raise ValueError(f"{field} is required")
    scope = spec.get("scope", "Namespaced")
    if scope not in ("Namespaced", "Cluster"):
        raise ValueError(f"spec.scope must be Namespaced or Cluster, not {scope!r}")
    versions = [v for v in spec.get("versions") or [] if isinstance(v, Mapping)]
    if not versions or any(not isinstance(v.get("name"), str) for v in versions):
        raise ValueError("spec.versions must list at least one version, each with a name")
    expected_name = f"{plural}.{group}"
    if (crd.get("metadata") or {}).get("name") != expected_name:
        raise ValueError(f"metadata.name must be {expected_name!r}")
    return [
        ResourceType(
            group=str(group),
            version=str(v["name"]),
            plural=str(plural),
            kind=str(kind),
            namespaced=scope == "Namespaced",
            has_status="status" in (v.get("subresources") or {}),
            short_names=tuple(names.get("shortNames") or ()),
            selectable_fields=_selectable_fields(v, spec),
            builtin=False,
        )
        for v in versions
        if v.get("served", True)
    ]
