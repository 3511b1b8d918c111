"""What the test kubelet runs for a container, as pure functions of the pod and lookups.

The environment as Kubernetes builds it (envFrom, then env in order; `secretKeyRef`,
`configMapKeyRef`, downward-API `fieldRef` and `resourceFieldRef` resolved; `$(VAR)` expanded
exactly as the kubelet's expansion does), the local directories standing in for volumes, and the
two rewrites that let a pod's configuration run on one host: a volume's mountPath used as a path
prefix becomes the directory backing the volume, and a Service address
(`<svc>.<ns>.svc[.cluster.local]:<port>`) becomes the address of a pod it selects; a pod's own DNS
name under a headless Service (`<hostname>.<subdomain>.<ns>.svc[.cluster.local]:<port>`) becomes
the address of the pod with that hostname and subdomain. A Service name
without a port stays as written: it is what a client resolves, but also what it checks a TLS
certificate against (`DLROVER_MASTER_TLS_SERVER_NAME`), and only an address is dialed.

Nothing here touches the store, the file system or the clock: the caller passes lookups and
directories. Two errors tell the kubelet what to do with a pod that cannot start: `NotReadyYet`
(retry when the world changes: a missing Secret, a Service with no pod yet) and `PodSpecError`
(the pod fails: something this kubelet cannot run).
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import math
import re
from collections.abc import Callable, Mapping, Sequence
from decimal import Decimal
from pathlib import PurePosixPath
from typing import Any

from .quantity import QuantityError, parse_quantity
from .scheduling import label_selector_matches

__all__ = [
    "LocalVolume",
    "NotReadyYet",
    "PodLookups",
    "PodSpecError",
    "expand",
    "mount_map",
    "plan_volumes",
    "resolve_env",
    "rewrite",
    "service_target",
]

Obj = Mapping[str, Any]
_POD_NAME = re.compile(
    r"(?<![A-Za-z0-9.-])([a-z0-9](?:[-a-z0-9]*[a-z0-9])?)\.([a-z0-9](?:[-a-z0-9]*[a-z0-9])?)"
    r"\.([a-z0-9](?:[-a-z0-9]*[a-z0-9])?)\.svc(?:\.cluster\.local)?:(\d+)(?![\w-]|\.[\w-])"
)
_SERVICE_NAME = re.compile(
    r"(?<![A-Za-z0-9.-])([a-z0-9](?:[-a-z0-9]*[a-z0-9])?)\.([a-z0-9](?:[-a-z0-9]*[a-z0-9])?)"
    r"\.svc(?:\.cluster\.local)?:(\d+)(?![\w-]|\.[\w-])"
)
# A memory-backed emptyDir mounted here is the host's shared memory (the contract's rule).
_HOST_SHM = "/dev/shm"  # noqa: S108 (not a temporary file: the host's shared memory)
_FIELD_KEY = re.compile(r"^metadata\.(labels|annotations)\['([^']*)'\]$")


class NotReadyYet(Exception):
    """A container cannot start yet; the kubelet retries when objects change.

    Attributes:
        reason: the container's waiting reason (`CreateContainerConfigError`, `ContainerCreating`).
        message: what is missing.
    """

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


class PodSpecError(Exception):
    """The pod asks for something this kubelet cannot run (or is invalid): the pod fails."""


@dataclasses.dataclass(frozen=True)
class PodLookups:
    """The world a pod's environment is resolved against.

    Attributes:
        pod_ip: the pod's `status.podIP`.
        host_ip: its node's address (`status.hostIP`).
        node_allocatable: the node's allocatable resources (a missing limit's value).
        secret: (namespace, name) -> the Secret object, or None when there is none.
        config_map: (namespace, name) -> the ConfigMap object, or None.
        service: (namespace, name, port or None) -> the address a Service DNS name stands for,
            or None when no such Service exists (the name is left alone); raises `NotReadyYet`
            while the Service selects no pod.
        pod_address: (namespace, subdomain, hostname) -> the IP a pod's DNS name under a headless
            Service stands for, or None when `subdomain` is no headless Service (the name is left
            alone); raises `NotReadyYet` while there is no Service of that name.
    """

    pod_ip: str
    host_ip: str
    node_allocatable: Mapping[str, Decimal]
    secret: Callable[[str, str], Obj | None]
    config_map: Callable[[str, str], Obj | None]
    service: Callable[[str, str, int | None], str | None]
    pod_address: Callable[[str, str, str], str | None] = lambda _namespace, _subdomain, _hostname: None


def expand(text: str, lookup: Callable[[str], str | None]) -> str:
    """Kubernetes' `$(VAR)` expansion: `$(NAME)` becomes the variable's value when it is defined
    (left as written otherwise), `$$` becomes `$`, anything else stays."""
    out: list[str] = []
    checkpoint = 0
    cursor = 0
    while cursor < len(text):
        if text[cursor] == "$" and cursor + 1 < len(text):
            out.append(text[checkpoint:cursor])
            nxt = text[cursor + 1]
            if nxt == "$":
                out.append("$")
                advance = 1
            elif nxt == "(":
                close = text.find(")", cursor + 2)
                if close == -1:
                    out.append("$(")
                    advance = 1
                else:
                    name = text[cursor + 2 : close]
                    value = lookup(name)
                    out.append(f"$({name})" if value is None else value)
                    advance = close - cursor
            else:
                out.append("$" + nxt)
                advance = 1
            cursor += advance
            checkpoint = cursor + 1
        cursor += 1
    return "".join(out) + text[checkpoint:]


def _namespace(pod: Obj) -> str:
    return str((pod.get("metadata") or {}).get("namespace") or "default")


def _secret_data(secret: Obj) -> dict[str, bytes]:
    data: dict[str, bytes] = {}
    for key, value in (secret.get("stringData") or {}).items():
        data[str(key)] = str(value).encode()
    for key, value in (secret.get("data") or {}).items():
        try:
            data[str(key)] = base64.b64decode(str(value), validate=True)
        except (binascii.Error, ValueError):
            raise PodSpecError(f"secret key {key!r} holds data that is not base64") from None
    return data


def _config_map_data(config_map: Obj) -> dict[str, bytes]:
    data = {str(k): str(v).encode() for k, v in (config_map.get("data") or {}).items()}
    for key, value in (config_map.get("binaryData") or {}).items():
        try:
            data[str(key)] = base64.b64decode(str(value), validate=True)
        except (binascii.Error, ValueError):
            raise PodSpecError(f"configmap key {key!r} holds binaryData that is not base64") from None
    return data


def _source_data(kind: str, namespace: str, name: str, lookups: PodLookups) -> dict[str, bytes] | None:
    if kind == "secret":
        secret = lookups.secret(namespace, name)
        return None if secret is None else _secret_data(secret)
    config_map = lookups.config_map(namespace, name)
    return None if config_map is None else _config_map_data(config_map)


def _key_ref(kind: str, ref: Obj, namespace: str, lookups: PodLookups) -> str | None:
    """The value of a secretKeyRef/configMapKeyRef; None when optional and missing."""
    name, key = str(ref.get("name") or ""), str(ref.get("key") or "")
    data = _source_data(kind, namespace, name, lookups)
    label = "Secret" if kind == "secret" else "ConfigMap"
    if data is None:
        if ref.get("optional"):
            return None
        raise NotReadyYet("CreateContainerConfigError", f'{kind} "{name}" not found')
    if key not in data:
        if ref.get("optional"):
            return None
        raise NotReadyYet("CreateContainerConfigError", f"couldn't find key {key} in {label} {namespace}/{name}")
    return data[key].decode(errors="replace")


def _field_ref(pod: Obj, path: str, lookups: PodLookups) -> str:
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    simple = {
        "metadata.name": meta.get("name"),
        "metadata.namespace": _namespace(pod),
        "metadata.uid": meta.get("uid"),
        "spec.nodeName": spec.get("nodeName"),
        "spec.serviceAccountName": spec.get("serviceAccountName") or "default",
        "status.podIP": lookups.pod_ip,
        "status.podIPs": lookups.pod_ip,
        "status.hostIP": lookups.host_ip,
        "status.hostIPs": lookups.host_ip,
    }
    if path in simple:
        return str(simple[path] or "")
    keyed = _FIELD_KEY.match(path)
    if keyed:
        return str((meta.get(keyed.group(1)) or {}).get(keyed.group(2), ""))
    raise PodSpecError(f"fieldRef {path!r} is not a downward-API field this kubelet resolves")


def _resource_field_ref(pod: Obj, container: Obj, ref: Obj, lookups: PodLookups) -> str:
    target = container
    wanted = ref.get("containerName")
    if wanted:
        matching = [c for c in (pod.get("spec") or {}).get("containers") or [] if c.get("name") == wanted]
        if not matching:
            raise PodSpecError(f"resourceFieldRef names container {wanted!r}, which the pod does not have")
        target = matching[0]
    resource = str(ref.get("resource") or "")
    kind, _, name = resource.partition(".")
    if kind not in ("limits", "requests") or name not in ("cpu", "memory", "ephemeral-storage"):
        raise PodSpecError(f"resourceFieldRef resource {resource!r} is not limits/requests.cpu/memory")
    resources = target.get("resources") or {}
    limits, requests = resources.get("limits") or {}, resources.get("requests") or {}
    try:
        if kind == "limits":
            amount = parse_quantity(limits[name]) if name in limits else lookups.node_allocatable.get(name, Decimal(0))
        else:
            raw = requests.get(name, limits.get(name))
            amount = Decimal(0) if raw is None else parse_quantity(raw)
        divisor = parse_quantity(ref.get("divisor") or "1")
    except QuantityError as e:
        raise PodSpecError(f"resourceFieldRef {resource}: {e}") from None
    if divisor <= 0:
        raise PodSpecError(f"resourceFieldRef {resource}: the divisor must be positive")
    return str(math.ceil(amount / divisor))


def resolve_env(pod: Obj, container: Obj, lookups: PodLookups) -> dict[str, str]:
    """The container's environment as Kubernetes builds it (insertion order is definition order).

    Raises:
        NotReadyYet: a referenced Secret or ConfigMap (or key) is missing and not optional.
        PodSpecError: a reference this kubelet cannot resolve.
    """
    namespace = _namespace(pod)
    env: dict[str, str] = {}
    for source in container.get("envFrom") or []:
        prefix = str(source.get("prefix") or "")
        for kind, field in (("configmap", "configMapRef"), ("secret", "secretRef")):
            ref = source.get(field)
            if ref is None:
                continue
            data = _source_data(kind, namespace, str(ref.get("name") or ""), lookups)
            if data is None:
                if ref.get("optional"):
                    continue
                raise NotReadyYet("CreateContainerConfigError", f'{kind} "{ref.get("name")}" not found')
            for key, value in data.items():
                env[prefix + key] = value.decode(errors="replace")
    for item in container.get("env") or []:
        name = str(item.get("name") or "")
        if not name:
            raise PodSpecError("an env entry has no name")
        source = item.get("valueFrom")
        if source is None:
            env[name] = expand(str(item.get("value") or ""), env.get)
            continue
        resolved = _value_from(pod, container, name, source, lookups)
        if resolved is not None:
            env[name] = resolved
    return env


def _value_from(pod: Obj, container: Obj, name: str, source: Obj, lookups: PodLookups) -> str | None:
    namespace = _namespace(pod)
    if "secretKeyRef" in source:
        return _key_ref("secret", source["secretKeyRef"], namespace, lookups)
    if "configMapKeyRef" in source:
        return _key_ref("configmap", source["configMapKeyRef"], namespace, lookups)
    if "fieldRef" in source:
        return _field_ref(pod, str(source["fieldRef"].get("fieldPath") or ""), lookups)
    if "resourceFieldRef" in source:
        return _resource_field_ref(pod, container, source["resourceFieldRef"], lookups)
    raise PodSpecError(f"env {name}: valueFrom {sorted(source)} is not resolved by this kubelet")


@dataclasses.dataclass(frozen=True)
class LocalVolume:
    """The local stand-in of one pod volume.

    Attributes:
        name: the volume's name in the pod.
        path: the directory backing it.
        owned: created for this pod and removed with it (emptyDir, secret, configMap).
        memory: an emptyDir with `medium: Memory` (mounted at /dev/shm it is the host's /dev/shm).
        files: what to write into it before the pod starts (relative path -> (bytes, mode)).
    """

    name: str
    path: str
    owned: bool
    memory: bool = False
    files: Mapping[str, tuple[bytes, int]] = dataclasses.field(default_factory=dict)


def _projected_files(kind: str, source: Obj, namespace: str, lookups: PodLookups) -> dict[str, tuple[bytes, int]]:
    name = str(source.get("secretName") if kind == "secret" else source.get("name") or "")
    data = _source_data(kind, namespace, name, lookups)
    if data is None:
        if source.get("optional"):
            return {}
        raise NotReadyYet("ContainerCreating", f'MountVolume.SetUp failed: {kind} "{name}" not found')
    mode = int(source.get("defaultMode", 0o644))
    items = source.get("items")
    if not items:
        return {key: (value, mode) for key, value in data.items()}
    files = {}
    for item in items:
        key = str(item.get("key") or "")
        if key not in data:
            if source.get("optional"):
                continue
            raise NotReadyYet("ContainerCreating", f"MountVolume.SetUp failed: {kind} {name} has no key {key}")
        files[str(item.get("path") or key)] = (data[key], int(item.get("mode", mode)))
    return files


def plan_volumes(pod: Obj, *, pvc_root: str, pod_root: str, lookups: PodLookups) -> dict[str, LocalVolume]:
    """The local directory of each volume of `pod`: a PVC's under `pvc_root/<ns>/<claim>`, the
    pod's own (emptyDir, secret, configMap) under `pod_root/<name>`, a hostPath its own path.

    Raises:
        NotReadyYet: a Secret or ConfigMap a volume projects is missing.
        PodSpecError: a volume type this kubelet does not provide.
    """
    namespace = _namespace(pod)
    volumes = {}
    for volume in (pod.get("spec") or {}).get("volumes") or []:
        name = str(volume.get("name") or "")
        if not name or "/" in name or name in (".", ".."):
            raise PodSpecError(f"volume name {name!r} is not a valid name")
        own = str(PurePosixPath(pod_root) / name)
        if "persistentVolumeClaim" in volume:
            claim = str(volume["persistentVolumeClaim"].get("claimName") or "")
            if not claim or "/" in claim:
                raise PodSpecError(f"volume {name}: claimName {claim!r} is not a valid name")
            volumes[name] = LocalVolume(name, str(PurePosixPath(pvc_root) / namespace / claim), owned=False)
        elif "emptyDir" in volume:
            memory = (volume["emptyDir"] or {}).get("medium") == "Memory"
            volumes[name] = LocalVolume(name, own, owned=True, memory=memory)
        elif "hostPath" in volume:
            volumes[name] = LocalVolume(name, str(volume["hostPath"].get("path") or ""), owned=False)
        elif "secret" in volume:
            files = _projected_files("secret", volume["secret"], namespace, lookups)
            volumes[name] = LocalVolume(name, own, owned=True, files=files)
        elif "configMap" in volume:
            files = _projected_files("configmap", volume["configMap"], namespace, lookups)
            volumes[name] = LocalVolume(name, own, owned=True, files=files)
        else:
            kinds = sorted(k for k in volume if k != "name")
            raise PodSpecError(f"volume {name}: type {kinds} is not provided by the test kubelet")
    return volumes


def mount_map(container: Obj, volumes: Mapping[str, LocalVolume]) -> list[tuple[str, str]]:
    """(mountPath, local directory) of each of the container's mounts, longest path first; a
    memory-backed emptyDir at /dev/shm is the host's /dev/shm and is not listed.

    Raises:
        PodSpecError: a mount names no volume of the pod, or its paths are not absolute/relative.
    """
    mounts = []
    for mount in container.get("volumeMounts") or []:
        name = str(mount.get("name") or "")
        path = str(mount.get("mountPath") or "")
        volume = volumes.get(name)
        if volume is None:
            raise PodSpecError(f"volumeMount {name!r} names no volume of the pod")
        if not path.startswith("/"):
            raise PodSpecError(f"volumeMount {name!r}: mountPath {path!r} is not absolute")
        if volume.memory and path.rstrip("/") == _HOST_SHM:
            continue
        sub = str(mount.get("subPath") or "")
        if sub.startswith("/") or ".." in PurePosixPath(sub).parts:
            raise PodSpecError(f"volumeMount {name!r}: subPath {sub!r} must be relative and stay inside")
        local = str(PurePosixPath(volume.path) / sub) if sub else volume.path
        mounts.append((path.rstrip("/") or "/", local))
    return sorted(mounts, key=lambda m: -len(m[0]))


def _literal(value: str) -> Callable[[re.Match[str]], str]:
    return lambda _match: value


def rewrite(
    text: str,
    mounts: Sequence[tuple[str, str]],
    service: Callable[[str, str, int | None], str | None],
    pod_address: Callable[[str, str, str], str | None] | None = None,
) -> str:
    """`text` with each mountPath used as a path prefix replaced by its local directory, each pod
    address under a headless Service (`<hostname>.<subdomain>.<ns>.svc:<port>`) by the IP
    `pod_address` gives and the port, and each Service address (a DNS name with a port) by the
    address `service` gives (a name either gives None for stays; a name without a port always
    stays).

    Raises:
        NotReadyYet: from `service` or `pod_address`.
    """
    for path, local in mounts:
        pattern = re.compile(r"(?<![\w.\-/])" + re.escape(path) + r"(?=/|$|[^\w.\-])")
        text = pattern.sub(_literal(local), text)

    def address(match: re.Match[str]) -> str:
        port = int(match.group(3)) if match.group(3) else None
        found = service(match.group(2), match.group(1), port)
        return match.group(0) if found is None else found

    def pod(match: re.Match[str]) -> str:
        assert pod_address is not None
        ip = pod_address(match.group(3), match.group(2), match.group(1))
        return match.group(0) if ip is None else f"{ip}:{match.group(4)}"

    if pod_address is not None:
        text = _POD_NAME.sub(pod, text)
    return _SERVICE_NAME.sub(address, text)


def _is_ready(pod: Obj) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def _target_port(service_port: Obj, pod: Obj) -> int:
    target = service_port.get("targetPort")
    if target is None or target == "":
        return int(service_port.get("port") or 0)
    if isinstance(target, int) or str(target).isdigit():
        return int(target)
    for container in (pod.get("spec") or {}).get("containers") or []:
        for port in container.get("ports") or []:
            if port.get("name") == target:
                return int(port.get("containerPort") or 0)
    raise NotReadyYet("ContainerCreating", f"the selected pod has no container port named {target!r}")


def service_target(service: Obj, pods: Sequence[Obj], pod_ip: Callable[[Obj], str], port: int | None) -> str:
    """The address a Service's DNS name (with `port`, or without one) stands for: the pod IP of a
    ready pod it selects (else of any live one), and the port mapped to its targetPort.

    Raises:
        NotReadyYet: the Service selects no live pod.
    """
    meta = service.get("metadata") or {}
    selector = (service.get("spec") or {}).get("selector") or {}
    namespace = str(meta.get("namespace") or "default")
    live = [
        p
        for p in pods
        if _namespace(p) == namespace
        and selector
        and label_selector_matches({"matchLabels": selector}, (p.get("metadata") or {}).get("labels") or {})
        and not (p.get("metadata") or {}).get("deletionTimestamp")
        and (p.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
    ]
    if not live:
        why = f"service {namespace}/{meta.get('name')} selects no live pod yet (the test cluster's DNS stand-in)"
        raise NotReadyYet("ContainerCreating", why)
    chosen = sorted(live, key=lambda p: (not _is_ready(p), str((p.get("metadata") or {}).get("name"))))[0]
    ip = pod_ip(chosen)
    if port is None:
        return ip
    for service_port in (service.get("spec") or {}).get("ports") or []:
        if int(service_port.get("port") or 0) == port:
            return f"{ip}:{_target_port(service_port, chosen)}"
    return f"{ip}:{port}"
