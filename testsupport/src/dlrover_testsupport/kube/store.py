"""The test API server's pure in-memory core: objects, resourceVersions, watch history.

No HTTP here: the server translates requests into these calls. Every write takes one lock, gets
the next resourceVersion from one counter shared by all resources (as etcd's revision) and appends
one event per visible change to a history that watches replay; compaction drops the oldest events,
and a watch that needs a dropped one gets 410 Gone. Time comes from an injected clock, names and
uids from an injected random generator, so tests can replay a run exactly.
"""

from __future__ import annotations

import base64
import bisect
import builtins
import copy
import dataclasses
import json
import random
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Mapping
from datetime import datetime, timezone
from typing import Any

from .errors import ApiError
from .resources import BUILTIN_RESOURCES, ResourceType, resource_types_of_crd
from .selectors import FieldSelector, LabelSelector

__all__ = ["Store", "StoreEvent", "Watch", "WatchEvent", "Propagation"]

Object = dict[str, Any]
GroupResource = tuple[str, str]
Key = tuple[str, str]  # (namespace or "", name)
Propagation = str  # "Background", "Foreground" or "Orphan"

_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
_GENERATE_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"
_CRD = ("apiextensions.k8s.io", "customresourcedefinitions")
_NAMESPACES = ("", "namespaces")
_PODS = ("", "pods")
_TERMINAL_PHASES = ("Succeeded", "Failed")
_STALE = "the object has been modified; please apply your changes to the latest version and try again"


@dataclasses.dataclass(frozen=True)
class StoreEvent:
    """One change in the history: the object after it and, for MODIFIED, before it."""

    resource_version: int
    type: str  # ADDED, MODIFIED or DELETED
    group_resource: GroupResource
    namespace: str
    obj: Object
    prev: Object | None


@dataclasses.dataclass(frozen=True)
class WatchEvent:
    """What a watch delivers: the event type as the watcher sees it and the object."""

    type: str
    obj: Object


def _rfc3339(epoch_s: float) -> str:
    return datetime.fromtimestamp(epoch_s, tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _meta(obj: Mapping[str, Any]) -> dict[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, dict) else {}


def _body_without(obj: Mapping[str, Any], *keys: str) -> dict[str, Any]:
    return {k: v for k, v in obj.items() if k not in keys}


def _comparable(obj: Mapping[str, Any]) -> dict[str, Any]:
    result = copy.deepcopy(dict(obj))
    _meta(result).pop("resourceVersion", None)
    _meta(result).pop("managedFields", None)
    return result


class Watch:
    """A watch from one resourceVersion: call `next_events` until it returns None (ended).

    Created by `Store.watch`; it holds no thread, only its position in the history.
    """

    def __init__(
        self,
        store: Store,
        rt: ResourceType,
        *,
        namespace: str | None,
        labels: LabelSelector,
        fields: FieldSelector,
        position: int,
        initial: list[WatchEvent],
    ) -> None:
        self._store = store
        self._rt = rt
        self._namespace = namespace
        self._labels = labels
        self._fields = fields
        self.position = position
        self._pending = initial
        self._stopped = False

    def _matches(self, obj: Mapping[str, Any]) -> bool:
        return self._labels.matches(obj) and self._fields.matches(obj)

    def _translate(self, event: StoreEvent) -> WatchEvent | None:
        if event.group_resource != self._rt.group_resource:
            return None
        if self._namespace is not None and event.namespace != self._namespace:
            return None
        now = self._matches(event.obj)
        before = event.prev is not None and self._matches(event.prev)
        kind = event.type
        if kind == "MODIFIED":
            # A watcher with a selector sees an object enter and leave its selection as it would
            # see it created and deleted.
            kind = {(True, True): "MODIFIED", (False, True): "ADDED", (True, False): "DELETED"}.get((before, now), "")
        elif not now:
            kind = ""
        if not kind:
            return None
        return WatchEvent(kind, self._store.rendered(self._rt, event.obj))

    def stop(self) -> None:
        """End the watch: a `next_events` waiting now or later returns None."""
        self._store.stop_watch(self)

    @property
    def stopped(self) -> bool:
        return self._stopped

    def next_events(self, timeout_s: float) -> list[WatchEvent] | None:
        """The events after the current position, waiting up to `timeout_s` for one.

        Returns [] when none came in time, None when the watch was stopped or the store closed.

        Raises:
            ApiError: 410 when the history this watch still needs was compacted.
        """
        if self._pending:
            pending, self._pending = self._pending, []
            return pending
        return self._store.next_events(self, self._translate, timeout_s)


class Store:
    """Objects by (group, resource, namespace, name) with watch history; thread-safe.

    Args:
        clock: epoch seconds, for creationTimestamp and deletionTimestamp.
        rng: names for `generateName` and uids.
        history_limit: events kept for watches; older ones are compacted away.
        graceful_pod_deletion: a scheduled, unfinished pod that is deleted without
            `gracePeriodSeconds=0` only gets a deletionTimestamp, for a kubelet to stop its
            processes and delete it with grace 0 (as a real kubelet does). Off when no kubelet runs.
    """

    def __init__(
        self,
        *,
        clock: Callable[[], float] = time.time,
        rng: random.Random | None = None,
        history_limit: int = 10_000,
        graceful_pod_deletion: bool = False,
    ) -> None:
        if history_limit < 1:
            raise ValueError(f"history_limit must be at least 1, not {history_limit}")
        self._clock = clock
        self._rng = rng or random.Random()
        self._history_limit = history_limit
        self._graceful_pods = graceful_pod_deletion
        self._cond = threading.Condition()
        self._rv = 0
        self._compacted = 0
        self._history: list[StoreEvent] = []
        self._history_rvs: list[int] = []
        self._objects: dict[GroupResource, dict[Key, Object]] = {}
        self._by_uid: dict[str, tuple[GroupResource, Key]] = {}
        self._types: dict[tuple[str, str, str], ResourceType] = {}
        self._crd_types: dict[str, list[ResourceType]] = {}
        self._closed = False
        for rt in BUILTIN_RESOURCES:
            self._types[(rt.group, rt.version, rt.plural)] = rt
        namespaces = self.resource_type("", "v1", "namespaces")
        for name in ("default", "kube-system", "kube-public"):
            self.create(namespaces, None, {"metadata": {"name": name}})

    # ----------------------------------------------------------------- resource types

    def resource_type(self, group: str, version: str, plural: str) -> ResourceType:
        """Raises ApiError(404) for a resource this server does not serve."""
        with self._cond:
            rt = self._types.get((group, version, plural))
        if rt is None:
            where = f"{group}/{version}" if group else version
            raise ApiError(404, "NotFound", f"the server could not find the requested resource ({where} {plural})")
        return rt

    def resource_types(self) -> list[ResourceType]:
        with self._cond:
            return list(self._types.values())

    def _register_crd(self, crd: Object) -> None:
        name = _meta(crd)["name"]
        for rt in self._crd_types.pop(name, []):
            self._types.pop((rt.group, rt.version, rt.plural), None)
        types = resource_types_of_crd(crd)
        for rt in types:
            taken = self._types.get((rt.group, rt.version, rt.plural))
            if taken is not None:
                raise ValueError(f"{rt.plural}.{rt.group}/{rt.version} is already served")
        for rt in types:
            self._types[(rt.group, rt.version, rt.plural)] = rt
        self._crd_types[name] = types

    # ----------------------------------------------------------------- reading

    @property
    def resource_version(self) -> int:
        with self._cond:
            return self._rv

    @property
    def compacted_resource_version(self) -> int:
        with self._cond:
            return self._compacted

    def rendered(self, rt: ResourceType, obj: Mapping[str, Any]) -> Object:
        """A copy of a stored object as a client of `rt`'s version reads it."""
        result = copy.deepcopy(dict(obj))
        result["apiVersion"] = rt.group_version
        result["kind"] = rt.kind
        return result

    def _bucket(self, rt: ResourceType) -> dict[Key, Object]:
        return self._objects.setdefault(rt.group_resource, {})

    def _key(self, rt: ResourceType, namespace: str | None, name: str) -> Key:
        if rt.namespaced and not namespace:
            raise ApiError.bad_request(f"{rt.plural} are namespaced: the request needs a namespace")
        return ((namespace or "") if rt.namespaced else "", name)

    def _existing(self, rt: ResourceType, namespace: str | None, name: str) -> Object:
        obj = self._bucket(rt).get(self._key(rt, namespace, name))
        if obj is None:
            raise ApiError.not_found(rt, name)
        return obj

    def get(self, rt: ResourceType, namespace: str | None, name: str) -> Object:
        """Raises ApiError(404) when there is no such object."""
        with self._cond:
            return self.rendered(rt, self._existing(rt, namespace, name))

    def holds(self, rt: ResourceType, namespace: str | None, name: str, uid: str) -> bool:
        """Whether the object `uid` is still stored (a deletion may leave it, marked)."""
        with self._cond:
            obj = self._bucket(rt).get(self._key(rt, namespace, name))
            return obj is not None and _meta(obj).get("uid") == uid

    def list(
        self,
        rt: ResourceType,
        namespace: str | None,
        labels: LabelSelector | None = None,
        fields: FieldSelector | None = None,
        *,
        limit: int | None = None,
        continue_token: str | None = None,
    ) -> tuple[builtins.list[Object], str, str | None]:
        """Matching objects in (namespace, name) order, the list's resourceVersion and the
        continue token of the next page (None on the last page).

        Pages are not a consistent snapshot: a later page reads the objects as they are then.
        """
        labels = labels or LabelSelector.parse("")
        fields = fields or FieldSelector.parse("", rt.field_selectable)
        start: Key = ("", "")
        if continue_token:
            try:
                decoded = json.loads(base64.urlsafe_b64decode(continue_token.encode()))
                start = (str(decoded["start"][0]), str(decoded["start"][1]))
            except (ValueError, KeyError, IndexError, TypeError) as e:
                raise ApiError.bad_request(f"invalid continue token: {e}") from None
        with self._cond:
            keys = sorted(k for k in self._bucket(rt) if (namespace is None or k[0] == namespace) and k >= start)
            items: list[Object] = []
            next_start: Key | None = None
            for key in keys:
                obj = self._bucket(rt)[key]
                if not (labels.matches(obj) and fields.matches(obj)):
                    continue
                if limit is not None and len(items) == limit:
                    next_start = key
                    break
                items.append(self.rendered(rt, obj))
            rv = str(self._rv)
        token = None
        if next_start is not None:
            token = base64.urlsafe_b64encode(json.dumps({"start": list(next_start)}).encode()).decode()
        return items, rv, token

    # ----------------------------------------------------------------- history

    def _record(self, kind: str, rt: ResourceType, key: Key, obj: Object, prev: Object | None) -> None:
        event = StoreEvent(self._rv, kind, rt.group_resource, key[0], copy.deepcopy(obj), prev)
        self._history.append(event)
        self._history_rvs.append(event.resource_version)
        if len(self._history) > self._history_limit:
            self._compact_to(self._history[len(self._history) - self._history_limit - 1].resource_version)
        self._cond.notify_all()

    def _compact_to(self, rv: int) -> None:
        cut = bisect.bisect_right(self._history_rvs, rv)
        del self._history[:cut]
        del self._history_rvs[:cut]
        self._compacted = max(self._compacted, rv)
        self._cond.notify_all()

    def compact(self, resource_version: int | None = None) -> int:
        """Drop the history up to `resource_version` (default: all of it); returns the compaction
        point. Watches from an older version, and open ones behind it, get 410 Gone."""
        with self._cond:
            self._compact_to(self._rv if resource_version is None else min(resource_version, self._rv))
            return self._compacted

    def history(self) -> builtins.list[StoreEvent]:
        """The retained history, oldest first."""
        with self._cond:
            return list(self._history)

    # ----------------------------------------------------------------- watching

    def watch(
        self,
        rt: ResourceType,
        namespace: str | None,
        labels: LabelSelector | None = None,
        fields: FieldSelector | None = None,
        resource_version: str | None = None,
    ) -> Watch:
        """A watch from `resource_version`; unset or "0" starts with ADDED for every matching object.

        Raises:
            ApiError: 400 for a resourceVersion this server never issued the form of, 410 for one
                older than the compaction point.
        """
        labels = labels or LabelSelector.parse("")
        fields = fields or FieldSelector.parse("", rt.field_selectable)
        with self._cond:
            if resource_version in (None, "", "0"):
                initial = [
                    WatchEvent("ADDED", self.rendered(rt, obj))
                    for key, obj in sorted(self._bucket(rt).items())
                    if (namespace is None or key[0] == namespace) and labels.matches(obj) and fields.matches(obj)
                ]
                return Watch(
                    self, rt, namespace=namespace, labels=labels, fields=fields, position=self._rv, initial=initial
                )
            position = self._parse_rv(resource_version)
            if position < self._compacted:
                raise ApiError.gone(f"too old resource version: {position} ({self._compacted})")
            return Watch(self, rt, namespace=namespace, labels=labels, fields=fields, position=position, initial=[])

    @staticmethod
    def _parse_rv(resource_version: str) -> int:
        if not resource_version.isdigit():
            raise ApiError.bad_request(f"invalid resource version {resource_version!r}")
        return int(resource_version)

    def next_events(
        self, watch: Watch, translate: Callable[[StoreEvent], WatchEvent | None], timeout_s: float
    ) -> builtins.list[WatchEvent] | None:
        """`Watch.next_events`' work, under the store's lock."""
        deadline = time.monotonic() + max(0.0, timeout_s)
        with self._cond:
            while True:
                if watch.stopped or self._closed:
                    return None
                if watch.position < self._compacted:
                    raise ApiError.gone(f"too old resource version: {watch.position} ({self._compacted})")
                start = bisect.bisect_right(self._history_rvs, watch.position)
                if start < len(self._history):
                    events = self._history[start:]
                    watch.position = events[-1].resource_version
                    seen = [e for e in map(translate, events) if e is not None]
                    if seen:
                        return seen
                    continue
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return []
                self._cond.wait(remaining)

    def stop_watch(self, watch: Watch) -> None:
        with self._cond:
            watch._stopped = True
            self._cond.notify_all()

    def close(self) -> None:
        """End every watch; the store still answers reads and writes."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    # ----------------------------------------------------------------- writing

    def _generate_name(self, prefix: str) -> str:
        return prefix + "".join(self._rng.choice(_GENERATE_ALPHABET) for _ in range(5))

    def _uid(self) -> str:
        return str(uuid.UUID(int=self._rng.getrandbits(128), version=4))

    def create(self, rt: ResourceType, namespace: str | None, body: Mapping[str, Any]) -> Object:
        """Store a new object: 201 semantics (uid, creationTimestamp, generation, resourceVersion).

        Raises:
            ApiError: 400 for a body of another kind or namespace, 404 for a missing namespace,
                409 for a name in use, 422 for an invalid name or CRD.
        """
        if not isinstance(body, Mapping):
            raise ApiError.bad_request("the request body must be a JSON object")
        obj: Object = copy.deepcopy(dict(body))
        if obj.get("kind") not in (None, rt.kind):
            raise ApiError.bad_request(f"the body's kind {obj.get('kind')!r} is not {rt.kind!r}")
        meta = obj.setdefault("metadata", {})
        if not isinstance(meta, dict):
            raise ApiError.bad_request("metadata must be an object")
        with self._cond:
            name = self._place(rt, namespace, meta)
            key = self._key(rt, namespace, name)
            if key in self._bucket(rt):
                raise ApiError.already_exists(rt, name)
            for transient in ("deletionTimestamp", "deletionGracePeriodSeconds", "managedFields"):
                meta.pop(transient, None)
            obj.pop("apiVersion", None)
            obj.pop("kind", None)
            if rt.has_status:
                obj.pop("status", None)
            if rt.group_resource == _PODS:
                obj["status"] = {"phase": "Pending"}
            elif rt.group_resource == _NAMESPACES:
                obj["status"] = {"phase": "Active"}
            if rt.group_resource == _CRD:
                self._accept_crd(rt, obj)
            meta["uid"] = self._uid()
            meta["creationTimestamp"] = _rfc3339(self._clock())
            meta["generation"] = 1
            self._rv += 1
            meta["resourceVersion"] = str(self._rv)
            self._bucket(rt)[key] = obj
            self._by_uid[meta["uid"]] = (rt.group_resource, key)
            self._record("ADDED", rt, key, obj, None)
            return self.rendered(rt, obj)

    def _place(self, rt: ResourceType, namespace: str | None, meta: dict[str, Any]) -> str:
        """Set a new object's namespace and name (from generateName); returns the name."""
        if rt.namespaced:
            if meta.get("namespace") not in (None, "", namespace):
                raise ApiError.bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request"
                )
            self._check_namespace_open(namespace or "")
            meta["namespace"] = namespace
        else:
            meta.pop("namespace", None)
        if not meta.get("name") and meta.get("generateName"):
            meta["name"] = self._generate_name(str(meta["generateName"]))
        name = meta.get("name")
        if not isinstance(name, str) or not name:
            raise ApiError.invalid(rt, "", "metadata.name: Required value: name or generateName is required")
        if len(name) > 253 or not _NAME.match(name):
            raise ApiError.invalid(rt, name, f"metadata.name: Invalid value: {name!r}: must be a DNS subdomain")
        return name

    def _check_namespace_open(self, namespace: str) -> None:
        ns = self._objects.get(_NAMESPACES, {}).get(("", namespace))
        if ns is None:
            raise ApiError(404, "NotFound", f'namespaces "{namespace}" not found', name=namespace)
        if _meta(ns).get("deletionTimestamp"):
            message = f"unable to create new content in namespace {namespace} because it is being terminated"
            raise ApiError(403, "Forbidden", message, name=namespace)

    def _accept_crd(self, rt: ResourceType, obj: Object) -> None:
        try:
            self._register_crd(obj)
        except ValueError as e:
            raise ApiError.invalid(rt, str(_meta(obj).get("name", "")), str(e)) from None
        names = (obj.get("spec") or {}).get("names") or {}
        conditions = [
            {"type": t, "status": "True", "reason": r, "message": m, "lastTransitionTime": _rfc3339(self._clock())}
            for t, r, m in (
                ("NamesAccepted", "NoConflicts", "no conflicts found"),
                ("Established", "InitialNamesAccepted", "the initial names have been accepted"),
            )
        ]
        versions = [v["name"] for v in (obj.get("spec") or {}).get("versions") or [] if v.get("storage")]
        obj["status"] = {"acceptedNames": copy.deepcopy(names), "conditions": conditions, "storedVersions": versions}

    def replace(
        self, rt: ResourceType, namespace: str | None, name: str, body: Mapping[str, Any], *, status: bool = False
    ) -> Object:
        """PUT: the whole object (or, with `status`, only its status) from `body`.

        A body with a resourceVersion other than the stored one gets 409; one without replaces
        unconditionally.
        """
        if not isinstance(body, Mapping):
            raise ApiError.bad_request("the request body must be a JSON object")
        if _meta(body).get("name") not in (None, name):
            raise ApiError.bad_request(f"the name in the body does not match the name in the URL ({name!r})")
        with self._cond:
            current = self._existing(rt, namespace, name)
            return self._update(rt, current, copy.deepcopy(dict(body)), status=status)

    def patch(
        self,
        rt: ResourceType,
        namespace: str | None,
        name: str,
        apply: Callable[[Object], Any],
        *,
        status: bool = False,
    ) -> Object:
        """PATCH: `apply` maps the object as a client reads it to the patched object; atomic."""
        with self._cond:
            current = self._existing(rt, namespace, name)
            patched = apply(self.rendered(rt, current))
            if not isinstance(patched, dict):
                raise ApiError.bad_request("the patched object is not a JSON object")
            return self._update(rt, current, patched, status=status)

    def _update(self, rt: ResourceType, current: Object, body: Object, *, status: bool) -> Object:
        cur_meta = _meta(current)
        name = cur_meta["name"]
        new_meta = body.get("metadata")
        if not isinstance(new_meta, dict):
            raise ApiError.bad_request("metadata must be an object")
        sent_rv = new_meta.get("resourceVersion")
        if sent_rv not in (None, "") and str(sent_rv) != cur_meta["resourceVersion"]:
            raise ApiError.conflict(rt, name, _STALE)
        if status:
            # A status write changes the status and nothing else.
            new = copy.deepcopy(current)
            if "status" in body:
                new["status"] = body["status"]
            else:
                new.pop("status", None)
        else:
            new = self._main_write(rt, current, body)
        if _comparable(new) == _comparable(current):
            return self.rendered(rt, current)
        key = self._key(rt, cur_meta.get("namespace"), name)
        if cur_meta.get("deletionTimestamp") and not _meta(new).get("finalizers"):
            self._rv += 1
            _meta(new)["resourceVersion"] = str(self._rv)
            self._remove(rt, key, new)
            return self.rendered(rt, new)
        self._rv += 1
        _meta(new)["resourceVersion"] = str(self._rv)
        self._bucket(rt)[key] = new
        self._record("MODIFIED", rt, key, new, current)
        return self.rendered(rt, new)

    def _main_write(self, rt: ResourceType, current: Object, body: Object) -> Object:
        """The object a write of everything but the status makes of `current`."""
        cur_meta = _meta(current)
        name = cur_meta["name"]
        new = _body_without(body, "apiVersion", "kind")
        if rt.has_status:
            new.pop("status", None)
            if "status" in current:
                new["status"] = copy.deepcopy(current["status"])
        meta = new["metadata"]
        for immutable in ("uid", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds"):
            meta.pop(immutable, None)
            if immutable in cur_meta:
                meta[immutable] = cur_meta[immutable]
        meta["name"] = name
        if "namespace" in cur_meta:
            meta["namespace"] = cur_meta["namespace"]
        else:
            meta.pop("namespace", None)
        meta.pop("managedFields", None)
        if cur_meta.get("deletionTimestamp"):
            added = set(meta.get("finalizers") or []) - set(cur_meta.get("finalizers") or [])
            if added:
                why = "metadata.finalizers: Forbidden: no new finalizers can be added if the object is being deleted"
                raise ApiError.invalid(rt, name, why)
        spec_changed = _body_without(new, "metadata", "status") != _body_without(current, "metadata", "status")
        meta["generation"] = int(cur_meta.get("generation", 1)) + (1 if spec_changed else 0)
        meta["resourceVersion"] = cur_meta["resourceVersion"]
        if rt.group_resource == _CRD and new.get("spec") != current.get("spec"):
            try:
                self._register_crd(new)
            except ValueError as e:
                raise ApiError.invalid(rt, name, str(e)) from None
        return new

    # ----------------------------------------------------------------- deleting

    def delete(
        self,
        rt: ResourceType,
        namespace: str | None,
        name: str,
        *,
        propagation: Propagation | None = None,
        grace_period_s: int | None = None,
        precondition_uid: str | None = None,
        precondition_rv: str | None = None,
    ) -> Object:
        """DELETE: remove the object now, or mark it (deletionTimestamp) while finalizers remain.

        Background (the default) and Foreground propagation delete the objects it owns once it is
        gone (Foreground: first, within this call); Orphan removes their ownerReference to it.
        """
        if propagation not in (None, "Background", "Foreground", "Orphan"):
            raise ApiError.bad_request(f"unknown propagationPolicy {propagation!r}")
        with self._cond:
            current = self._existing(rt, namespace, name)
            meta = _meta(current)
            if precondition_uid not in (None, meta["uid"]):
                raise ApiError.conflict(rt, name, f"Precondition failed: UID in precondition: {precondition_uid}")
            if precondition_rv not in (None, meta["resourceVersion"]):
                why = f"Precondition failed: ResourceVersion in precondition: {precondition_rv}"
                raise ApiError.conflict(rt, name, why)
            key = self._key(rt, namespace, name)
            if propagation == "Orphan":
                self._orphan_dependents(meta["uid"])
            elif propagation == "Foreground":
                self._delete_dependents(meta["uid"])
            if rt.group_resource == _NAMESPACES:
                return self._delete_namespace(rt, key, current)
            if meta.get("finalizers") or self._deletes_gracefully(rt, current, grace_period_s):
                if meta.get("deletionTimestamp"):
                    return self.rendered(rt, current)
                marked = copy.deepcopy(current)
                grace = self._grace_s(current, grace_period_s) if not meta.get("finalizers") else 0
                _meta(marked)["deletionTimestamp"] = _rfc3339(self._clock() + grace)
                _meta(marked)["deletionGracePeriodSeconds"] = grace
                self._rv += 1
                _meta(marked)["resourceVersion"] = str(self._rv)
                self._bucket(rt)[key] = marked
                self._record("MODIFIED", rt, key, marked, current)
                return self.rendered(rt, marked)
            gone = copy.deepcopy(current)
            self._rv += 1
            _meta(gone)["resourceVersion"] = str(self._rv)
            self._remove(rt, key, gone)
            return self.rendered(rt, gone)

    def _deletes_gracefully(self, rt: ResourceType, pod: Object, grace_period_s: int | None) -> bool:
        if not self._graceful_pods or rt.group_resource != _PODS or grace_period_s == 0:
            return False
        return (
            bool((pod.get("spec") or {}).get("nodeName"))
            and (pod.get("status") or {}).get("phase") not in _TERMINAL_PHASES
        )

    @staticmethod
    def _grace_s(pod: Object, grace_period_s: int | None) -> int:
        if grace_period_s is not None:
            return grace_period_s
        return int((pod.get("spec") or {}).get("terminationGracePeriodSeconds", 30))

    def _remove(self, rt: ResourceType, key: Key, final: Object) -> None:
        """Remove an object whose final state (with its deletion's resourceVersion) is `final`,
        then collect what it owned and, for the last object of a terminating namespace, that."""
        del self._bucket(rt)[key]
        uid = _meta(final).get("uid", "")
        self._by_uid.pop(uid, None)
        self._record("DELETED", rt, key, final, None)
        if rt.group_resource == _CRD:
            self._drop_crd(str(_meta(final)["name"]))
        self._collect_dependents(uid)
        if key[0]:
            self._finish_namespace(key[0])

    def _drop_crd(self, name: str) -> None:
        types = self._crd_types.pop(name, [])
        for rt in types:
            self._types.pop((rt.group, rt.version, rt.plural), None)
        if types:
            rt = types[0]
            for key, obj in sorted(self._bucket(rt).items()):
                if key in self._bucket(rt):
                    self._force_remove(rt, key, obj)

    def _force_remove(self, rt: ResourceType, key: Key, obj: Object) -> None:
        gone = copy.deepcopy(obj)
        self._rv += 1
        _meta(gone)["resourceVersion"] = str(self._rv)
        self._remove(rt, key, gone)

    def _type_of(self, group_resource: GroupResource) -> ResourceType:
        return next(rt for rt in self._types.values() if rt.group_resource == group_resource)

    def _dependents(self, owner_uid: str) -> Iterator[tuple[ResourceType, Key, Object]]:
        for group_resource, bucket in list(self._objects.items()):
            if not bucket:
                continue
            rt = self._type_of(group_resource)
            for key, obj in sorted(bucket.items()):
                refs = _meta(obj).get("ownerReferences") or []
                if any(isinstance(r, dict) and r.get("uid") == owner_uid for r in refs):
                    yield rt, key, obj

    def _collect_dependents(self, owner_uid: str) -> None:
        """The garbage collector: an object whose owners are all gone is deleted."""
        for rt, key, obj in list(self._dependents(owner_uid)):
            current = self._bucket(rt).get(key)
            if current is None or _meta(current).get("uid") != _meta(obj).get("uid"):
                continue
            refs = _meta(current).get("ownerReferences") or []
            if any(r.get("uid") in self._by_uid for r in refs if isinstance(r, dict)):
                continue
            self.delete(rt, key[0] or None, key[1])

    def _delete_dependents(self, owner_uid: str) -> None:
        for rt, key, _ in list(self._dependents(owner_uid)):
            if key in self._bucket(rt):
                self.delete(rt, key[0] or None, key[1], propagation="Foreground")

    def _orphan_dependents(self, owner_uid: str) -> None:
        for rt, _key, obj in list(self._dependents(owner_uid)):
            body = copy.deepcopy(obj)
            refs = [r for r in _meta(body).get("ownerReferences") or [] if r.get("uid") != owner_uid]
            if refs:
                _meta(body)["ownerReferences"] = refs
            else:
                _meta(body).pop("ownerReferences", None)
            self._update(rt, obj, body, status=False)

    def _delete_namespace(self, rt: ResourceType, key: Key, current: Object) -> Object:
        name = key[1]
        if not _meta(current).get("deletionTimestamp"):
            marked = copy.deepcopy(current)
            _meta(marked)["deletionTimestamp"] = _rfc3339(self._clock())
            _meta(marked)["deletionGracePeriodSeconds"] = 0
            marked["status"] = {"phase": "Terminating"}
            self._rv += 1
            _meta(marked)["resourceVersion"] = str(self._rv)
            self._bucket(rt)[key] = marked
            self._record("MODIFIED", rt, key, marked, current)
        for group_resource, bucket in list(self._objects.items()):
            for obj_key in sorted(k for k in bucket if k[0] == name):
                if obj_key in bucket:
                    self.delete(self._type_of(group_resource), name, obj_key[1])
        self._finish_namespace(name)
        remaining = self._bucket(rt).get(key)
        return self.rendered(rt, remaining if remaining is not None else current)

    def _finish_namespace(self, name: str) -> None:
        ns = self._objects.get(_NAMESPACES, {}).get(("", name))
        if ns is None or not _meta(ns).get("deletionTimestamp"):
            return
        if any(k[0] == name for bucket in self._objects.values() for k in bucket):
            return
        self._force_remove(self._type_of(_NAMESPACES), ("", name), ns)
