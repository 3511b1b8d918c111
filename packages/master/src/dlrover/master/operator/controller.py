"""The operator's watch loop: caches fed by `dlrover.master.kube.watch`, one worker applying `reconcile`.

Every collection the decision reads (ElasticJobs, and DLRover's pods, Services, Secrets,
ServiceAccounts, Roles and RoleBindings by the `app.kubernetes.io/managed-by=dlrover` label) is
listed once and then watched; a change queues the job it belongs to. A single worker thread takes
due jobs from the queue, asks the job's master for its status (at most once per
`status_interval_s`), calls the pure `reconcile`, makes its writes and writes the status. A job is
queued again after `status_interval_s` while it runs (to mirror the master's status) and after
`resync_interval_s` otherwise, so a storage that appears later is found.
"""

from __future__ import annotations

import base64
import datetime
import functools
import heapq
import logging
import threading
from collections.abc import Callable, Mapping
from typing import Any

import attrs

from dlrover.common import ChannelConfig, Clock, DLRoverError, RetryPolicy, SystemClock, TLSConfig, generate_token
from dlrover.common.validators import positive
from dlrover.master.client import MasterClient
from dlrover.master.kube.names import (
    COMPONENT_LABEL,
    COMPONENT_MASTER,
    COMPONENT_WORKER,
    CRD_GROUP,
    CRD_KIND,
    CRD_PLURAL,
    CRD_VERSION,
    JOB_LABEL,
    MANAGED_BY,
    MANAGED_BY_LABEL,
    TOKEN_SECRET_KEY,
    master_name,
    token_secret_name,
)
from dlrover.master.kube.watch import EventType, ListWatch, Watcher, WatchEvent, WatchSettings, object_key
from dlrover.master.operator.objects import serves_tls
from dlrover.master.operator.reconcile import (
    APPLIED_SPEC_STATUS,
    CreateObject,
    DeleteObject,
    Observed,
    ReconcileSettings,
    Reconciliation,
    ResizeJob,
    UpdateObject,
    reconcile,
)
from dlrover.master.status import JobSummary

__all__ = ["MasterAddress", "MasterStatusSource", "Operator", "OperatorSettings"]

log = logging.getLogger("dlrover.master.operator")


@attrs.frozen
class OperatorSettings:
    """The operator's settings (its flags).

    Attributes:
        namespace: the namespace watched; None watches every namespace.
        reconcile: how masters are started and how often they may be replaced.
        status_interval_s: how often a running job's master is asked for its status.
        resync_interval_s: how often a job that is not running is looked at again without an event.
        master_call_timeout_s: deadline of a call to a master (status, resize).
        retry_interval_s: wait before a job whose writes failed is reconciled again.
        watch: list/watch timeouts and backoff.
        master_tls_ca: a CA bundle to verify masters that serve TLS (`spec.master.tls`); None:
            the system roots.
        sync_timeout_s: how long `start` waits for the first list of every collection.
    """

    namespace: str | None = None
    reconcile: ReconcileSettings = attrs.field(factory=ReconcileSettings)
    status_interval_s: float = attrs.field(default=5.0, validator=positive)
    resync_interval_s: float = attrs.field(default=30.0, validator=positive)
    master_call_timeout_s: float = attrs.field(default=5.0, validator=positive)
    retry_interval_s: float = attrs.field(default=2.0, validator=positive)
    watch: WatchSettings = attrs.field(factory=WatchSettings)
    master_tls_ca: str | None = None
    sync_timeout_s: float = attrs.field(default=60.0, validator=positive)


@attrs.frozen
class MasterAddress:
    """Where and how to call one job's master.

    Attributes:
        namespace, job: the ElasticJob.
        target: the master pod's `podIP:port`.
        token: the job token (from the Secret the operator created).
        tls: the master serves TLS (verified against `OperatorSettings.master_tls_ca`, for the name
            `<job>-master.<namespace>.svc`).
    """

    namespace: str
    job: str
    target: str
    token: str = attrs.field(repr=False)
    tls: bool = False


class MasterStatusSource:
    """Calls masters' JobService with the job's token: the status mirrored, the resize of an edit."""

    def __init__(self, settings: OperatorSettings) -> None:
        self._settings = settings

    def _client(self, address: MasterAddress) -> MasterClient:
        timeout = self._settings.master_call_timeout_s
        channel = None
        if address.tls:
            name = f"{master_name(address.job)}.{address.namespace}.svc"
            channel = ChannelConfig(tls=TLSConfig(ca_file=self._settings.master_tls_ca, server_name_override=name))
        policy = RetryPolicy(call_timeout_s=timeout, total_timeout_s=timeout, max_attempts=1)
        return MasterClient(address.target, address.token, channel_config=channel, policy=policy)

    def status(self, address: MasterAddress) -> JobSummary:
        """The master's `job_status`."""
        with self._client(address) as client:
            return client.job_status()

    def resize(self, address: MasterAddress, nodes: int, reason: str) -> str:
        """The master's `resize` to `nodes`; returns its message."""
        with self._client(address) as client:
            return client.resize(nodes, reason).message


@attrs.define
class _MasterView:
    pod_uid: str = ""
    summary: JobSummary | None = None
    error: str = ""
    polled_at: float | None = None


_CORE_KINDS = ("Pod", "Service", "Secret", "ServiceAccount")
_RBAC_KINDS = ("Role", "RoleBinding")
_PLURALS = {
    "Pod": "pod",
    "Service": "service",
    "Secret": "secret",
    "ServiceAccount": "service_account",
    "Role": "role",
    "RoleBinding": "role_binding",
}


def _owned_by(obj: Mapping[str, Any], uid: str) -> bool:
    """Whether `obj` belongs to the job incarnation `uid` (an ownerReference to it)."""
    return any(ref.get("uid") == uid for ref in (obj.get("metadata") or {}).get("ownerReferences") or [])


def _claims_named(spec: Mapping[str, Any]) -> set[str]:
    """The PersistentVolumeClaims a spec names (its checkpoint volume, its master's state volume)."""
    volumes = ((spec.get("checkpoint") or {}).get("volume"), (spec.get("master") or {}).get("stateVolume"))
    names = (((volume or {}).get("persistentVolumeClaim") or {}).get("claimName") for volume in volumes)
    return {name for name in names if isinstance(name, str) and name}


def _secrets_named(spec: Mapping[str, Any]) -> set[str]:
    """The Secrets a spec names (its object store's credentials, its master's TLS)."""
    refs = (
        ((spec.get("checkpoint") or {}).get("objectStore") or {}).get("secretName"),
        ((spec.get("master") or {}).get("tls") or {}).get("secretName"),
    )
    return {ref for ref in refs if isinstance(ref, str) and ref}


class Operator:
    """Runs ElasticJobs: watches them and what DLRover created for them, reconciles each.

    Args:
        api_client: a `kubernetes.client.ApiClient` (closed by the caller).
        settings: namespaces, intervals, timeouts.
        clock: monotonic time for the queue and wall time for conditions.
        masters: how masters are called (tests inject a fake).
        token_factory: makes a job token.
    """

    def __init__(
        self,
        api_client: Any,
        settings: OperatorSettings | None = None,
        *,
        clock: Clock | None = None,
        masters: MasterStatusSource | None = None,
        token_factory: Callable[[], str] = generate_token,
    ) -> None:
        from kubernetes import client

        self._settings = settings or OperatorSettings()
        self._clock = clock or SystemClock()
        self._masters = masters or MasterStatusSource(self._settings)
        self._token_factory = token_factory
        # Typed Any: the client's models are not what this module passes (plain JSON dicts).
        self._core: Any = client.CoreV1Api(api_client)
        self._rbac: Any = client.RbacAuthorizationV1Api(api_client)
        self._custom: Any = client.CustomObjectsApi(api_client)
        self._api_exception = client.exceptions.ApiException
        self._lock = threading.Condition()
        self._queue: list[tuple[float, str]] = []
        self._due: dict[str, float] = {}
        self._views: dict[str, _MasterView] = {}
        self._stopping = threading.Event()
        self._watchers: dict[str, Watcher] = {}
        self._worker = threading.Thread(target=self._work, name="dlrover-operator")
        self.reconciles = 0
        self.last_reason: dict[str, str] = {}

    # ---- watching

    def _list_func(self, kind: str) -> Callable[..., Any]:
        ns = self._settings.namespace
        selector = f"{MANAGED_BY_LABEL}={MANAGED_BY}"
        if kind == "ElasticJob":
            if ns is None:
                return functools.partial(self._custom.list_cluster_custom_object, CRD_GROUP, CRD_VERSION, CRD_PLURAL)
            return functools.partial(self._custom.list_namespaced_custom_object, CRD_GROUP, CRD_VERSION, ns, CRD_PLURAL)
        api = self._rbac if kind in _RBAC_KINDS else self._core
        plural = _PLURALS[kind]
        if ns is None:
            method = getattr(api, f"list_{plural}_for_all_namespaces")
            return functools.partial(method, label_selector=selector)
        return functools.partial(getattr(api, f"list_namespaced_{plural}"), ns, label_selector=selector)

    def _on_event(self, kind: str, event: WatchEvent) -> None:
        if event.type is EventType.SYNCED:
            return
        obj = event.object
        meta = obj.get("metadata") or {}
        if kind == "ElasticJob":
            key = object_key(obj)
            if event.type is EventType.DELETED:
                with self._lock:
                    self._views.pop(key, None)
                    self.last_reason.pop(key, None)
                return
        else:
            job = (meta.get("labels") or {}).get(JOB_LABEL)
            if not job:
                return
            key = f"{meta.get('namespace', '')}/{job}"
        self.enqueue(key)

    def start(self) -> Operator:
        """Start watching and reconciling; returns once every collection was listed.

        Raises:
            DLRoverError: a collection could not be listed within `sync_timeout_s`.
        """
        for kind in ("ElasticJob", *_CORE_KINDS, *_RBAC_KINDS):
            list_watch = ListWatch(
                self._list_func(kind), settings=self._settings.watch, clock=self._clock, name=f"{kind} objects"
            )
            self._watchers[kind] = Watcher(
                list_watch, functools.partial(self._on_event, kind), name=f"dlrover-operator-watch-{kind}"
            ).start()
        for kind, watcher in self._watchers.items():
            if not watcher.wait_synced(self._settings.sync_timeout_s):
                self.stop()
                raise DLRoverError(
                    f"the operator could not list {kind} objects within {self._settings.sync_timeout_s} s"
                )
        self._worker.start()
        return self

    def stop(self) -> None:
        """Stop watching and reconciling; joins every thread. Idempotent."""
        self._stopping.set()
        with self._lock:
            self._lock.notify_all()
        for watcher in self._watchers.values():
            watcher.stop()
        if self._worker.is_alive():
            self._worker.join()

    def __enter__(self) -> Operator:
        return self.start()

    def __exit__(self, *_exc: object) -> None:
        self.stop()

    @property
    def failed_watch(self) -> BaseException | None:
        """The error that stopped a watcher early, if one did."""
        return next((w.error for w in self._watchers.values() if w.error is not None), None)

    # ---- the queue

    def enqueue(self, key: str, delay_s: float = 0.0) -> None:
        """Reconcile the job `namespace/name` after `delay_s` (sooner if already due sooner)."""
        due = self._clock.now() + delay_s
        with self._lock:
            if key in self._due and self._due[key] <= due:
                return
            self._due[key] = due
            heapq.heappush(self._queue, (due, key))
            self._lock.notify_all()

    def _next_key(self) -> str | None:
        with self._lock:
            while not self._stopping.is_set():
                while self._queue and self._due.get(self._queue[0][1]) != self._queue[0][0]:
                    heapq.heappop(self._queue)  # superseded by an earlier due time
                now = self._clock.now()
                if self._queue and self._queue[0][0] <= now:
                    _, key = heapq.heappop(self._queue)
                    del self._due[key]
                    return key
                wait = self._queue[0][0] - now if self._queue else None
                self._lock.wait(wait)
        return None

    def _work(self) -> None:
        while (key := self._next_key()) is not None:
            try:
                delay = self.reconcile_job(key)
            except Exception:
                log.exception("reconciling %s failed; retrying in %.1f s", key, self._settings.retry_interval_s)
                delay = self._settings.retry_interval_s
            if delay is not None:
                self.enqueue(key, delay)

    # ---- one job

    def _cached(self, kind: str, namespace: str, name: str) -> Mapping[str, Any] | None:
        watcher = self._watchers.get(kind)
        return None if watcher is None else watcher.list_watch.objects().get(f"{namespace}/{name}")

    def _exists(self, kind: str, namespace: str, name: str) -> bool:
        read: Any = (
            self._core.read_namespaced_persistent_volume_claim
            if kind == "PersistentVolumeClaim"
            else self._core.read_namespaced_secret
        )
        try:
            read(name, namespace)
        except self._api_exception as exc:
            if exc.status == 404:
                return False
            raise
        return True

    def _observe(self, job: Mapping[str, Any], key: str) -> Observed:
        meta = job["metadata"]
        namespace, name, uid = meta["namespace"], meta["name"], str(meta.get("uid") or "")
        master = master_name(name)
        pods = self._watchers["Pod"].list_watch.objects().values()
        workers = tuple(
            p
            for p in pods
            if (p.get("metadata") or {}).get("namespace") == namespace
            and ((p.get("metadata") or {}).get("labels") or {}).get(JOB_LABEL) == name
            and ((p.get("metadata") or {}).get("labels") or {}).get(COMPONENT_LABEL) == COMPONENT_WORKER
            # (A master that does not know its job's uid creates pods with no owner: still this job's.)
            and not any(
                ref.get("kind") == CRD_KIND and ref.get("uid") != uid
                for ref in (p.get("metadata") or {}).get("ownerReferences") or []
            )
        )
        foreign: set[str] = set()

        def own(kind: str, object_name: str) -> Mapping[str, Any] | None:
            found = self._cached(kind, namespace, object_name)
            if found is not None and not _owned_by(found, uid):
                foreign.add(kind)
                return None
            return found

        master_pod = own("Pod", master)
        if (
            master_pod is not None
            and (master_pod.get("metadata") or {}).get("labels", {}).get(COMPONENT_LABEL) != COMPONENT_MASTER
        ):
            master_pod = None
        secret = own("Secret", token_secret_name(name))
        claims: set[str] = set()
        secrets: set[str] = set()
        if master_pod is None:
            # Only before a master starts: does the storage the spec names (or the spec in force) exist?
            for spec in (job.get("spec") or {}, (job.get("status") or {}).get(APPLIED_SPEC_STATUS) or {}):
                claims |= {c for c in _claims_named(spec) if self._exists("PersistentVolumeClaim", namespace, c)}
                secrets |= {
                    ref
                    for ref in (*_secrets_named(spec), self._settings.reconcile.master.tls_secret)
                    if ref and self._exists("Secret", namespace, ref)
                }
        view = self._poll_master(job, key, master_pod, secret)
        return Observed(
            master_pod=master_pod,
            service=own("Service", master),
            secret=secret,
            service_account=own("ServiceAccount", master),
            role=own("Role", master),
            role_binding=own("RoleBinding", master),
            worker_pods=workers,
            claims=frozenset(claims),
            secrets=frozenset(secrets),
            foreign=frozenset(foreign),
            summary=view.summary,
            master_error=view.error,
        )

    def _poll_master(
        self, job: Mapping[str, Any], key: str, pod: Mapping[str, Any] | None, secret: Mapping[str, Any] | None
    ) -> _MasterView:
        uid = str(((pod or {}).get("metadata") or {}).get("uid") or "")
        with self._lock:
            view = self._views.get(key)
            if view is None or view.pod_uid != uid:
                # A new master incarnation: what the old one said no longer holds.
                view = self._views[key] = _MasterView(pod_uid=uid)
        status = (pod or {}).get("status") or {}
        if pod is None or status.get("phase") != "Running" or not status.get("podIP") or secret is None:
            return view
        now = self._clock.now()
        if view.polled_at is not None and now - view.polled_at < self._settings.status_interval_s * 0.9:
            return view
        address = self._master_address(job, pod, secret)
        view.polled_at = now
        try:
            view.summary = self._masters.status(address)
            view.error = ""
        except Exception as exc:  # the master may be starting, restarting or gone: said in the status
            view.error = f"the status call to {address.target} failed: {exc}"
            log.info("%s: %s", key, view.error)
        return view

    def _master_address(
        self, job: Mapping[str, Any], pod: Mapping[str, Any], secret: Mapping[str, Any]
    ) -> MasterAddress:
        # From the pod, not the spec: an edit the running job did not take (a port, TLS) is not what it serves.
        port = 50001
        containers = (pod.get("spec") or {}).get("containers") or []
        for port_spec in (containers[0].get("ports") or []) if containers else []:
            port = int(port_spec.get("containerPort", port))
        token = base64.b64decode((secret.get("data") or {}).get(TOKEN_SECRET_KEY, "")).decode()
        tls = serves_tls(pod)
        meta = job["metadata"]
        return MasterAddress(meta["namespace"], meta["name"], f"{pod['status']['podIP']}:{port}", token, tls)

    def reconcile_job(self, key: str) -> float | None:
        """Reconcile one job now; returns when to look again (None: only on its next event)."""
        namespace, name = key.split("/", 1)
        job = self._cached("ElasticJob", namespace, name)
        if job is None:
            with self._lock:
                self._views.pop(key, None)
            return None
        observed = self._observe(job, key)
        wall = datetime.datetime.fromtimestamp(self._clock.wall_time(), datetime.UTC)
        answer = reconcile(
            job,
            observed,
            self._settings.reconcile,
            now=wall.strftime("%Y-%m-%dT%H:%M:%SZ"),
            new_token=self._token_factory(),
        )
        self.reconciles += 1
        if answer.reason != self.last_reason.get(key):
            log.info("%s: %s", key, answer.reason)
        self.last_reason[key] = answer.reason
        if any(isinstance(w, CreateObject) for w in answer.writes) and not self._still_there(job):
            # The cache lags a deletion: creating now would leave objects owned by a job that is gone.
            log.info("%s: deleted meanwhile; nothing created", key)
            return None
        failed = self._apply(job, answer, observed)
        if ResizeJob in failed:
            # Not carried out: the spec in force must not say it was, so the next pass sends it again.
            status = dict(answer.status)
            previous = (job.get("status") or {}).get(APPLIED_SPEC_STATUS)
            if previous is None:
                status.pop(APPLIED_SPEC_STATUS, None)
            else:
                status[APPLIED_SPEC_STATUS] = previous
            answer = attrs.evolve(answer, status=status)
        if answer.status != (job.get("status") or {}):
            self._write_status(job, answer)
        if failed:
            return self._settings.retry_interval_s
        phase = answer.status.get("phase")
        if phase in ("Succeeded", "Failed") and not answer.writes:
            return self._settings.resync_interval_s
        if answer.writes:
            return self._settings.retry_interval_s
        return (
            self._settings.status_interval_s
            if phase == "Running" or observed.master_pod
            else self._settings.resync_interval_s
        )

    def _still_there(self, job: Mapping[str, Any]) -> bool:
        """Whether the job still exists as this incarnation (one read before creating for it)."""
        meta = job["metadata"]
        try:
            live = self._custom.get_namespaced_custom_object(
                CRD_GROUP, CRD_VERSION, meta["namespace"], CRD_PLURAL, meta["name"]
            )
        except self._api_exception as exc:
            if exc.status == 404:
                return False
            raise
        live_meta = live.get("metadata") or {}
        return bool(live_meta.get("uid") == meta.get("uid") and not live_meta.get("deletionTimestamp"))

    def _apply(self, job: Mapping[str, Any], answer: Reconciliation, observed: Observed) -> set[type]:
        """Make the writes; the kinds of those that failed (empty: all made)."""
        namespace = job["metadata"]["namespace"]
        failed: set[type] = set()
        for write in answer.writes:
            try:
                if isinstance(write, CreateObject):
                    self._create(namespace, write)
                elif isinstance(write, UpdateObject):
                    self._update(namespace, write)
                elif isinstance(write, DeleteObject):
                    self._delete(namespace, write)
                elif isinstance(write, ResizeJob):
                    self._resize(job, write, observed)
            except self._api_exception as exc:
                if exc.status == 409 and isinstance(write, CreateObject):
                    continue  # the cache has not seen our own earlier create yet
                if exc.status == 404 and isinstance(write, DeleteObject | UpdateObject):
                    continue  # gone: deleted as asked, or created afresh at the next pass
                log.warning(
                    "%s/%s: %s failed: %s %s", namespace, job["metadata"]["name"], write, exc.status, exc.reason
                )
                failed.add(type(write))
            except DLRoverError as exc:
                log.warning("%s/%s: %s failed: %s", namespace, job["metadata"]["name"], write, exc)
                failed.add(type(write))
        return failed

    def _create(self, namespace: str, write: CreateObject) -> None:
        api = self._rbac if write.kind in _RBAC_KINDS else self._core
        getattr(api, f"create_namespaced_{_PLURALS[write.kind]}")(namespace, dict(write.obj), _preload_content=False)

    def _update(self, namespace: str, write: UpdateObject) -> None:
        api = self._rbac if write.kind in _RBAC_KINDS else self._core
        log.info("%s: update %s %s: %s", namespace, write.kind, write.name, write.reason)
        getattr(api, f"replace_namespaced_{_PLURALS[write.kind]}")(
            write.name, namespace, dict(write.obj), _preload_content=False
        )

    def _delete(self, namespace: str, write: DeleteObject) -> None:
        body: dict[str, Any] = {}
        if write.grace_period_s is not None:
            body["gracePeriodSeconds"] = write.grace_period_s
        if write.uid:
            body["preconditions"] = {"uid": write.uid}
        log.info("%s: delete %s %s: %s", namespace, write.kind, write.name, write.reason)
        getattr(self._core, f"delete_namespaced_{_PLURALS[write.kind]}")(
            write.name, namespace, body=body, _preload_content=False
        )

    def _resize(self, job: Mapping[str, Any], write: ResizeJob, observed: Observed) -> None:
        if observed.master_pod is None or observed.secret is None:
            raise DLRoverError("no running master to resize")
        address = self._master_address(job, observed.master_pod, observed.secret)
        meta = job["metadata"]
        message = self._masters.resize(address, write.target, write.reason)
        log.info("%s/%s: resized to %d: %s", meta["namespace"], meta["name"], write.target, message)
        with self._lock:
            view = self._views.get(f"{meta['namespace']}/{meta['name']}")
            if view is not None:
                view.polled_at = None  # ask again at once: the resize changed what it says

    def _write_status(self, job: Mapping[str, Any], answer: Reconciliation) -> None:
        meta = job["metadata"]
        body = {
            "apiVersion": job.get("apiVersion"),
            "kind": job.get("kind"),
            "metadata": {
                "name": meta["name"],
                "namespace": meta["namespace"],
                "resourceVersion": meta.get("resourceVersion"),
            },
            "status": dict(answer.status),
        }
        try:
            self._custom.replace_namespaced_custom_object_status(
                CRD_GROUP, CRD_VERSION, meta["namespace"], CRD_PLURAL, meta["name"], body, _preload_content=False
            )
        except self._api_exception as exc:
            if exc.status not in (404, 409):
                raise
            # 409: the job changed since it was read (its event queues it again); 404: it is gone.
