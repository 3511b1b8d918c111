"""core/v1 Events the test kubelet and scheduler write, as a kubelet would (best effort)."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any

from .errors import ApiError
from .store import Store

__all__ = ["pod_reference", "write_event"]


def pod_reference(namespace: str, name: str, uid: str) -> dict[str, Any]:
    """The involvedObject of an event about a pod."""
    return {"kind": "Pod", "namespace": namespace, "name": name, "uid": uid, "apiVersion": "v1"}


def write_event(
    store: Store,
    namespace: str,
    involved: Mapping[str, Any],
    *,
    reason: str,
    message: str,
    kind: str,
    component: str,
    now: str,
) -> None:
    """Record one Event; a namespace that takes none (terminating, deleted) is skipped, as a
    kubelet's event recorder drops what it cannot write."""
    body = {
        "metadata": {"generateName": f"{involved.get('name')}.", "namespace": namespace},
        "involvedObject": dict(involved),
        "reason": reason,
        "message": message,
        "type": kind,
        "source": {"component": component},
        "reportingComponent": component,
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }
    with contextlib.suppress(ApiError):
        store.create(store.resource_type("", "v1", "events"), namespace, body)
