"""The pure parts of the test kubelet: environment, expansion, rewriting, volumes, statuses."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

import pytest
from dlrover_testsupport.kube.podenv import (
    NotReadyYet,
    PodLookups,
    PodSpecError,
    expand,
    mount_map,
    plan_volumes,
    resolve_env,
    rewrite,
    service_target,
)
from dlrover_testsupport.kube.podstatus import ContainerRecord, exit_code_of, exit_reason, merge_conditions, pod_phase
from dlrover_testsupport.kube.quantity import QuantityError, parse_quantity, pod_requests

pytestmark = pytest.mark.timeout(30)

SECRETS = {("ns", "tok"): {"data": {"token": "czNjcjN0"}}, ("ns", "plain"): {"stringData": {"k": "v"}}}
CONFIG_MAPS = {("ns", "cfg"): {"data": {"a": "1", "b": "2"}}}


def lookups(service: Any = None) -> PodLookups:
    return PodLookups(
        pod_ip="127.20.0.7",
        host_ip="127.10.0.1",
        node_allocatable={"cpu": Decimal(4), "memory": Decimal(8 << 30)},
        secret=lambda ns, name: SECRETS.get((ns, name)),
        config_map=lambda ns, name: CONFIG_MAPS.get((ns, name)),
        service=service or (lambda ns, name, port: None),
    )


def pod(container: dict[str, Any], **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {
            "name": "w-1",
            "namespace": "ns",
            "uid": "u-1",
            "labels": {"rank": "3"},
            "annotations": {"a": "b"},
        },
        "spec": {"nodeName": "node-1", "containers": [{"name": "main", **container}], **spec},
    }


@pytest.mark.parametrize(
    ("text", "want"),
    [
        ("$(A)", "1"),
        ("x$(A)y$(B)z", "x1y2z"),
        ("$$(A)", "$(A)"),
        ("$$$(A)", "$1"),
        ("$(MISSING)", "$(MISSING)"),
        ("$(A", "$(A"),
        ("$A", "$A"),
        ("a$", "a$"),
        ("$()", "$()"),
    ],
)
def test_expansion_is_kubernetes_own(text: str, want: str) -> None:
    assert expand(text, {"A": "1", "B": "2"}.get) == want


def test_env_in_order_with_every_kind_of_reference() -> None:
    container = {
        "envFrom": [{"configMapRef": {"name": "cfg"}, "prefix": "C_"}, {"secretRef": {"name": "plain"}}],
        "env": [
            {"name": "TOKEN", "valueFrom": {"secretKeyRef": {"name": "tok", "key": "token"}}},
            {"name": "A", "valueFrom": {"configMapKeyRef": {"name": "cfg", "key": "a"}}},
            {"name": "IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
            {"name": "HOST", "valueFrom": {"fieldRef": {"fieldPath": "status.hostIP"}}},
            {"name": "UID", "valueFrom": {"fieldRef": {"fieldPath": "metadata.uid"}}},
            {"name": "RANK", "valueFrom": {"fieldRef": {"fieldPath": "metadata.labels['rank']"}}},
            {"name": "ANN", "valueFrom": {"fieldRef": {"fieldPath": "metadata.annotations['a']"}}},
            {"name": "SA", "valueFrom": {"fieldRef": {"fieldPath": "spec.serviceAccountName"}}},
            {"name": "CPU", "valueFrom": {"resourceFieldRef": {"resource": "limits.cpu"}}},
            {"name": "MEM", "valueFrom": {"resourceFieldRef": {"resource": "limits.memory", "divisor": "1Gi"}}},
            {"name": "REQ", "valueFrom": {"resourceFieldRef": {"resource": "requests.cpu", "divisor": "1m"}}},
            {"name": "ADDR", "value": "$(IP):$(A) $(LATER)"},
            {"name": "LATER", "value": "x"},
            {"name": "OPT", "valueFrom": {"secretKeyRef": {"name": "nope", "key": "k", "optional": True}}},
        ],
        "resources": {"requests": {"cpu": "250m"}},
    }
    env = resolve_env(pod(container), container, lookups())
    assert env["TOKEN"] == "s3cr3t"
    assert (env["C_a"], env["C_b"], env["k"], env["A"]) == ("1", "2", "v", "1")
    assert (env["IP"], env["HOST"], env["UID"], env["RANK"], env["ANN"]) == (
        "127.20.0.7",
        "127.10.0.1",
        "u-1",
        "3",
        "b",
    )
    assert env["SA"] == "default"
    assert (env["CPU"], env["MEM"], env["REQ"]) == ("4", "8", "250")  # no limit: the node's allocatable
    assert env["ADDR"] == "127.20.0.7:1 $(LATER)"  # only variables defined before are expanded
    assert "OPT" not in env


@pytest.mark.parametrize(
    ("ref", "message"),
    [
        ({"secretKeyRef": {"name": "nope", "key": "k"}}, 'secret "nope" not found'),
        ({"secretKeyRef": {"name": "tok", "key": "nokey"}}, "couldn't find key nokey in Secret ns/tok"),
        ({"configMapKeyRef": {"name": "nope", "key": "k"}}, 'configmap "nope" not found'),
    ],
)
def test_a_missing_reference_makes_the_container_wait(ref: dict[str, Any], message: str) -> None:
    container = {"env": [{"name": "X", "valueFrom": ref}]}
    with pytest.raises(NotReadyYet) as info:
        resolve_env(pod(container), container, lookups())
    assert info.value.reason == "CreateContainerConfigError"
    assert info.value.message == message


def test_an_unknown_downward_field_fails_the_pod() -> None:
    container = {"env": [{"name": "X", "valueFrom": {"fieldRef": {"fieldPath": "spec.nothing"}}}]}
    with pytest.raises(PodSpecError, match=r"spec\.nothing"):
        resolve_env(pod(container), container, lookups())


def test_volumes_map_to_local_directories_and_mount_paths_are_rewritten() -> None:
    volumes_spec = [
        {"name": "ckpt", "persistentVolumeClaim": {"claimName": "shared"}},
        {"name": "shm", "emptyDir": {"medium": "Memory"}},
        {"name": "scratch", "emptyDir": {}},
        {"name": "host", "hostPath": {"path": "/srv/data"}},
        {
            "name": "creds",
            "secret": {"secretName": "tok", "items": [{"key": "token", "path": "t"}], "defaultMode": 0o400},
        },
        {"name": "cfg", "configMap": {"name": "cfg"}},
    ]
    container = {
        "volumeMounts": [
            {"name": "ckpt", "mountPath": "/checkpoints"},
            {"name": "shm", "mountPath": "/dev/shm"},
            {"name": "scratch", "mountPath": "/scratch", "subPath": "sub"},
            {"name": "host", "mountPath": "/data"},
            {"name": "creds", "mountPath": "/etc/creds"},
            {"name": "cfg", "mountPath": "/etc/creds/cfg"},
        ]
    }
    spec = pod(container, volumes=volumes_spec)
    volumes = plan_volumes(spec, pvc_root="/r/pvc", pod_root="/r/pod/volumes", lookups=lookups())
    assert volumes["ckpt"].path == "/r/pvc/ns/shared"
    assert not volumes["ckpt"].owned
    assert volumes["scratch"].owned
    assert volumes["host"].path == "/srv/data"
    assert volumes["creds"].files == {"t": (b"s3cr3t", 0o400)}
    assert volumes["cfg"].files == {"a": (b"1", 0o644), "b": (b"2", 0o644)}
    mounts = mount_map(container, volumes)
    assert ("/dev/shm", "/r/pod/volumes/shm") not in mounts  # the host's /dev/shm, not rewritten
    assert mounts[0] == ("/etc/creds/cfg", "/r/pod/volumes/cfg")  # the longest path first

    def no_service(ns: str, name: str, port: int | None) -> None:
        return None

    assert rewrite("--dir=/checkpoints/run1", mounts, no_service) == "--dir=/r/pvc/ns/shared/run1"
    assert rewrite("/checkpoints", mounts, no_service) == "/r/pvc/ns/shared"
    assert rewrite("/checkpoints2/x /a/checkpoints", mounts, no_service) == "/checkpoints2/x /a/checkpoints"
    assert rewrite("/scratch/f", mounts, no_service) == "/r/pod/volumes/scratch/sub/f"
    assert rewrite("/etc/creds/cfg/a /etc/creds/t", mounts, no_service) == "/r/pod/volumes/cfg/a /r/pod/volumes/creds/t"
    assert rewrite("/dev/shm/x", mounts, no_service) == "/dev/shm/x"


def test_unsupported_volumes_and_bad_mounts_fail_the_pod() -> None:
    with pytest.raises(PodSpecError, match="not provided"):
        plan_volumes(pod({}, volumes=[{"name": "v", "nfs": {}}]), pvc_root="/p", pod_root="/q", lookups=lookups())
    with pytest.raises(PodSpecError, match="names no volume"):
        mount_map({"volumeMounts": [{"name": "x", "mountPath": "/x"}]}, {})
    with pytest.raises(NotReadyYet, match="not found"):
        plan_volumes(
            pod({}, volumes=[{"name": "v", "secret": {"secretName": "nope"}}]),
            pvc_root="/p",
            pod_root="/q",
            lookups=lookups(),
        )


def test_service_names_become_the_selected_pod_s_address_and_target_port() -> None:
    calls = []

    def service(ns: str, name: str, port: int | None) -> str | None:
        calls.append((ns, name, port))
        return None if name == "other" else f"127.20.0.1:{port}" if port else "127.20.0.1"

    text = "job-master.ns.svc:50001 job-master.ns.svc.cluster.local:7 job-master.ns.svc other.ns.svc:1 notasvc.ns.svcx"
    # A name without a port is not dialed (it may be a TLS server name): it stays.
    assert (
        rewrite(text, [], service) == "127.20.0.1:50001 127.20.0.1:7 job-master.ns.svc other.ns.svc:1 notasvc.ns.svcx"
    )
    assert calls == [("ns", "job-master", 50001), ("ns", "job-master", 7), ("ns", "other", 1)]

    svc = {
        "metadata": {"name": "m", "namespace": "ns"},
        "spec": {"selector": {"app": "m"}, "ports": [{"name": "grpc", "port": 80, "targetPort": "grpc"}]},
    }
    ready = {"type": "Ready", "status": "True"}
    pods = [
        {
            "metadata": {"name": "b", "namespace": "ns", "labels": {"app": "m"}},
            "status": {"phase": "Running", "conditions": [ready]},
            "spec": {"containers": [{"ports": [{"name": "grpc", "containerPort": 50001}]}]},
        },
        {
            "metadata": {"name": "a", "namespace": "ns", "labels": {"app": "m"}},
            "status": {"phase": "Pending"},
            "spec": {},
        },
        {
            "metadata": {"name": "c", "namespace": "other", "labels": {"app": "m"}},
            "status": {"phase": "Running"},
            "spec": {},
        },
    ]
    ips = {"a": "127.20.0.1", "b": "127.20.0.2", "c": "127.20.0.3"}
    assert service_target(svc, pods, lambda p: ips[p["metadata"]["name"]], 80) == "127.20.0.2:50001"
    assert service_target(svc, pods, lambda p: ips[p["metadata"]["name"]], None) == "127.20.0.2"
    with pytest.raises(NotReadyYet, match="selects no live pod"):
        service_target(svc, pods[2:], lambda p: "x", 80)


def test_quantities_and_requests() -> None:
    assert parse_quantity("500m") == Decimal("0.5")
    assert parse_quantity("4Gi") == 4 << 30
    assert parse_quantity("1e3") == 1000
    assert parse_quantity("1.5G") == Decimal("1.5e9")
    with pytest.raises(QuantityError):
        parse_quantity("lots")
    spec = {
        "spec": {
            "containers": [
                {"resources": {"limits": {"cpu": "1", "memory": "1Gi"}}},
                {"resources": {"requests": {"cpu": "500m"}, "limits": {"cpu": "2"}}},
            ],
            "initContainers": [{"resources": {"requests": {"cpu": "3"}}}],
        }
    }
    assert pod_requests(spec) == {"cpu": Decimal(3), "memory": Decimal(1 << 30)}


def test_exit_codes_reasons_and_phases() -> None:
    assert (exit_code_of(0), exit_code_of(3), exit_code_of(-9), exit_code_of(-15)) == (0, 3, 137, 143)
    assert (exit_reason(0, False), exit_reason(1, False), exit_reason(137, True)) == ("Completed", "Error", "OOMKilled")
    done, failed, running = ContainerRecord("a", exit_code=0), ContainerRecord("b", exit_code=1), ContainerRecord("c")
    assert pod_phase([done], "Never", started=False) == "Pending"
    assert pod_phase([done, running], "Never", started=True) == "Running"
    assert pod_phase([done], "Never", started=True) == "Succeeded"
    assert pod_phase([done, failed], "Never", started=True) == "Failed"
    assert pod_phase([done, failed], "OnFailure", started=True) == "Running"
    assert pod_phase([done], "Always", started=True) == "Running"


def test_conditions_keep_their_transition_time_while_unchanged() -> None:
    old = [{"type": "Ready", "status": "True", "lastTransitionTime": "t0"}, {"type": "Custom", "status": "True"}]
    merged = merge_conditions(old, {"Ready": ("True", "", ""), "PodScheduled": ("True", "", "")}, "t1")
    assert merged[0]["lastTransitionTime"] == "t0"
    assert merged[1] == {"type": "Custom", "status": "True"}
    assert merged[2]["lastTransitionTime"] == "t1"
    flipped = merge_conditions(merged, {"Ready": ("False", "ContainersNotReady", "")}, "t2")
    assert flipped[0] == {
        "type": "Ready",
        "status": "False",
        "reason": "ContainersNotReady",
        "lastProbeTime": None,
        "lastTransitionTime": "t2",
    }


def test_qos_class() -> None:
    from dlrover_testsupport.kube.podstatus import qos_class

    both = {"cpu": "1", "memory": "1Gi"}
    assert qos_class([{}]) == "BestEffort"
    assert qos_class([{"resources": {"limits": both}}]) == "Guaranteed"
    assert qos_class([{"resources": {"limits": both, "requests": {"cpu": "1000m"}}}]) == "Guaranteed"
    assert qos_class([{"resources": {"limits": both, "requests": {"cpu": "500m"}}}]) == "Burstable"
    assert qos_class([{"resources": {"limits": both}}, {}]) == "Burstable"


def test_a_pods_dns_name_under_a_headless_service_becomes_that_names_ip_and_its_port() -> None:
    calls: list[tuple[str, str, str]] = []

    def pod_address(ns: str, subdomain: str, hostname: str) -> str | None:
        calls.append((ns, subdomain, hostname))
        if subdomain == "missing":
            raise NotReadyYet("ContainerCreating", "service ns/missing does not exist")
        return None if subdomain == "plain" else "127.20.0.9"

    def service(ns: str, name: str, port: int | None) -> str | None:
        return f"127.20.0.1:{port}" if name == "rec-master" else None

    text = ('{"ps": ["rec-ps-0.rec-tasks.ns.svc:2222", "rec-ps-1.rec-tasks.ns.svc.cluster.local:2223"]} '
            "rec-master.ns.svc:50001 a.plain.ns.svc:1 rec-ps-0.rec-tasks.ns.svc")  # fmt: skip
    assert rewrite(text, [], service, pod_address) == (
        '{"ps": ["127.20.0.9:2222", "127.20.0.9:2223"]} 127.20.0.1:50001 a.plain.ns.svc:1 rec-ps-0.rec-tasks.ns.svc'
    )
    assert calls == [("ns", "rec-tasks", "rec-ps-0"), ("ns", "rec-tasks", "rec-ps-1"), ("ns", "plain", "a")]
    # Without the lookup (what a working directory is rewritten with) such names stay; a missing Service waits.
    assert rewrite("x.y.ns.svc:1", [], service) == "x.y.ns.svc:1"
    with pytest.raises(NotReadyYet, match="does not exist"):
        rewrite("x.missing.ns.svc:1", [], service, pod_address)
