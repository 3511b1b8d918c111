"""Sample objects for tests of code that talks to the test API server (and of the server itself)."""

from __future__ import annotations

from typing import Any

__all__ = ["GROUP", "crd", "pod"]

GROUP = "example.dlrover.org"


def crd(
    plural: str = "widgets", kind: str = "Widget", *, status: bool = True, scope: str = "Namespaced"
) -> dict[str, Any]:
    """A CustomResourceDefinition of `plural`.example.dlrover.org/v1."""
    version: dict[str, Any] = {
        "name": "v1",
        "served": True,
        "storage": True,
        "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}},
    }
    if status:
        version["subresources"] = {"status": {}}
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{GROUP}"},
        "spec": {
            "group": GROUP,
            "scope": scope,
            "names": {"plural": plural, "singular": kind.lower(), "kind": kind, "shortNames": [plural[:2]]},
            "versions": [version],
        },
    }


def pod(name: str, labels: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    """A pod `name` with one container that exits at once; `spec` adds fields to its spec."""
    return {
        "metadata": {"name": name, "labels": labels or {}},
        "spec": {"containers": [{"name": "main", "image": "python", "command": ["true"]}], **spec},
    }
