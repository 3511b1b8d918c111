"""The Kubernetes backend: each node is a worker pod the master creates, watches and deletes.

The backend keeps a cache of the job's worker pods fed by one list + watch (selector: the job's
worker labels; see `dlrover.master.kube.watch`): `observe()` reads the cache and sends no request,
so a tick costs nothing however many pods there are. `launch` creates a pod (`manifest.worker_pod`),
`stop` deletes it with the configured grace; a create or delete answered 429, 5xx or cut is retried
a few times after the watch's backoff. Observations follow `observe.observe_pod`, with one difference for a
parameter-server job's tasks (`tf_tasks`): a pod the master stopped is RUNNING until it has ended (STOPPED then),
as a local process is, because its task's next pod takes over its DNS name.

A restarted master adopts the pods its predecessor created: they are in the first list, and
`observe()` reports every worker pod of the job by its node-id label. A launch whose pod already
exists (created by the predecessor just before it died) adopts it rather than fail. The master tells
it which nodes its journal holds alive (`adopt`): one with no pod in the first list (deleted while no
master watched) is reported at once as a disruption (`Deleted`), relaunched without charge.

`close()` deletes every pod still pending or running that this backend launched or adopted (the
job ended, or the master was stopped). A master killed outright leaves them running for the next
master; the ElasticJob's deletion removes them through their ownerReference.
"""

from __future__ import annotations

import functools
import json
import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import attrs

from dlrover.common import Clock, ConfigError, SystemClock
from dlrover.master.kube import EventType, ListWatch, Watcher, WatchEvent, load_api_client, names
from dlrover.master.kube.times import epoch_seconds
from dlrover.master.kube.watch import Backoff
from dlrover.master.scheduler.base import (
    REASON_DELETED,
    REASON_QUOTA_EXCEEDED,
    BackendUnavailableError,
    NodeRejectedError,
    NodeSpec,
    ObservedNode,
    ObservedState,
    SchedulerError,
)
from dlrover.master.scheduler.kubernetes.manifest import pod_name, worker_pod
from dlrover.master.scheduler.kubernetes.observe import observe_deleted_pod, observe_pod
from dlrover.master.scheduler.kubernetes.settings import KubernetesSettings, WorkerTemplate

__all__ = [
    "KILL_GRACE_S",
    "VERBS_ADMITTED",
    "VERBS_USED",
    "VERBS_USED_BY_TF_TASKS",
    "KubernetesScheduler",
    "read_worker_template",
]

KILL_GRACE_S = 1
"""The grace of `KubernetesScheduler.kill` for a parameter-server job's task (see there)."""

_log = logging.getLogger(__name__)

_RETRIED_STATUSES = frozenset({429, 500, 502, 503, 504})

VERBS_USED: frozenset[tuple[str, str, str]] = frozenset(
    {
        ("", "pods", "list"),
        ("", "pods", "watch"),
        ("", "pods", "create"),
        ("", "pods", "delete"),
        (names.CRD_GROUP, names.CRD_PLURAL, "get"),
    }
)
"""Every (API group, resource, verb) the backend calls, all in the job's namespace: what the master's Role
must grant it (the tests compare it with the requests the test API server recorded)."""

VERBS_USED_BY_TF_TASKS: frozenset[tuple[str, str, str]] = VERBS_USED | {("", "services", "create"),
                                                                        ("", "services", "get")}  # fmt: skip
"""What the backend of a parameter-server job (`tf_tasks`) calls: also the create of its task Service, and the
read that checks one already there is the job's."""

VERBS_ADMITTED: frozenset[tuple[str, str, str]] = frozenset(
    {(names.CRD_GROUP, f"{names.CRD_PLURAL}/finalizers", "update")}
)
"""What the master's Role must also grant though no request of it uses it: its pods' owner references set
`blockOwnerDeletion`, which a cluster with the OwnerReferencesPermissionEnforcement admission plugin (OpenShift,
hardened clusters) allows only to a subject that may update the owner's finalizers."""


def read_worker_template(
    custom_api: Any, settings: KubernetesSettings, *, sleep: Callable[[float], None] | None = None
) -> WorkerTemplate:
    """Read the ElasticJob `settings.namespace/settings.job`: its worker template, uid and checkpoint volume.

    They come from the spec in force (`status.appliedSpec`, `names.APPLIED_SPEC_STATUS`) where the operator
    keeps one, else from `spec`.

    A read answered 429 or 5xx, one refused 403 (a Role the operator has just created may take a moment to
    reach every API server), or a broken connection is retried `settings.request_retries` times with the
    watch's backoff: a master replacing another must not fail its job for a passing hiccup.

    Args:
        custom_api: a `kubernetes.client.CustomObjectsApi`.
        settings: names the job.
        sleep: waits between attempts (tests inject one); a real wait by default.

    Raises:
        BackendUnavailableError: the read kept failing for a passing reason (a `ConfigError` too).
        ConfigError: the job cannot be read (404, ...), or has no worker template; the message says which.
    """
    from kubernetes.client.exceptions import ApiException  # lazy: the k8s extra
    from urllib3.exceptions import HTTPError

    where = f"ElasticJob {settings.namespace}/{settings.job}"
    watch = settings.watch
    backoff = Backoff(watch.backoff_initial_s, watch.backoff_max_s, watch.backoff_multiplier)
    attempts = settings.request_retries + 1
    timeout = watch.request_timeout_s
    for attempt in range(1, attempts + 1):
        try:
            job = custom_api.get_namespaced_custom_object(
                names.CRD_GROUP,
                names.CRD_VERSION,
                settings.namespace,
                names.CRD_PLURAL,
                settings.job,
                _request_timeout=(timeout, timeout),
            )
            break
        except ApiException as exc:
            passing = exc.status in _RETRIED_STATUSES | {403}
            if not passing:
                raise ConfigError(f"cannot read the {where}: {exc.status} {exc.reason}") from exc
            if attempt == attempts:
                raise BackendUnavailableError(
                    f"cannot read the {where} (after {attempts} attempts): {exc.status} {exc.reason}"
                ) from exc
            problem = f"{exc.status} {exc.reason}"
        except (HTTPError, OSError) as exc:
            if attempt == attempts:
                raise BackendUnavailableError(f"cannot read the {where} (after {attempts} attempts): {exc}") from exc
            problem = str(exc)
        delay = backoff.next_delay()
        _log.warning("reading the %s failed (%s, attempt %d of %d); retrying in %.2f s", where, problem, attempt,
                     attempts, delay)  # fmt: skip
        (sleep or threading.Event().wait)(delay)
    # The spec in force where the operator keeps one: an edit it refused is not carried out by this master.
    in_force = (job.get("status") or {}).get(names.APPLIED_SPEC_STATUS)
    spec = in_force if isinstance(in_force, Mapping) else job.get("spec") or {}
    replicas = spec.get("replicaSpecs") or {}
    template = (replicas.get("worker") or {}).get("template")
    if not isinstance(template, Mapping):
        raise ConfigError(f"the {where} has no spec.replicaSpecs.worker.template")
    roles = {}
    for role, replica in replicas.items():
        if role == "worker":
            continue
        other = (replica or {}).get("template") if isinstance(replica, Mapping) else None
        if not isinstance(other, Mapping):
            raise ConfigError(f"the {where} has no spec.replicaSpecs.{role}.template")
        roles[str(role)] = other
    volume = (spec.get("checkpoint") or {}).get("volume")
    return WorkerTemplate(
        template=template,
        job_uid=str((job.get("metadata") or {}).get("uid") or ""),
        checkpoint_volume=volume if isinstance(volume, Mapping) else None,
        roles=roles,
    )


@attrs.define
class _Node:
    pod_name: str
    stop_requested: bool = False
    deleting: bool = False  # a delete was sent (or is to be retried: `delete_failed`)
    delete_failed: bool = False
    seen: bool = False  # the watch has shown its pod at least once
    last: Mapping[str, Any] | None = None
    missing: bool = False  # adopted from the journal with no pod in the first list
    refused: str = ""  # the API server's message while a ResourceQuota refuses the create (retried)
    create_failed: str = ""  # why a retried create failed for another reason
    manifest: Mapping[str, Any] | None = None  # what to create again while refused
    grace_s: int = 0  # the grace of the delete sent (stop: the settings'; kill: KILL_GRACE_S for PS jobs, else 0)


class KubernetesScheduler:
    """Worker pods of one ElasticJob.

    Args:
        api_client: a `kubernetes.client.ApiClient`.
        settings: namespace, job, timeouts.
        worker: the template and uid read from the ElasticJob (`read_worker_template`).
        clock: for the watch's stream timing (default: the system clock).
        sleep: waits between retries (default: real waits; tests inject one).
        owns_client: close `api_client` in `close()`.

    Raises:
        BackendUnavailableError: the first list of the job's pods did not come within `settings.sync_timeout_s`.
    """

    name = "kubernetes"
    relaunches_nodes = True

    def __init__(
        self,
        api_client: Any,
        settings: KubernetesSettings,
        worker: WorkerTemplate,
        *,
        clock: Clock | None = None,
        sleep: Callable[[float], None] | None = None,
        owns_client: bool = False,
    ) -> None:
        from kubernetes import client  # lazy: the k8s extra

        self._settings = settings
        self._worker = worker
        self._clock = clock or SystemClock()
        self._api_client = api_client
        self._owns_client = owns_client
        self._core: Any = client.CoreV1Api(api_client)
        # (connect, read) of a create or delete: a hung API server must not hold the master's lock for long.
        self._timeout = (settings.watch.request_timeout_s, settings.watch.request_timeout_s)
        self._sleep = sleep
        self._lock = threading.Condition()
        self._nodes: dict[int, _Node] = {}
        self._pods: dict[str, Mapping[str, Any]] = {}  # by pod name: the cache the watch feeds
        self._deleted: dict[str, Mapping[str, Any]] = {}  # pods the watch saw go, as last seen
        self._closed = False
        self._listeners: list[Callable[[], None]] = []
        # Pods a restarted watcher's first list has shown so far (None: no relist under way): those it
        # did not show by its SYNCED went while no watch ran (see `_restart_dead_watcher`).
        self._relisted: set[str] | None = None
        self._watcher = self._start_watcher()
        if not self._watcher.wait_synced(settings.sync_timeout_s):
            self._watcher.stop()
            error = self._watcher.error
            raise BackendUnavailableError(
                f"could not list the worker pods of {settings.namespace}/{settings.job} within "
                f"{settings.sync_timeout_s:g} s" + (f": {error}" if error else "")
            )
        if settings.tf_tasks:
            try:
                self._create_task_service()
            except BaseException as exc:
                self._watcher.stop()
                if isinstance(exc, SchedulerError) and not isinstance(exc, BackendUnavailableError):
                    raise BackendUnavailableError(f"cannot give the job's tasks their DNS names: {exc}") from exc
                raise

    def _create_task_service(self) -> None:
        """The headless Service `<job>-tasks` under which every task pod has its DNS name (kept if it exists).

        It publishes a pod's address before the pod is ready: a task's peers dial it as soon as it listens, and
        TensorFlow's servers have no readiness probe to wait for."""
        job = self._settings.job
        metadata: dict[str, Any] = {"name": names.task_service_name(job), "labels": names.job_labels(job, "tasks")}
        if self._worker.job_uid:
            metadata["ownerReferences"] = [{"apiVersion": names.api_version(), "kind": names.CRD_KIND, "name": job,
                                            "uid": self._worker.job_uid, "controller": True,
                                            "blockOwnerDeletion": True}]  # fmt: skip
        selector = {names.JOB_LABEL: job, names.COMPONENT_LABEL: names.COMPONENT_WORKER}
        service = {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": metadata,
            "spec": {"clusterIP": "None", "publishNotReadyAddresses": True, "selector": selector},
        }
        name = str(metadata["name"])
        self._request(f"create service {name}", lambda: self._core.create_namespaced_service(
            self._settings.namespace, service, _preload_content=False, _request_timeout=self._timeout
        ), ok_statuses=(409,))  # fmt: skip
        # It may have been there (409): a predecessor's is this job's; anything else would misdirect the tasks.
        found = self._read_service(name)
        spec, owners = found.get("spec") or {}, (found.get("metadata") or {}).get("ownerReferences") or []
        if spec.get("clusterIP") != "None" or spec.get("selector") != selector:
            raise ConfigError(f"a Service {name} exists that is not this job's headless task Service (clusterIP "
                              f"{spec.get('clusterIP')!r}, selector {spec.get('selector')!r}): delete it")  # fmt: skip
        uids = {str(o.get("uid")) for o in owners if o.get("kind") == names.CRD_KIND}
        if self._worker.job_uid and uids and self._worker.job_uid not in uids:
            raise BackendUnavailableError(f"the Service {name} of an earlier ElasticJob of this name is still there "
                                          "(its deletion pending): start again later")  # fmt: skip

    def _read_service(self, name: str) -> Mapping[str, Any]:
        from kubernetes.client.exceptions import ApiException  # lazy: the k8s extra
        from urllib3.exceptions import HTTPError

        try:
            response = self._core.read_namespaced_service(
                name, self._settings.namespace, _preload_content=False, _request_timeout=self._timeout
            )
            return dict(json.loads(response.data))
        except ApiException as exc:
            raise SchedulerError(f"read service {name}: {exc.status} {exc.reason}: {_message(exc)}") from exc
        except (HTTPError, OSError, ValueError) as exc:
            raise SchedulerError(f"read service {name}: {exc}") from exc

    def task_host(self, role: str, index: int) -> str:
        """The DNS name of task `role:index` of a parameter-server job (`KubernetesSettings.tf_tasks`):
        `<job>-<role>-<index>.<job>-tasks.<namespace>.svc`, the same for every pod of the task.

        Raises:
            ConfigError: the backend does not run a parameter-server job, or the name is too long.
        """
        settings = self._settings
        if not settings.tf_tasks:
            raise ConfigError("task DNS names are given only to a parameter-server job's pods (tf_tasks)")
        try:
            hostname = names.task_hostname(settings.job, role, index)
        except ValueError as exc:
            raise ConfigError(str(exc)) from None
        return f"{hostname}.{names.task_service_name(settings.job)}.{settings.namespace}.svc"

    @classmethod
    def from_cluster(
        cls, settings: KubernetesSettings, *, clock: Clock | None = None, environ: dict[str, str] | None = None
    ) -> KubernetesScheduler:
        """Connect (in-cluster config or `settings.kubeconfig`), read the ElasticJob and start watching.

        Raises:
            ConfigError: no cluster configuration, or the ElasticJob cannot be read.
            SchedulerError: the job's pods cannot be listed.
        """
        from kubernetes import client  # lazy: the k8s extra

        api = load_api_client(settings.kubeconfig, environ=environ)
        try:
            worker = read_worker_template(client.CustomObjectsApi(api), settings)
            return cls(api, settings, worker, clock=clock, owns_client=True)
        except BaseException:
            api.close()
            raise

    # ---------------------------------------------------------------- the cache

    @property
    def templates(self) -> WorkerTemplate:
        """The pod templates read from the ElasticJob."""
        return self._worker

    @property
    def list_watch(self) -> ListWatch:
        """The pod watch (its `stats` show resumes and relists)."""
        return self._list_watch

    def _start_watcher(self) -> Watcher:
        settings = self._settings
        lister = functools.partial(
            self._core.list_namespaced_pod, settings.namespace, label_selector=names.worker_selector(settings.job)
        )
        self._list_watch = ListWatch(
            lister,
            settings=settings.watch,
            clock=self._clock,
            sleep=self._sleep,
            name=f"worker pods of {settings.namespace}/{settings.job}",
        )
        return Watcher(self._list_watch, self._on_event, name=f"kube-pods-{settings.job}").start()

    def _restart_dead_watcher(self) -> None:
        """A watch whose thread ended (its handler failed) serves a frozen cache, and pod deaths would be
        seen only by the master's timeouts: start another, whose first list replaces the cache (a pod
        it does not show went while no watch ran: deleted)."""
        with self._lock:
            if self._closed or self._watcher.running:
                return
            error = self._watcher.error
            self._relisted = set()
        _log.error("the watch of the worker pods ended (%s): watching them again from a fresh list", error)
        self._watcher = self._start_watcher()

    def _on_event(self, event: WatchEvent) -> None:
        if event.type is EventType.SYNCED:
            with self._lock:
                relisted, self._relisted = self._relisted, None
                for name in [n for n in self._pods if relisted is not None and n not in relisted]:
                    self._deleted[name] = self._pods.pop(name)
                self._lock.notify_all()
            return
        name = str((event.object.get("metadata") or {}).get("name") or "")
        with self._lock:
            if self._relisted is not None:
                self._relisted.add(name)
            if event.type is EventType.DELETED:
                self._pods.pop(name, None)
                self._deleted[name] = event.object
            else:
                self._pods[name] = event.object
                self._deleted.pop(name, None)
            self._lock.notify_all()
            listeners = tuple(self._listeners)
        for listener in listeners:
            listener()

    def on_change(self, listener: Callable[[], None]) -> None:
        """Call `listener` after every pod event the watch delivers (see `ReportsChanges`)."""
        with self._lock:
            self._listeners.append(listener)

    def wait_for(self, predicate: Callable[[Mapping[int, ObservedNode]], bool], timeout_s: float) -> bool:
        """Wait until `predicate(self.observe())` holds (re-checked at every pod event); True if it did."""
        with self._lock:
            return self._lock.wait_for(lambda: predicate(self._observe_locked()), timeout_s)

    # ---------------------------------------------------------------- the Protocol

    def capacity(self) -> int | None:
        """Unknown (None): the cluster's scheduler decides; a pod that does not fit stays pending."""
        return None

    def launch(self, spec: NodeSpec) -> None:
        """Create the node's pod.

        A create refused for a ResourceQuota (403, "exceeded quota") is not an error: the node is observed
        PENDING with reason `QuotaExceeded` and the API's message as evidence, and the create is sent again at
        each `observe()`.

        Raises:
            NodeRejectedError: the API server found the pod invalid (422): its message says why.
            SchedulerError: the node was launched before, the backend is closed, or the API server refused
                the pod (or kept failing past `request_retries`).
        """
        with self._lock:
            if self._closed:
                raise SchedulerError(f"cannot launch node {spec.node_id}: the Kubernetes backend is closed")
            if spec.node_id in self._nodes:
                raise SchedulerError(f"node {spec.node_id} was already launched")
            try:
                manifest = worker_pod(spec, self._settings, self._worker)
            except ConfigError as exc:  # the same at every try (the master's address, a task's name)
                raise NodeRejectedError(f"cannot launch node {spec.node_id}: {exc}") from exc
            pod = pod_name(spec, self._settings)
            self._nodes[spec.node_id] = _Node(pod)
        try:
            self._create(pod, manifest)
        except SchedulerError as exc:
            refusal = _quota_refusal(exc)
            with self._lock:
                if refusal:
                    # Not the node's failure: it waits (pending, the API's message as evidence) and the create
                    # is sent again at each observation, until the quota has room or the pending timeout decides.
                    node = self._nodes[spec.node_id]
                    node.refused, node.manifest = refusal, manifest
                else:
                    del self._nodes[spec.node_id]
            if refusal:
                _log.warning("node %d waits: %s", spec.node_id, exc)
                return
            if _status_of(exc) == 422:
                raise NodeRejectedError(f"the API server refused node {spec.node_id}'s pod: {exc}") from exc
            raise

    def _create(self, pod_name: str, manifest: Mapping[str, Any]) -> None:
        self._request(f"create pod {pod_name}", lambda: self._core.create_namespaced_pod(
            self._settings.namespace, manifest, _preload_content=False, _request_timeout=self._timeout
        ), ok_statuses=(409,))  # fmt: skip

    def _retry_create(self, node: _Node) -> None:
        """Send the create of a node a ResourceQuota refused again."""
        assert node.manifest is not None
        try:
            self._create(node.pod_name, node.manifest)
        except SchedulerError as exc:
            refusal = _quota_refusal(exc)
            with self._lock:
                node.refused = refusal
                node.create_failed = "" if refusal else str(exc)
            return
        with self._lock:
            node.refused = ""

    def stop(self, node_id: int) -> None:
        """Delete the node's pod (its processes get SIGTERM, then SIGKILL after the grace). Idempotent; an
        unknown node is a no-op. A delete that fails is retried at the next `observe()`."""
        self._stop(node_id, self._settings.pod_deletion_grace_s)

    def kill(self, node_id: int) -> None:
        """Delete the node's pod with the least grace: for a node with nothing worth saving (a parameter-server
        job's chief whose server, and with it the variables, is gone). A pod already being deleted with a longer
        grace is deleted again with this one. Idempotent; an unknown node is a no-op.

        A parameter-server job's task gets 1 s (`KILL_GRACE_S`, never more than `pod_deletion_grace_s`), not none:
        a pod deleted with no grace leaves the API at once while its kubelet stops its processes after, so the
        master would count the task as ended, and start its next incarnation, while the old one still runs; the
        API keeps a pod deleted with a grace until its kubelet confirms its containers ended. A chief restarted
        for a lost parameter server so starts only once the old chief is gone (two coordinators would share the
        workers, and where pods share the host's network the new one could not listen at its address)."""
        grace = min(KILL_GRACE_S, self._settings.pod_deletion_grace_s) if self._settings.tf_tasks else 0
        self._stop(node_id, grace)

    def _stop(self, node_id: int, grace_s: int) -> None:
        with self._lock:
            node = self._nodes.get(node_id) or self._adopt_locked(node_id)
            if node is None or (node.stop_requested and node.grace_s <= grace_s):
                return
            node.stop_requested = True
            node.deleting = True
            node.grace_s = grace_s
        self._delete(node)

    def adopt(self, node_ids: Iterable[int]) -> None:
        """Take over the nodes a previous master's journal holds alive (see `AdoptsNodes`).

        The constructor waited for the first list of the job's pods, so a node whose pod is not in the
        cache now had none when this master started (a pod deleted, by a person or the garbage collector,
        while no master watched): it is reported FAILED, `Deleted`, a disruption, at the next `observe()`.
        """
        with self._lock:
            for node_id in node_ids:
                if node_id in self._nodes:
                    continue
                pod_name = names.worker_pod_name(self._settings.job, node_id)
                if pod_name in self._pods or pod_name in self._deleted:
                    self._nodes[node_id] = _Node(pod_name, seen=True, last=self._deleted.get(pod_name))
                else:
                    self._nodes[node_id] = _Node(pod_name, seen=True, missing=True)
            self._lock.notify_all()

    def _adopt_locked(self, node_id: int) -> _Node | None:
        """A pod of this node from a previous master, taken on so it can be stopped."""
        found = next((name for name, pod in self._pods.items() if _node_id(pod) == node_id), None)
        if found is None:
            return None
        node = _Node(found, seen=True)
        self._nodes[node_id] = node
        return node

    def _delete(self, node: _Node) -> None:
        grace = node.grace_s
        try:
            self._request(
                f"delete pod {node.pod_name}",
                lambda: self._core.delete_namespaced_pod(
                    node.pod_name,
                    self._settings.namespace,
                    grace_period_seconds=grace,
                    _preload_content=False,
                    _request_timeout=self._timeout,
                ),
                ok_statuses=(404,),
            )
        except SchedulerError as exc:
            _log.error("%s; retried at the next observation", exc)
            with self._lock:
                node.delete_failed = True
            return
        with self._lock:
            node.delete_failed = False

    def observe(self) -> Mapping[int, ObservedNode]:
        """Every worker pod of the job (launched here or by a previous master), from the watch's cache."""
        self._restart_dead_watcher()
        with self._lock:
            retry = [n for n in self._nodes.values() if n.delete_failed]
            refused = [n for n in self._nodes.values() if n.refused and not n.stop_requested]
            lost = [n for n in self._nodes.values() if self._settings.tf_tasks and n.stop_requested and n.grace_s > 0
                    and (pod := self._pods.get(n.pod_name)) is not None and _live(pod) and self._lost(pod)]  # fmt: skip
            for node in lost:
                # Its node is lost and will not confirm the deletion: deleted with no grace, so that the task's DNS
                # name (its next pod's) no longer has it among its addresses.
                node.grace_s = 0
        for node in retry + lost:
            self._delete(node)
        for node in refused:
            self._retry_create(node)
        with self._lock:
            return self._observe_locked()

    def _observe_locked(self) -> dict[int, ObservedNode]:
        seen: dict[int, ObservedNode] = {}
        for cached in self._pods.values():
            adopted = _node_id(cached)
            if adopted is not None and adopted not in self._nodes:
                seen[adopted] = observe_pod(adopted, cached)
        for node_id, node in self._nodes.items():
            pod = self._pods.get(node.pod_name)
            if pod is not None:
                node.seen, node.last = True, pod
                if node.stop_requested and self._settings.tf_tasks and _live(pod) and not self._lost(pod):
                    # A TensorFlow task keeps its DNS name until its pod has ended: the task's next pod must not
                    # start beside it (its peers could reach the old one), nor a new chief beside the old one.
                    host = str((pod.get("spec") or {}).get("nodeName") or "")
                    seen[node_id] = ObservedNode(node_id, ObservedState.RUNNING, None, host)
                    continue
                seen[node_id] = observe_pod(node_id, pod, stop_requested=node.stop_requested)
            elif node.missing and node.pod_name not in self._deleted and not node.stop_requested:
                seen[node_id] = _missing_at_adoption(node_id, node.pod_name)
            elif node.pod_name in self._deleted or node.seen:
                last = self._deleted.get(node.pod_name, node.last)
                seen[node_id] = observe_deleted_pod(node_id, last, stop_requested=node.stop_requested)
            elif node.stop_requested:
                seen[node_id] = ObservedNode(node_id, ObservedState.STOPPED)
            elif node.create_failed:
                evidence = f"Kubernetes: creating the pod {node.pod_name} failed: {node.create_failed}"
                seen[node_id] = ObservedNode(node_id, ObservedState.FAILED, None, "", "CreateFailed", evidence)
            elif node.refused:
                evidence = f"Kubernetes: the pod {node.pod_name} cannot be created yet: {node.refused}"
                seen[node_id] = ObservedNode(node_id, ObservedState.PENDING, None, "", REASON_QUOTA_EXCEEDED, evidence)
            else:
                seen[node_id] = ObservedNode(node_id, ObservedState.PENDING)  # created, not yet shown by the watch
        return seen

    def _lost(self, pod: Mapping[str, Any]) -> bool:
        """Whether a pod being deleted is past its grace by `lost_pod_margin_s`: its node does not confirm the
        deletion (it is lost), so nothing of it answers any more and its task may start elsewhere."""
        deadline = epoch_seconds((pod.get("metadata") or {}).get("deletionTimestamp"))
        return deadline is not None and self._clock.wall_time() > deadline + self._settings.lost_pod_margin_s

    def _may_run(self, node: _Node) -> bool:
        """Whether the node's pod may still run processes: pending or running, or created and not yet seen."""
        pod = self._pods.get(node.pod_name)
        if pod is None:
            return not node.seen and node.pod_name not in self._deleted
        return _live(pod)

    def placed_host(self, node_id: int) -> str:
        """The node its pod was bound to (`spec.nodeName`); "" before it is scheduled (see `NodePlacement`)."""
        with self._lock:
            node = self._nodes.get(node_id)
            pod = self._pods.get(node.pod_name if node is not None else names.worker_pod_name(self._settings.job,
                                                                                              node_id))  # fmt: skip
            return str(((pod or {}).get("spec") or {}).get("nodeName") or "")

    def detach(self) -> None:
        """Stop watching and release the client, deleting nothing: the pods keep running for the master that
        replaces this one (see `HandsOverNodes`). `close()` after it does nothing."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._release()

    def _release(self) -> None:
        try:
            self._watcher.stop(timeout_s=max(self._settings.watch.request_timeout_s, 10.0))
        except TimeoutError as exc:
            _log.error("%s", exc)
        if self._owns_client:
            self._api_client.close()

    def close(self) -> None:
        """Delete every pod of the job still pending or running, stop watching, release the client.
        Safe to call twice."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            for pod in self._pods.values():
                node_id = _node_id(pod)
                if node_id is not None and node_id not in self._nodes:
                    self._adopt_locked(node_id)
            to_delete = [node for node in self._nodes.values() if self._may_run(node)]
            for node in self._nodes.values():
                if not node.stop_requested:
                    node.grace_s = self._settings.pod_deletion_grace_s
                node.stop_requested = True
        for node in to_delete:
            self._delete(node)
        self._release()

    # ---------------------------------------------------------------- requests

    def _request(self, what: str, call: Callable[[], Any], *, ok_statuses: tuple[int, ...] = ()) -> None:
        """Send one write; retried on 429, 5xx and broken connections, `request_retries` times.

        Raises:
            SchedulerError: refused, or still failing after the retries.
        """
        from kubernetes.client.exceptions import ApiException  # lazy: the k8s extra
        from urllib3.exceptions import HTTPError

        watch = self._settings.watch
        backoff = Backoff(watch.backoff_initial_s, watch.backoff_max_s, watch.backoff_multiplier)
        attempts = self._settings.request_retries + 1
        for attempt in range(1, attempts + 1):
            try:
                response = call()
            except ApiException as exc:
                if exc.status in ok_statuses:
                    return
                if exc.status not in _RETRIED_STATUSES or attempt == attempts:
                    raise SchedulerError(f"{what}: {exc.status} {exc.reason}: {_message(exc)}") from exc
                problem = f"{exc.status} {exc.reason}"
            except (HTTPError, OSError) as exc:
                if attempt == attempts:
                    raise SchedulerError(f"{what}: {exc}") from exc
                problem = str(exc)
            else:
                # Read the answer whole: a connection returned with an unread body would hand it to the next
                # request as its status line.
                _ = response.data
                response.release_conn()
                return
            delay = backoff.next_delay()
            _log.warning(
                "%s failed (%s, attempt %d of %d); retrying in %.2f s", what, problem, attempt, attempts, delay
            )
            if self._sleep is not None:
                self._sleep(delay)
            else:
                threading.Event().wait(delay)


def _missing_at_adoption(node_id: int, pod_name: str) -> ObservedNode:
    """A node the journal holds alive whose pod the master found gone when it resumed the job."""
    evidence = (
        f"Kubernetes: the pod {pod_name} of node {node_id} was gone when the master resumed the job (its journal "
        f"holds the node alive; the first list of the job's pods has no such pod): deleted while no master watched"
    )
    return ObservedNode(node_id, ObservedState.FAILED, None, "", REASON_DELETED, evidence, True)


def _status_of(exc: BaseException) -> int | None:
    """The HTTP status of the API error behind a `SchedulerError` (None: not an answered request)."""
    status = getattr(exc.__cause__, "status", None)
    return status if isinstance(status, int) else None


def _quota_refusal(exc: BaseException) -> str:
    """The API's message when a create was refused for a ResourceQuota (403 "exceeded quota"); "" otherwise."""
    if _status_of(exc) != 403:
        return ""
    message = _message(exc.__cause__)
    return message if "exceeded quota" in message else ""


def _live(pod: Mapping[str, Any]) -> bool:
    """Whether a pod may still run processes (pending or running)."""
    return (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed")


def _node_id(pod: Mapping[str, Any]) -> int | None:
    value = ((pod.get("metadata") or {}).get("labels") or {}).get(names.NODE_ID_LABEL)
    return int(value) if isinstance(value, str) and value.isdecimal() else None


def _message(exc: Any) -> str:
    body = getattr(exc, "body", None)
    if not body:
        return ""
    try:
        return str(json.loads(body).get("message", ""))[:500]
    except (ValueError, AttributeError):
        return str(body)[:500]
