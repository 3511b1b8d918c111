"""The test kubelet's simulated nodes: their spec and the Node objects, status and taints they get.

Pure builders (the time comes in as an RFC 3339 string) and two small writers to the store.
"""

from __future__ import annotations

import copy
import dataclasses
import os
from collections.abc import Mapping
from typing import Any

from .errors import ApiError
from .scheduling import HOSTNAME_LABEL
from .store import Store

__all__ = ["UNREACHABLE_TAINT", "SimNode", "node_body", "node_status", "register_node", "set_node_ready"]

UNREACHABLE_TAINT = "node.kubernetes.io/unreachable"
Obj = dict[str, Any]


@dataclasses.dataclass(frozen=True)
class SimNode:
    """One simulated node.

    Attributes:
        name: the Node's name (and its `kubernetes.io/hostname` label).
        cpu: allocatable CPUs (a quantity: "4", "3500m").
        memory: allocatable memory (a quantity: "8Gi").
        pods: pod slots.
        labels: labels besides the hostname, os and arch ones.
        extended: other allocatable resources, e.g. {"nvidia.com/gpu": "2"}.
    """

    name: str
    cpu: str = "4"
    memory: str = "8Gi"
    pods: int = 110
    labels: Mapping[str, str] = dataclasses.field(default_factory=dict)
    extended: Mapping[str, str] = dataclasses.field(default_factory=dict)

    def allocatable(self) -> dict[str, str]:
        """Its allocatable resources as a Node's status lists them."""
        return {"cpu": self.cpu, "memory": self.memory, "pods": str(self.pods), **self.extended}


def node_body(node: SimNode) -> Obj:
    """The Node object (without status) of `node`."""
    labels = {"kubernetes.io/os": "linux", "kubernetes.io/arch": "amd64", **node.labels, HOSTNAME_LABEL: node.name}
    return {"metadata": {"name": node.name, "labels": labels}, "spec": {}}


def node_status(node: SimNode, host_ip: str, *, ready: bool, now: str) -> Obj:
    """The Node's status: Ready True, or Unknown once the node is lost (as the node lifecycle
    controller writes it when a kubelet stops posting)."""
    if ready:
        condition = {"status": "True", "reason": "KubeletReady", "message": "kubelet is posting ready status"}
    else:
        condition = {"status": "Unknown", "reason": "NodeStatusUnknown"}
        condition["message"] = "Kubelet stopped posting node status."
    return {
        "capacity": node.allocatable(),
        "allocatable": node.allocatable(),
        "conditions": [{"type": "Ready", "lastHeartbeatTime": now, "lastTransitionTime": now, **condition}],
        "addresses": [{"type": "InternalIP", "address": host_ip}, {"type": "Hostname", "address": node.name}],
        # Every field: the official client's model refuses a nodeInfo that lacks one.
        "nodeInfo": {
            "kubeletVersion": "v1.32.0-dlrover-testsupport",
            "kubeProxyVersion": "",
            "containerRuntimeVersion": "dlrover-testsupport://local-processes",
            "operatingSystem": "linux",
            "architecture": "amd64",
            "osImage": "local processes (dlrover test kubelet)",
            "kernelVersion": os.uname().release,
            "machineID": node.name,
            "systemUUID": node.name,
            "bootID": node.name,
        },
    }


def _with_unreachable_taints(node: Obj, lost: bool, now: str) -> Obj:
    new = copy.deepcopy(node)
    spec = new.setdefault("spec", {})
    kept = [t for t in spec.get("taints") or [] if t.get("key") != UNREACHABLE_TAINT]
    if lost:
        kept += [{"key": UNREACHABLE_TAINT, "effect": e, "timeAdded": now} for e in ("NoSchedule", "NoExecute")]
    if kept:
        spec["taints"] = kept
    else:
        spec.pop("taints", None)
    return new


def register_node(store: Store, node: SimNode, host_ip: str, now: str) -> None:
    """Create (or replace) the Node object of `node`, Ready."""
    rt = store.resource_type("", "v1", "nodes")
    body = node_body(node)
    try:
        store.create(rt, None, body)
    except ApiError as e:
        if e.code != 409:
            raise
        store.replace(rt, None, node.name, body)
    status = {"metadata": {}, "status": node_status(node, host_ip, ready=True, now=now)}
    store.replace(rt, None, node.name, status, status=True)


def set_node_ready(store: Store, node: SimNode, host_ip: str, *, ready: bool, now: str) -> Obj:
    """Mark the node Ready (untainted) or lost (Unknown, unreachable taints); returns the Node."""
    rt = store.resource_type("", "v1", "nodes")
    status = node_status(node, host_ip, ready=ready, now=now)
    store.patch(rt, None, node.name, lambda n: {**n, "status": status}, status=True)
    return store.patch(rt, None, node.name, lambda n: _with_unreachable_taints(n, not ready, now))
