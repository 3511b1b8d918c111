"""The test kubelet: simulated nodes, a scheduler, and pods run as local processes.

It is part of the test server, so it works on the `Store` in-process: it lists and watches pods,
nodes, secrets, configmaps and services there (relisting after a 410, as an informer does) and
writes through it, never over HTTP. That keeps its own traffic out of `ApiServer.requests()` (a
test comparing a component's verbs with its Role sees only the component's requests) and out of
the reach of injected HTTP faults, which are meant for the code under test.

One loop thread owns every piece of state; the watch threads and one waiter thread per process
only feed it a queue, and the fault methods run on it (`_call`). Decisions are the pure modules'
(`scheduling`, `podenv`, `podstatus`); this module applies them to processes, directories, cgroups
and the store. See testsupport/README.md for the simulation rules and what differs from a real
kubelet.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import copy
import dataclasses
import heapq
import itertools
import json
import logging
import math
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from . import processes
from .errors import ApiError
from .events import pod_reference, write_event
from .informer import Informer
from .podenv import (
    LocalVolume,
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
from .podstatus import (
    ContainerRecord,
    container_status,
    exit_code_of,
    exit_reason,
    merge_conditions,
    pod_phase,
    qos_class,
    rfc3339,
)
from .quantity import QuantityError, parse_quantity
from .scheduling import NodeView, plan
from .simnodes import SimNode, register_node, set_node_ready
from .store import Store, WatchEvent

if TYPE_CHECKING:  # imported when a kubelet starts: the API server alone needs no master code
    from dlrover.master.scheduler.cgroups import MemoryGroup, MemoryGroups

__all__ = ["Kubelet"]

_log = logging.getLogger(__name__)
_TERMINAL = ("Succeeded", "Failed")
_DEFAULT_SCHEDULER = "default-scheduler"
_MIB = 1024 * 1024
Obj = dict[str, Any]
Key = tuple[str, str]
T = TypeVar("T")
_LOST_CONDITION = ("DeletionByTaintManager", "Taint manager: deleting due to NoExecute taint")


class _Stale(Exception):
    """The pod a write was meant for is gone or was replaced (another uid)."""


@dataclasses.dataclass
class _Proc:
    """One started container process."""

    popen: subprocess.Popen[bytes]
    group: MemoryGroup | None
    generation: int
    waiter: threading.Thread


@dataclasses.dataclass
class _PodRun:
    """The kubelet's record of a pod it accepted on one of its nodes."""

    uid: str
    namespace: str
    name: str
    node: str
    ip: str
    host_ip: str
    restart_policy: str
    directory: Path
    log_dir: Path
    records: list[ContainerRecord]
    procs: dict[int, _Proc] = dataclasses.field(default_factory=dict)
    groups: list[MemoryGroup] = dataclasses.field(default_factory=list)  # not yet removed
    volumes: dict[str, LocalVolume] = dataclasses.field(default_factory=dict)
    started: bool = False
    started_at: str | None = None
    waiting: bool = False  # could not start yet (NotReadyYet); retried when objects change
    terminating: bool = False  # being stopped: no restart
    kill_at: float | None = None  # monotonic deadline of the SIGKILL
    final: bool = False  # the final status is written (or the pod failed before starting)
    deleting: bool = False  # the pod has a deletionTimestamp: delete it once every process is gone
    gone: bool = False  # the pod is no longer in the store
    disruption: tuple[str, str, str, str] | None = None  # (pod reason, message, condition reason, condition msg)
    backoff_s: float = 0.0

    @property
    def alive(self) -> bool:
        return bool(self.procs)


class Kubelet:
    """Simulated nodes on this host, a scheduler binding pending pods to them, and a kubelet
    running each bound pod's containers as local processes. A context manager.

    Args:
        store: the test API server's store (`ApiServer.store`); create it with
            `Store(graceful_pod_deletion=True)` so a deleted pod's processes get their grace period.
        nodes: the simulated nodes (default: node-0, node-1, node-2, each 4 CPUs and 8Gi).
        root: where pod directories, logs and PVCs live (default: a temporary directory removed
            by `stop`; a given one is kept).
        api_url: the test API server's URL; when given each pod gets a kubeconfig for it in
            `KUBECONFIG` (unless its env sets one), standing in for the service account token.
        memory_groups: where containers' memory cgroups are made (default: `detect_memory_groups`;
            where none can be made, `memory_enforcement` says why and containers run unlimited).
        clock: epoch seconds for the timestamps the kubelet writes.
        restart_backoff_s: the first delay before restarting a container (restartPolicy
            OnFailure/Always); doubled per restart up to `max_restart_backoff_s`.
        max_restart_backoff_s: the longest restart delay.
        node_lost_eviction_s: how long the pods of a lost node stay (Failed, NodeLost) before
            they are deleted, as the taint manager's toleration of the unreachable taint.
        stop_grace_s: how long `stop` waits after SIGTERM before it SIGKILLs what is left.
        call_timeout_s: the longest a fault method waits for the kubelet's loop.
    """

    def __init__(
        self,
        store: Store,
        nodes: Sequence[SimNode] | None = None,
        *,
        root: Path | None = None,
        api_url: str | None = None,
        memory_groups: MemoryGroups | None = None,
        clock: Callable[[], float] = time.time,
        restart_backoff_s: float = 1.0,
        max_restart_backoff_s: float = 10.0,
        node_lost_eviction_s: float = 0.0,
        stop_grace_s: float = 5.0,
        call_timeout_s: float = 60.0,
    ) -> None:
        nodes = list(nodes) if nodes is not None else [SimNode(f"node-{i}") for i in range(3)]
        names = [n.name for n in nodes]
        if not nodes or len(set(names)) != len(names):
            raise ValueError(f"the kubelet needs at least one node and distinct names, got {names}")
        for node in nodes:
            for amount in node.allocatable().values():
                parse_quantity(amount)
        if restart_backoff_s < 0 or max_restart_backoff_s < restart_backoff_s:
            raise ValueError("restart backoffs must satisfy 0 <= restart_backoff_s <= max_restart_backoff_s")
        self.store = store
        self._sim_nodes = {n.name: n for n in nodes}
        self._host_ips = {n.name: f"127.10.{i // 250}.{i % 250 + 1}" for i, n in enumerate(nodes)}
        self._own_root = root is None
        self._root_arg = root
        self.root = Path(root) if root is not None else Path()
        self._api_url = api_url
        self._groups_arg = memory_groups
        self._groups: MemoryGroups | None = None
        self._clock = clock
        self._restart_backoff_s = restart_backoff_s
        self._max_restart_backoff_s = max_restart_backoff_s
        self._node_lost_eviction_s = node_lost_eviction_s
        self._stop_grace_s = stop_grace_s
        self._call_timeout_s = call_timeout_s
        self._queue: queue.Queue[tuple[Any, ...]] = queue.Queue()
        self._informers: list[Informer] = []
        self._loop_thread: threading.Thread | None = None
        self._stopping = False
        # State of the loop thread.
        self._pods: dict[Key, Obj] = {}
        self._nodes: dict[str, Obj] = {}
        self._runs: dict[str, _PodRun] = {}  # by pod uid
        self._retired: list[_PodRun] = []  # cleaned up; kept for their logs
        self._ips: dict[tuple[str, ...], str] = {}
        self._lost: set[str] = set()
        self._unreachable: set[str] = set()  # lost nodes whose pods nothing reports (a subset of _lost)
        self._unschedulable_messages: dict[str, str] = {}  # uid -> message written
        self._timers: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = itertools.count()
        self._generations = itertools.count(1)

    # ----------------------------------------------------------------- lifecycle

    def start(self) -> Kubelet:
        """Register the nodes, start watching and running pods."""
        if self._loop_thread is not None:
            raise RuntimeError("the kubelet is already running")
        self.root = Path(tempfile.mkdtemp(prefix="dlrover-kubelet-")) if self._own_root else Path(self._root_arg or ".")
        self.root.mkdir(parents=True, exist_ok=True)
        if self._groups_arg is not None:
            self._groups = self._groups_arg
        else:
            from dlrover.master.scheduler.cgroups import detect_memory_groups

            self._groups = detect_memory_groups(probe_name=f"dlrover-kubelet-probe-{os.getpid()}-{id(self)}")
        if not self._groups.usable:
            _log.warning("test kubelet: %s; containers run without memory limits", self._groups.describe())
        for node in self._sim_nodes.values():
            register_node(self.store, node, self._host_ips[node.name], self._now())
        self._stopping = False
        for plural in ("pods", "nodes", "secrets", "configmaps", "services"):
            informer = Informer(self.store, plural, self._feeder(plural))
            informer.start()
            self._informers.append(informer)
        self._loop_thread = threading.Thread(target=self._loop, name="kubelet-loop")
        self._loop_thread.start()
        return self

    def _feeder(self, plural: str) -> Callable[[str, Any], None]:
        """What an informer of `plural` calls: it queues (kind, plural, payload) for the loop."""

        def feed(kind: str, payload: Any) -> None:
            self._queue.put((kind, plural, payload))

        return feed

    def stop(self) -> None:
        """Stop every process it started (SIGTERM, SIGKILL after `stop_grace_s`), remove their
        cgroups and directories (the root too when it made it), and join every thread."""
        if self._loop_thread is None:
            return
        self._stopping = True
        for informer in self._informers:
            informer.stop()
        self._informers.clear()
        self._queue.put(("stop",))
        self._loop_thread.join()
        self._loop_thread = None
        if self._own_root:
            shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> Kubelet:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ----------------------------------------------------------------- what tests read

    @property
    def node_names(self) -> list[str]:
        return list(self._sim_nodes)

    def host_ip(self, node: str) -> str:
        """The `status.hostIP` of pods on `node`."""
        return self._host_ips[node]

    @property
    def memory_enforced(self) -> bool:
        """Whether containers' memory limits are enforced by cgroups here."""
        return self._groups is not None and self._groups.usable

    @property
    def memory_enforcement(self) -> str:
        """How memory limits are enforced, or why they are not."""
        return "not started" if self._groups is None else self._groups.describe()

    def pid(self, name: str, namespace: str = "default", container: str | None = None) -> int | None:
        """The process id (and process group id) of a running container of the pod, else None."""
        return self._call(lambda: self._pid(namespace, name, container))

    def processes(self, name: str, namespace: str = "default") -> list[int]:
        """Every live process of the pod's running containers: each main process and its
        descendants (a training process under an agent, say), main processes first.

        Raises:
            KeyError: the kubelet never ran that pod.
        """

        def collect() -> list[int]:
            run = self._find_run(namespace, name)
            mains = [proc.popen.pid for proc in run.procs.values() if proc.popen.returncode is None]
            return mains + [pid for main in mains for pid in processes.descendants(main)]

        return self._call(collect)

    def log_path(self, name: str, namespace: str = "default", container: str | None = None) -> Path:
        """The file a container's stdout and stderr go to (kept until `stop`).

        Raises:
            KeyError: the kubelet never ran that pod.
        """
        return self._call(lambda: self._log_path(namespace, name, container))

    def read_log(self, namespace: str, name: str, container: str | None = None) -> str:
        """A container's log so far (what `GET pods/<name>/log` answers).

        Raises:
            KeyError: the kubelet never ran that pod or container.
        """
        path = self.log_path(name, namespace, container)
        try:
            return path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    # ----------------------------------------------------------------- faults

    def lose_node(self, node: str, *, unreachable: bool = False) -> list[str]:
        """The node stops answering: its pods' processes are SIGKILLed and its Ready condition
        becomes Unknown (with the unreachable taints). Returns the names of the pods lost.

        By default its pods are reported at once as a lost node's pods used to be: phase Failed,
        reason NodeLost and a DisruptionTarget condition, deleted after `node_lost_eviction_s`.

        `unreachable=True` shows what a real cluster shows, where no kubelet is left to report:
        the node lifecycle controller marks its pods `Ready=False` (phase stays Running); after
        `node_lost_eviction_s` (the unreachable taint's tolerationSeconds) the taint manager adds a
        DisruptionTarget condition (DeletionByTaintManager) and deletes them with their grace
        period; with no kubelet to confirm, they stay Terminating until someone force-deletes
        them (grace 0) or the node comes back (`restore_node`)."""
        self._check_node(node)
        return self._call(lambda: self._lose_node(node, unreachable))

    def restore_node(self, node: str) -> None:
        """A lost node is back: Ready again, schedulable (its old pods stay gone; those an
        unreachable node kept are reported Failed/NodeLost, or deleted when being deleted)."""
        self._check_node(node)
        self._call(lambda: self._restore_node(node))

    def evict(self, name: str, namespace: str = "default", *, message: str = "", grace_period_s: float = 0.0) -> None:
        """The kubelet evicts the pod (node pressure): DisruptionTarget (TerminationByKubelet),
        its processes stopped (SIGTERM, SIGKILL after `grace_period_s`), phase Failed with reason
        Evicted; the pod object stays, as a real evicted pod does.

        Raises:
            KeyError: no such pod on the kubelet's nodes.
            ValueError: the pod has finished.
        """
        why = message or "The node was low on resource: memory. "
        self._call(lambda: self._evict(namespace, name, why, grace_period_s))

    def preempt(self, name: str, namespace: str = "default", *, message: str = "") -> None:
        """The scheduler preempts the pod: DisruptionTarget (PreemptionByScheduler), then a
        graceful deletion (its processes get SIGTERM and the pod's termination grace period).

        Raises:
            KeyError: no such pod.
        """
        why = message or f"{_DEFAULT_SCHEDULER}: preempting to accommodate a higher priority pod"
        self._call(lambda: self._preempt(namespace, name, why))

    def kill_process(
        self, name: str, namespace: str = "default", sig: int = signal.SIGKILL, container: str | None = None
    ) -> int:
        """Send `sig` to a running container's main process (not its group); returns its pid.

        Raises:
            KeyError: the container is not running.
            TypeError: `namespace` is not a string (a signal given in its place).
        """
        if not isinstance(namespace, str):
            raise TypeError(f"kill_process(name, namespace, sig): namespace must be a str, not {namespace!r}")

        def kill() -> int:
            pid = self._pid(namespace, name, container)
            if pid is None:
                raise KeyError(f"pod {namespace}/{name} has no running container {container or ''}".rstrip())
            os.kill(pid, sig)
            return pid

        return self._call(kill)

    # ----------------------------------------------------------------- the loop

    def _call(self, fn: Callable[[], T]) -> T:
        if self._loop_thread is None or self._stopping:
            raise RuntimeError("the kubelet is not running")
        future: concurrent.futures.Future[T] = concurrent.futures.Future()
        self._queue.put(("call", fn, future))
        return future.result(timeout=self._call_timeout_s)

    def _check_node(self, node: str) -> None:
        if node not in self._sim_nodes:
            raise KeyError(f"{node!r} is not a node of this kubelet ({sorted(self._sim_nodes)})")

    def _loop(self) -> None:
        stopping = False
        while not stopping:
            timeout = None
            if self._timers:
                timeout = max(0.0, self._timers[0][0] - time.monotonic())
            try:
                items = [self._queue.get(timeout=timeout)]
            except queue.Empty:
                items = []
            while True:
                try:
                    items.append(self._queue.get_nowait())
                except queue.Empty:
                    break
            dirty: set[Key] = set()
            nudged = False
            for item in items:
                try:
                    if item[0] == "stop":
                        stopping = True
                    elif item[0] == "call":
                        self._run_call(item[1], item[2])
                        nudged = True
                    else:
                        nudged |= self._take(item, dirty)
                except Exception:  # the loop must outlive one bad item; the error is logged
                    _log.exception("test kubelet: handling %s failed", item[0])
            self._run_timers()
            if stopping:
                break
            try:
                self._reconcile(dirty, nudged or bool(dirty))
            except Exception:
                _log.exception("test kubelet: reconcile failed")
        self._shutdown()

    @staticmethod
    def _run_call(fn: Callable[[], Any], future: concurrent.futures.Future[Any]) -> None:
        try:
            future.set_result(fn())
        except BaseException as e:  # handed to the caller
            future.set_exception(e)

    def _take(self, item: tuple[Any, ...], dirty: set[Key]) -> bool:
        """Apply one queue item to the caches; True when waiting pods should be retried."""
        kind, plural = item[0], item[1]
        if kind == "exit":
            self._exited(item[1], item[2], item[3], item[4])
        elif plural == "pods":
            self._take_pods(kind, item[2], dirty)
        elif plural == "nodes":
            self._take_nodes(kind, item[2])
        return True

    def _take_pods(self, kind: str, payload: list[Any], dirty: set[Key]) -> None:
        """Update the pod cache from a relist or watch events; a pod that left the store is gone."""
        if kind == "relist":
            listed = {self._key(p): p for p in payload}
            for key in set(self._pods) - set(listed):
                self._pod_gone(self._pods.pop(key))
                dirty.add(key)
            for key, pod in listed.items():
                self._cache_pod(key, pod)
                dirty.add(key)
        else:
            for event in payload:
                key = self._key(event.obj)
                if event.type == "DELETED":
                    current = self._pods.get(key)
                    if current is not None and _uid(current) == _uid(event.obj):
                        self._pods.pop(key)
                        self._pod_gone(event.obj)
                else:
                    self._cache_pod(key, event.obj)
                dirty.add(key)

    def _take_nodes(self, kind: str, payload: list[Any]) -> None:
        events = [WatchEvent("ADDED", n) for n in payload] if kind == "relist" else payload
        if kind == "relist":
            self._nodes.clear()
        for event in events:
            name = event.obj["metadata"]["name"]
            if name not in self._sim_nodes:
                continue
            if event.type == "DELETED":
                self._nodes.pop(name, None)
            else:
                self._nodes[name] = event.obj

    def _cache_pod(self, key: Key, pod: Obj) -> None:
        """Keep the newest version of a pod: the loop's own writes may be ahead of the watch."""
        current = self._pods.get(key)
        if current is not None and _uid(current) == _uid(pod) and _rv(current) >= _rv(pod):
            return
        if current is not None and _uid(current) != _uid(pod):
            self._pod_gone(current)
        self._pods[key] = pod

    @staticmethod
    def _key(pod: Mapping[str, Any]) -> Key:
        meta = pod.get("metadata") or {}
        return (str(meta.get("namespace") or ""), str(meta.get("name") or ""))

    def _after(self, delay_s: float, action: Callable[[], None]) -> None:
        heapq.heappush(self._timers, (time.monotonic() + delay_s, next(self._seq), action))

    def _run_timers(self) -> None:
        now = time.monotonic()
        while self._timers and self._timers[0][0] <= now:
            _, _, action = heapq.heappop(self._timers)
            try:
                action()
            except Exception:
                _log.exception("test kubelet: a timer failed")

    def _reconcile(self, dirty: set[Key], retry_waiting: bool) -> None:
        keys = set(dirty)
        if retry_waiting:
            keys |= {(r.namespace, r.name) for r in self._runs.values() if r.waiting}
        for key in sorted(keys):
            self._sync(key)
        if retry_waiting or dirty:
            self._schedule()

    # ----------------------------------------------------------------- nodes

    def _set_node_ready(self, name: str, ready: bool) -> None:
        node = self._sim_nodes[name]
        self._nodes[name] = set_node_ready(self.store, node, self._host_ips[name], ready=ready, now=self._now())

    def _lose_node(self, node: str, unreachable: bool) -> list[str]:
        self._lost.add(node)
        if unreachable:
            self._unreachable.add(node)
        self._set_node_ready(node, False)
        lost = []
        for key, pod in sorted(self._pods.items()):
            if (pod.get("spec") or {}).get("nodeName") == node and _phase(pod) not in _TERMINAL:
                if unreachable:
                    self._silence_lost(pod)
                else:
                    self._fail_lost(pod)
                lost.append(key[1])
        self._event_node(node, "NodeNotReady", f"Node {node} status is now: NodeNotReady", "Normal")
        return lost

    def _silence_lost(self, pod: Obj) -> None:
        """An unreachable node's pod: its processes die unreported; the node lifecycle controller
        marks it not ready, and the taint manager deletes it (gracefully) after the toleration."""
        run = self._run_of(pod)
        if run is not None:
            # final: their exits are never reported (no kubelet is left to see them).
            run.terminating = run.final = True
            for proc in run.procs.values():
                self._signal(proc, signal.SIGKILL)
        meta = pod["metadata"]
        namespace, name, uid = meta.get("namespace") or "default", meta["name"], _uid(pod)
        not_ready = {"Ready": ("False", "", "")}
        self._patch_status(namespace, name, uid, lambda s: {
            **s, "conditions": merge_conditions(s.get("conditions") or [], not_ready, self._now())
        })  # fmt: skip
        self._after(self._node_lost_eviction_s, lambda: self._taint_evict(namespace, name, uid))

    def _taint_evict(self, namespace: str, name: str, uid: str) -> None:
        """The taint manager's deletion of an unreachable node's pod (its grace period: it stays
        Terminating, since no kubelet on that node confirms it)."""
        pod = self._pods.get((namespace, name))
        if pod is None or _uid(pod) != uid or pod["metadata"].get("deletionTimestamp"):
            return
        if (pod.get("spec") or {}).get("nodeName") not in self._unreachable:
            return  # the node came back first
        target = {"DisruptionTarget": ("True", *_LOST_CONDITION)}
        self._patch_status(namespace, name, uid, lambda s: {
            **s, "conditions": merge_conditions(s.get("conditions") or [], target, self._now())
        })  # fmt: skip
        self._event(pod, "TaintManagerEviction", f"Marking for deletion Pod {namespace}/{name}", "Normal",
                    "taint-eviction-controller")  # fmt: skip
        self._delete_pod(namespace, name, uid, grace_s=None)

    def _fail_lost(self, pod: Obj) -> None:
        """Kill a lost node's pod, report it Failed/NodeLost and delete it later."""
        run = self._run_of(pod)
        name, node = pod["metadata"]["name"], pod["spec"]["nodeName"]
        message = f"Node {node} which was running pod {name} is unresponsive"
        if run is None:
            run = self._new_run(pod)
        run.terminating = True
        run.disruption = ("NodeLost", message, *_LOST_CONDITION)
        for index, proc in run.procs.items():
            self._signal(proc, signal.SIGKILL)
            record = run.records[index]
            record.running = False
            record.waiting = None
            record.exit_code, record.reason = 137, "ContainerStatusUnknown"
            record.message = "The container could not be located when the pod was terminated"
            record.finished_at = rfc3339(self._clock())
        run.final = True
        self._write_status(run, started=run.started)
        uid, namespace = run.uid, run.namespace
        self._after(self._node_lost_eviction_s, lambda: self._delete_pod(namespace, name, uid, grace_s=0))

    def _restore_node(self, node: str) -> None:
        self._lost.discard(node)
        if node in self._unreachable:
            self._unreachable.discard(node)
            # Its kubelet answers again: the pods it kept are reported (their processes died with the node).
            for key, pod in sorted(self._pods.items()):
                if (pod.get("spec") or {}).get("nodeName") != node:
                    continue
                if pod["metadata"].get("deletionTimestamp"):
                    self._delete_pod(key[0], key[1], _uid(pod), grace_s=0)
                elif _phase(pod) not in _TERMINAL:
                    self._fail_lost(pod)
        self._set_node_ready(node, True)
        self._event_node(node, "NodeReady", f"Node {node} status is now: NodeReady", "Normal")

    # ----------------------------------------------------------------- scheduling

    def _schedule(self) -> None:
        pending = [
            p
            for p in self._pods.values()
            if not (p.get("spec") or {}).get("nodeName")
            and _phase(p) not in _TERMINAL
            and not p["metadata"].get("deletionTimestamp")
            and (p.get("spec") or {}).get("schedulerName", _DEFAULT_SCHEDULER) == _DEFAULT_SCHEDULER
        ]
        if not pending:
            return
        views = []
        for name in self._sim_nodes:
            node = self._nodes.get(name)
            if node is not None:
                try:
                    views.append(NodeView.of(node))
                except QuantityError as e:
                    _log.warning("test kubelet: node %s is not schedulable: %s", name, e)
        bound = [
            (p, p["spec"]["nodeName"])
            for p in self._pods.values()
            if (p.get("spec") or {}).get("nodeName") and _phase(p) not in _TERMINAL
        ]
        for pod, decision in plan(pending, views, bound):
            if decision.node is not None:
                self._bind(pod, decision.node)
            else:
                self._mark_unschedulable(pod, decision.message)

    def _bind(self, pod: Mapping[str, Any], node: str) -> None:
        rt = self.store.resource_type("", "v1", "pods")
        uid = _uid(pod)
        namespace, name = self._key(pod)

        def bind(current: Obj) -> Obj:
            # As POST pods/<name>/binding: only an unbound pod of the same uid is bound.
            if _uid(current) != uid or (current.get("spec") or {}).get("nodeName"):
                raise _Stale
            bound = copy.deepcopy(current)
            bound.setdefault("spec", {})["nodeName"] = node
            return bound

        try:
            updated = self.store.patch(rt, namespace, name, bind)
        except (_Stale, ApiError):
            return
        self._cache_pod((namespace, name), updated)
        self._unschedulable_messages.pop(uid, None)
        scheduled = {"PodScheduled": ("True", "", "")}
        self._patch_status(namespace, name, uid, lambda s: {
            **s, "conditions": merge_conditions(s.get("conditions") or [], scheduled, self._now())
        })  # fmt: skip
        message = f"Successfully assigned {namespace}/{name} to {node}"
        self._event(updated, "Scheduled", message, "Normal", _DEFAULT_SCHEDULER)

    def _mark_unschedulable(self, pod: Mapping[str, Any], message: str) -> None:
        uid = _uid(pod)
        if self._unschedulable_messages.get(uid) == message:
            return
        self._unschedulable_messages[uid] = message
        namespace, name = self._key(pod)
        conditions = {"PodScheduled": ("False", "Unschedulable", message)}
        self._patch_status(namespace, name, uid, lambda s: {
            **s, "conditions": merge_conditions(s.get("conditions") or [], conditions, self._now())
        })  # fmt: skip
        self._event(pod, "FailedScheduling", message, "Warning", "default-scheduler")

    # ----------------------------------------------------------------- pods

    def _run_of(self, pod: Mapping[str, Any]) -> _PodRun | None:
        return self._runs.get(_uid(pod))

    def _find_run(self, namespace: str, name: str) -> _PodRun:
        pod = self._pods.get((namespace, name))
        run = self._run_of(pod) if pod is not None else None
        if run is None:
            runs = [r for r in [*self._retired, *self._runs.values()] if (r.namespace, r.name) == (namespace, name)]
            if not runs:
                raise KeyError(f"pod {namespace}/{name} was not run by this kubelet")
            run = runs[-1]
        return run

    def _sync(self, key: Key) -> None:
        pod = self._pods.get(key)
        if pod is None:
            return
        node = (pod.get("spec") or {}).get("nodeName")
        if node not in self._sim_nodes or node in self._unreachable:
            return  # (an unreachable node's kubelet neither stops, starts nor reports anything)
        run = self._run_of(pod)
        meta = pod["metadata"]
        if meta.get("deletionTimestamp"):
            if run is None or not run.alive:
                if run is not None:
                    run.terminating = True  # no restart after a back-off
                self._delete_pod(key[0], key[1], _uid(pod), grace_s=0)
                return
            run.deleting = True
            if not run.terminating:
                self._terminate(run, float(meta.get("deletionGracePeriodSeconds") or 0))
            return
        if _phase(pod) in _TERMINAL:
            return
        if node in self._lost:
            if run is None or not run.final:
                self._fail_lost(pod)
            return
        if run is None:
            run = self._new_run(pod)
        if not run.started and not run.final:
            self._start(run, pod)

    def _ip_for(self, namespace: str, name: str) -> str:
        """The IP of a pod: one per pod name, except that pods with a hostname and subdomain (a DNS name under a
        headless Service) share that name's IP, so every relaunch of a task answers at the address its peers
        resolved (a real cluster gives a new IP and updates the DNS record; the rewrite here is done once, at the
        start of a container)."""
        pod = self._pods.get((namespace, name))
        spec = (pod or {}).get("spec") or {}
        if spec.get("hostname") and spec.get("subdomain"):
            return self._dns_ip(namespace, str(spec["subdomain"]), str(spec["hostname"]))
        return self._new_ip(("pod", namespace, name))

    def _dns_ip(self, namespace: str, subdomain: str, hostname: str) -> str:
        return self._new_ip(("dns", namespace, subdomain, hostname))

    def _new_ip(self, key: tuple[str, ...]) -> str:
        if key not in self._ips:
            n = len(self._ips)
            self._ips[key] = f"127.20.{n // 250}.{n % 250 + 1}"
        return self._ips[key]

    def _pod_address(self, namespace: str, subdomain: str, hostname: str) -> str | None:
        """The IP of `<hostname>.<subdomain>.<namespace>.svc`: that name's, whether or not a pod has it yet (its
        peers resolve it again until one has), when `subdomain` is a headless Service."""
        service = self._get("services", namespace, subdomain)
        if service is None:
            why = f"service {namespace}/{subdomain} does not exist, so {hostname}.{subdomain} does not resolve yet"
            raise NotReadyYet("ContainerCreating", why)
        if (service.get("spec") or {}).get("clusterIP") != "None":
            return None
        return self._dns_ip(namespace, subdomain, hostname)

    def _new_run(self, pod: Obj) -> _PodRun:
        meta, spec = pod["metadata"], pod.get("spec") or {}
        namespace, name, uid = meta.get("namespace") or "default", meta["name"], meta["uid"]
        directory = self.root / "pods" / namespace / f"{name}-{uid[:8]}"
        log_dir = self.root / "logs" / f"{namespace}_{name}_{uid}"
        containers = spec.get("containers") or []
        records = [ContainerRecord(str(c.get("name") or ""), str(c.get("image") or "")) for c in containers]
        node = spec["nodeName"]
        run = _PodRun(
            uid=uid,
            namespace=namespace,
            name=name,
            node=node,
            ip=self._ip_for(namespace, name),
            host_ip=self._host_ips[node],
            restart_policy=str(spec.get("restartPolicy") or "Always"),
            directory=directory,
            log_dir=log_dir,
            records=records,
        )
        self._runs[uid] = run
        return run

    def _lookups(self, run: _PodRun) -> PodLookups:
        allocatable = {k: parse_quantity(v) for k, v in self._sim_nodes[run.node].allocatable().items()}
        return PodLookups(
            pod_ip=run.ip,
            host_ip=run.host_ip,
            node_allocatable=allocatable,
            secret=lambda ns, name: self._get("secrets", ns, name),
            config_map=lambda ns, name: self._get("configmaps", ns, name),
            service=self._service_address,
            pod_address=self._pod_address,
        )

    def _get(self, plural: str, namespace: str, name: str) -> Obj | None:
        try:
            return self.store.get(self.store.resource_type("", "v1", plural), namespace, name)
        except ApiError as e:
            if e.code == 404:
                return None
            raise

    def _service_address(self, namespace: str, name: str, port: int | None) -> str | None:
        service = self._get("services", namespace, name)
        if service is None:
            return None
        pods = [p for (ns, _), p in self._pods.items() if ns == namespace]
        return service_target(service, pods, lambda p: self._ip_for(*self._key(p)), port)

    def _start(self, run: _PodRun, pod: Obj) -> None:
        """Prepare the pod's directories and environment and start its containers; a pod that
        cannot start yet waits (and is retried), one that never can fails."""
        spec = pod.get("spec") or {}
        try:
            if run.restart_policy not in ("Never", "OnFailure", "Always"):
                raise PodSpecError(f"restartPolicy {run.restart_policy!r} is not Never, OnFailure or Always")
            for field in ("initContainers", "ephemeralContainers"):
                if spec.get(field):
                    raise PodSpecError(f"{field} are not run by the test kubelet")
            if not run.records:
                raise PodSpecError("the pod has no containers")
            lookups = self._lookups(run)
            run.volumes = plan_volumes(
                pod, pvc_root=str(self.root / "pvc"), pod_root=str(run.directory / "volumes"), lookups=lookups
            )
            prepared = [self._prepare(run, pod, c, lookups) for c in spec.get("containers") or []]
        except NotReadyYet as e:
            run.waiting = True
            for record in run.records:
                record.waiting = (e.reason, e.message)
            self._write_status(run, started=False)
            return
        except (PodSpecError, QuantityError) as e:
            run.waiting = False
            self._fail_unstartable(run, str(e))
            return
        run.waiting = False
        self._materialise(run)
        run.started = True
        run.started_at = self._now()
        for index, container in enumerate(prepared):
            self._spawn(run, index, container)
        if not run.alive:
            run.final = True
        deadline = spec.get("activeDeadlineSeconds")
        if deadline is not None:
            self._after(float(deadline), lambda: self._deadline_exceeded(run))
        self._write_status(run, started=True)
        self._event_pod(run, "Started", f"Started the pod's {len(run.records)} container(s) on {run.node}", "Normal")

    def _prepare(
        self, run: _PodRun, pod: Obj, container: Mapping[str, Any], lookups: PodLookups
    ) -> tuple[list[str], dict[str, str], Path, int]:
        """(argv, env, cwd, memory limit MiB) of one container."""
        name = container.get("name")
        env = resolve_env(pod, container, lookups)
        mounts = mount_map(container, run.volumes)
        service = lookups.service
        command = [str(a) for a in container.get("command") or []]
        args = [str(a) for a in container.get("args") or []]
        if not command:
            raise PodSpecError(f"container {name!r} has no command: the test kubelet runs commands, not images")
        pod_address = lookups.pod_address
        argv = [rewrite(expand(a, env.get), mounts, service, pod_address) for a in command + args]
        env = {k: rewrite(v, mounts, service, pod_address) for k, v in env.items()}
        working_dir = container.get("workingDir")
        cwd = Path(rewrite(str(working_dir), mounts, lambda *_: None)) if working_dir else run.directory / "work"
        base = dict(os.environ)
        # The "image" is the test's environment: its interpreter's scripts (dlrover-master,
        # dlrover-run) are on the PATH, as they would be in an image that installed them.
        scripts = str(Path(sys.executable).parent)
        if scripts not in base.get("PATH", "").split(os.pathsep):
            base["PATH"] = os.pathsep.join(p for p in (scripts, base.get("PATH", "")) if p)
        base["HOSTNAME"] = str((pod.get("spec") or {}).get("hostname") or run.name)  # as a container's is
        # A container's /tmp is its own and goes with it: what its processes leave there (killed, they
        # clean nothing up) must not outlive the pod on this shared machine.
        base["TMPDIR"] = str(self._tmp_dir(run))
        if self._api_url is not None:
            base["KUBECONFIG"] = str(run.directory / "kubeconfig")
        limits = (container.get("resources") or {}).get("limits") or {}
        memory = limits.get("memory")
        if memory is not None:
            limit_mb = max(1, math.ceil(parse_quantity(memory) / _MIB))
        else:
            # No limit: bounded by the node, as a real container is by the node's pods cgroup.
            limit_mb = max(1, math.ceil(parse_quantity(self._sim_nodes[run.node].memory) / _MIB))
        return argv, {**base, **env}, cwd, limit_mb

    def _materialise(self, run: _PodRun) -> None:
        (run.directory / "work").mkdir(parents=True, exist_ok=True)
        self._tmp_dir(run).mkdir(parents=True, exist_ok=True)
        run.log_dir.mkdir(parents=True, exist_ok=True)
        for volume in run.volumes.values():
            path = Path(volume.path)
            path.mkdir(parents=True, exist_ok=True)
            for relative, (data, mode) in volume.files.items():
                target = path / relative
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(data)
                target.chmod(mode)
        if self._api_url is not None:
            self._write_kubeconfig(run)

    def _tmp_dir(self, run: _PodRun) -> Path:
        """The pod's TMPDIR; short, for the unix sockets programs make there (108 bytes a path at most)."""
        return self.root / "tmp" / run.uid[:8]

    def _write_kubeconfig(self, run: _PodRun) -> None:
        pod = self._pods.get((run.namespace, run.name)) or {}
        account = (pod.get("spec") or {}).get("serviceAccountName") or "default"
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "test", "cluster": {"server": self._api_url}}],
            "users": [{"name": "pod", "user": {"token": f"serviceaccount:{run.namespace}:{account}"}}],
            "contexts": [{"name": "pod", "context": {"cluster": "test", "user": "pod", "namespace": run.namespace}}],
            "current-context": "pod",
        }
        (run.directory / "kubeconfig").write_text(json.dumps(config, indent=2))

    def _spawn(self, run: _PodRun, index: int, prepared: tuple[list[str], dict[str, str], Path, int]) -> bool:
        argv, env, cwd, limit_mb = prepared
        record = run.records[index]
        if not cwd.is_dir():  # checked once the pod's volumes exist: it may be one of them
            self._container_failed_to_start(run, index, f"workingDir {cwd} does not exist")
            return False
        executable = argv[0] if "/" in argv[0] else shutil.which(argv[0], path=env.get("PATH"))
        if executable is None or not os.access(Path(cwd, executable), os.X_OK):
            # The runtime's words: the container is never created.
            why = f'exec: "{argv[0]}": executable file not found in $PATH'
            self._container_failed_to_start(run, index, f"failed to create containerd task: {why}")
            return False
        group = None
        generation = next(self._generations)
        groups = self._groups
        command = argv
        if groups is not None and groups.usable:
            try:
                group = groups.create(f"kubelet-{os.getpid()}-{run.uid[:8]}-{index}-{generation}", limit_mb)
            except (OSError, ValueError) as e:
                self._container_failed_to_start(run, index, f"cannot make the memory cgroup: {e}")
                return False
            run.groups.append(group)
            command = groups.join_argv(group, argv)
        log_path = run.log_dir / f"{record.name}.log"
        try:
            popen = processes.start(command, env, cwd, log_path)
        except OSError as e:
            self._container_failed_to_start(run, index, f"cannot start {argv[0]!r}: {e}")
            self._release_groups(run)
            return False
        waiter = threading.Thread(
            target=self._wait, args=(popen, run.uid, index, generation), name=f"kubelet-wait-{popen.pid}"
        )
        run.procs[index] = _Proc(popen, group, generation, waiter)
        waiter.start()
        record.container_id = f"testsupport://{run.uid}/{record.name}/{record.restart_count}"
        record.running, record.waiting, record.exit_code = True, None, None
        record.started_at, record.reason, record.message, record.finished_at = self._now(), "", "", None
        return True

    def _wait(self, popen: subprocess.Popen[bytes], uid: str, index: int, generation: int) -> None:
        """The waiter thread of one container process: hands its exit to the loop."""
        self._queue.put(("exit", uid, index, generation, processes.reap(popen)))

    def _container_failed_to_start(self, run: _PodRun, index: int, message: str) -> None:
        record = run.records[index]
        record.running, record.waiting = False, None
        record.exit_code, record.reason, record.message = 128, "StartError", message
        record.started_at = record.finished_at = self._now()

    def _fail_unstartable(self, run: _PodRun, message: str) -> None:
        """A pod this kubelet cannot run: Failed, with the reason in its status and an event."""
        run.final = True
        run.disruption = ("UnsupportedByTestKubelet", message, "", "")
        for record in run.records:
            record.waiting = None
            record.exit_code, record.reason, record.message = 128, "CreateContainerError", message
        self._write_status(run, started=False, phase="Failed")
        self._event_pod(run, "Failed", message, "Warning")

    def _exited(self, uid: str, index: int, generation: int, returncode: int) -> None:
        run = self._runs.get(uid)
        if run is None:
            return
        proc = run.procs.get(index)
        if proc is None or proc.generation != generation:
            return
        del run.procs[index]
        proc.waiter.join()
        record = run.records[index]
        oom = False
        if proc.group is not None and self._groups is not None:
            kills = self._groups.oom_kills(proc.group)
            oom = bool(kills)
        self._release_groups(run)
        if run.final:  # a lost node's pod: its status was written when it was lost
            self._finish(run)
            return
        code = exit_code_of(returncode)
        record.running = False
        record.exit_code, record.reason = code, exit_reason(code, oom)
        record.finished_at = self._now()
        if not run.terminating and self._restarts(run, code):
            delay = run.backoff_s = min(max(run.backoff_s * 2, self._restart_backoff_s), self._max_restart_backoff_s)
            record.last_terminated = record.terminated()
            record.waiting = ("CrashLoopBackOff", f"back-off {delay:g}s restarting failed container={record.name}")
            record.exit_code = None
            self._after(delay, lambda: self._restart(run, index))
            self._write_status(run, started=True)
            return
        if run.alive:
            self._write_status(run, started=True)
            return
        run.final = True
        self._write_status(run, started=True)
        self._finish(run)

    def _restarts(self, run: _PodRun, code: int) -> bool:
        return run.restart_policy == "Always" or (run.restart_policy == "OnFailure" and code != 0)

    def _restart(self, run: _PodRun, index: int) -> None:
        if run.terminating or run.gone or self._runs.get(run.uid) is not run:
            return
        pod = self._pods.get((run.namespace, run.name))
        if pod is None or _uid(pod) != run.uid:
            return
        container = (pod.get("spec") or {}).get("containers", [])[index]
        record = run.records[index]
        record.restart_count += 1
        try:
            prepared = self._prepare(run, pod, container, self._lookups(run))
        except NotReadyYet as e:
            record.waiting = (e.reason, e.message)
            self._after(max(run.backoff_s, 0.1), lambda: self._restart(run, index))
            self._write_status(run, started=True)
            return
        except (PodSpecError, QuantityError) as e:
            self._container_failed_to_start(run, index, str(e))
            self._write_status(run, started=True)
            return
        if not self._spawn(run, index, prepared):
            # Not started again: back off and retry, as after a crash.
            record.last_terminated = record.terminated()
            record.exit_code = None
            record.waiting = ("CrashLoopBackOff", record.message)
            run.backoff_s = min(max(run.backoff_s * 2, self._restart_backoff_s), self._max_restart_backoff_s)
            self._after(run.backoff_s, lambda: self._restart(run, index))
        self._write_status(run, started=True)

    def _finish(self, run: _PodRun) -> None:
        """Every process of the pod is gone: delete the pod if that was asked, clean up if gone.

        With cgroups, "gone" includes every process that left the process group: the pod is
        deleted only once its groups could be removed (the kernel refuses while one holds a
        process)."""
        if run.alive or run.groups:
            return
        if run.deleting and not run.gone:
            self._delete_pod(run.namespace, run.name, run.uid, grace_s=0)
        if run.gone:
            self._cleanup(run)

    def _terminate(self, run: _PodRun, grace_s: float) -> None:
        """SIGTERM the pod's process groups; SIGKILL what is left after `grace_s`."""
        run.terminating = True
        for proc in run.procs.values():
            self._signal(proc, signal.SIGTERM if grace_s > 0 else signal.SIGKILL)
        if grace_s > 0 and run.procs:
            self._event_pod(run, "Killing", f"Stopping the pod's containers (grace {grace_s:g}s)", "Normal")

            def kill() -> None:
                for proc in run.procs.values():
                    self._signal(proc, signal.SIGKILL)

            self._after(grace_s, kill)

    @staticmethod
    def _signal(proc: _Proc, sig: int) -> None:
        # Without a cgroup, a SIGKILL also reaches descendants that left the process group.
        processes.signal_group(proc.popen, sig, strays=sig == signal.SIGKILL and proc.group is None)

    def _release_groups(self, run: _PodRun) -> None:
        """Remove the memory cgroups whose processes are gone, killing stragglers that left the
        process group; retried shortly while the kernel still counts a member."""
        groups = self._groups
        if groups is None or not run.groups:
            return
        in_use = {id(p.group) for p in run.procs.values() if p.group is not None}
        remaining = []
        for group in run.groups:
            if id(group) in in_use:
                remaining.append(group)
                continue
            for pid in groups.pids(group):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            try:
                gone = groups.remove(group)
            except OSError as e:
                _log.warning("test kubelet: memory cgroup %s cannot be removed: %s", group.path, e)
                gone = False
            if not gone:
                remaining.append(group)
        had_groups = bool(run.groups)
        run.groups = remaining
        if any(id(g) not in in_use for g in remaining):
            self._after(0.05, lambda: self._release_groups(run))
        elif had_groups and not remaining and not run.alive and run.final:
            self._finish(run)

    def _pod_gone(self, pod: Mapping[str, Any]) -> None:
        """The pod left the store (deleted, or force-deleted): stop what still runs, clean up."""
        run = self._run_of(pod)
        self._unschedulable_messages.pop(_uid(pod), None)
        if run is None:
            return
        run.gone = True
        if run.alive and not run.terminating:
            grace = float((pod.get("spec") or {}).get("terminationGracePeriodSeconds", 30))
            self._terminate(run, grace)
        self._finish(run)

    def _cleanup(self, run: _PodRun) -> None:
        self._release_groups(run)
        for volume in run.volumes.values():
            if volume.owned:
                shutil.rmtree(volume.path, ignore_errors=True)
        shutil.rmtree(run.directory, ignore_errors=True)
        shutil.rmtree(self._tmp_dir(run), ignore_errors=True)
        if not run.groups:
            self._runs.pop(run.uid, None)
            self._retired.append(run)

    def _delete_pod(self, namespace: str, name: str, uid: str, *, grace_s: int | None) -> None:
        rt = self.store.resource_type("", "v1", "pods")
        with contextlib.suppress(ApiError):  # gone already
            self.store.delete(rt, namespace, name, grace_period_s=grace_s, precondition_uid=uid)

    def _deadline_exceeded(self, run: _PodRun) -> None:
        if run.final or run.terminating or self._runs.get(run.uid) is not run:
            return
        message = "Pod was active on the node longer than the specified deadline"
        run.disruption = ("DeadlineExceeded", message, "", "")
        pod = self._pods.get((run.namespace, run.name)) or {}
        self._terminate(run, float((pod.get("spec") or {}).get("terminationGracePeriodSeconds", 30)))
        self._event_pod(run, "DeadlineExceeded", message, "Normal")

    def _evict(self, namespace: str, name: str, message: str, grace_s: float) -> None:
        pod = self._pods.get((namespace, name))
        if pod is None or (pod.get("spec") or {}).get("nodeName") not in self._sim_nodes:
            raise KeyError(f"pod {namespace}/{name} is not on a node of this kubelet")
        if _phase(pod) in _TERMINAL:
            raise ValueError(f"pod {namespace}/{name} has finished ({_phase(pod)}): there is nothing to evict")
        run = self._run_of(pod) or self._new_run(pod)
        run.disruption = ("Evicted", message, "TerminationByKubelet", message)
        self._event_pod(run, "Evicted", message, "Warning")
        if run.alive:
            self._write_status(run, started=run.started)
            self._terminate(run, grace_s)
            return
        run.terminating = run.final = True
        self._write_status(run, started=run.started, phase="Failed")

    def _preempt(self, namespace: str, name: str, message: str) -> None:
        pod = self._pods.get((namespace, name))
        if pod is None:
            raise KeyError(f"no pod {namespace}/{name}")
        uid = _uid(pod)
        run = self._run_of(pod)
        conditions = {"DisruptionTarget": ("True", "PreemptionByScheduler", message)}
        if run is not None:
            run.disruption = ("", "", "PreemptionByScheduler", message)
        self._patch_status(namespace, name, uid, lambda s: {
            **s, "conditions": merge_conditions(s.get("conditions") or [], conditions, self._now())
        })  # fmt: skip
        self._event(pod, "Preempted", message, "Normal", "default-scheduler")
        self._delete_pod(namespace, name, uid, grace_s=None)

    def _pid(self, namespace: str, name: str, container: str | None) -> int | None:
        run = self._find_run(namespace, name)
        for index, record in enumerate(run.records):
            if container in (None, record.name) and index in run.procs:
                return run.procs[index].popen.pid
        return None

    def _log_path(self, namespace: str, name: str, container: str | None) -> Path:
        run = self._find_run(namespace, name)
        names = [r.name for r in run.records]
        if container is None:
            container = names[0]
        if container not in names:
            raise KeyError(f"pod {namespace}/{name} has no container {container!r} (it has {names})")
        return run.log_dir / f"{container}.log"

    # ----------------------------------------------------------------- status

    def _now(self) -> str:
        return rfc3339(self._clock())

    def _write_status(self, run: _PodRun, *, started: bool, phase: str | None = None) -> None:
        phase = phase or pod_phase(run.records, run.restart_policy, started)
        if run.final and phase not in _TERMINAL:  # stopped for good, whatever the restart policy
            phase = "Succeeded" if all(r.exit_code == 0 for r in run.records) else "Failed"
        failing = ("NodeLost", "Evicted", "DeadlineExceeded")
        if run.final and run.disruption is not None and run.disruption[0] in failing:
            phase = "Failed"
        ready = started and all(r.running for r in run.records)
        not_ready = "" if ready else ("PodCompleted" if phase in _TERMINAL else "ContainersNotReady")
        conditions: dict[str, tuple[str, str, str]] = {
            "PodScheduled": ("True", "", ""),
            "Initialized": ("True", "PodCompleted" if phase in _TERMINAL else "", ""),
            "ContainersReady": ("True" if ready else "False", not_ready, ""),
            "Ready": ("True" if ready else "False", not_ready, ""),
        }
        disruption = run.disruption
        if disruption is not None and disruption[2]:
            conditions["DisruptionTarget"] = ("True", disruption[2], disruption[3])
        statuses = [container_status(r) for r in run.records]
        pod = self._pods.get((run.namespace, run.name)) or {}
        qos = qos_class((pod.get("spec") or {}).get("containers") or [])
        now = self._now()

        def update(status: Obj) -> Obj:
            new: Obj = {
                "phase": phase,
                "conditions": merge_conditions(status.get("conditions") or [], conditions, now),
                "hostIP": run.host_ip,
                "hostIPs": [{"ip": run.host_ip}],
                "podIP": run.ip,
                "podIPs": [{"ip": run.ip}],
                "containerStatuses": statuses,
                "qosClass": qos,
            }
            if run.started_at or status.get("startTime"):
                new["startTime"] = status.get("startTime") or run.started_at
            if disruption is not None and disruption[0] and (phase in _TERMINAL or disruption[0] == "NodeLost"):
                new["reason"], new["message"] = disruption[0], disruption[1]
            return new

        self._patch_status(run.namespace, run.name, run.uid, update)

    def _patch_status(self, namespace: str, name: str, uid: str, update: Callable[[Obj], Obj]) -> None:
        rt = self.store.resource_type("", "v1", "pods")

        def apply(current: Obj) -> Obj:
            if _uid(current) != uid:
                raise _Stale
            new = copy.deepcopy(current)
            new["status"] = update(copy.deepcopy(current.get("status") or {}))
            return new

        try:
            updated = self.store.patch(rt, namespace, name, apply, status=True)
        except (_Stale, ApiError):
            return  # the pod is gone or replaced: nothing to report on
        self._cache_pod((namespace, name), updated)

    def _event(self, pod: Mapping[str, Any], reason: str, message: str, kind: str, component: str = "kubelet") -> None:
        meta = pod.get("metadata") or {}
        namespace = str(meta.get("namespace") or "default")
        involved = pod_reference(namespace, str(meta.get("name")), str(meta.get("uid")))
        self._write_event(namespace, involved, reason, message, kind, component=component)

    def _event_pod(self, run: _PodRun, reason: str, message: str, kind: str) -> None:
        involved = pod_reference(run.namespace, run.name, run.uid)
        self._write_event(run.namespace, involved, reason, message, kind, component="kubelet")

    def _event_node(self, node: str, reason: str, message: str, kind: str) -> None:
        involved = {"kind": "Node", "name": node, "uid": node, "apiVersion": "v1"}
        self._write_event("default", involved, reason, message, kind, component="node-controller")

    def _write_event(
        self, namespace: str, involved: Obj, reason: str, message: str, kind: str, *, component: str
    ) -> None:
        write_event(
            self.store, namespace, involved, reason=reason, message=message, kind=kind, component=component,
            now=self._now(),
        )  # fmt: skip

    # ----------------------------------------------------------------- shutdown

    def _shutdown(self) -> None:
        """Stop every process (SIGTERM, SIGKILL after the grace), join the waiters, remove cgroups
        and pod directories."""
        runs = list(self._runs.values())
        for run in runs:
            for proc in run.procs.values():
                self._signal(proc, signal.SIGTERM)
        deadline = time.monotonic() + self._stop_grace_s
        for run in runs:
            for proc in run.procs.values():
                proc.waiter.join(timeout=max(0.0, deadline - time.monotonic()))
        for run in runs:
            for proc in list(run.procs.values()):
                self._signal(proc, signal.SIGKILL)
                proc.waiter.join()
            run.procs.clear()
        last = time.monotonic() + max(self._stop_grace_s, 1.0)
        for run in runs:
            while True:
                self._timers = []
                self._release_groups(run)
                if not run.groups or time.monotonic() >= last:
                    break
                time.sleep(0.05)
            if run.groups:
                _log.warning("test kubelet: memory cgroups %s still hold processes", [g.path for g in run.groups])
            shutil.rmtree(run.directory, ignore_errors=True)
            shutil.rmtree(self._tmp_dir(run), ignore_errors=True)
        self._timers = []
        self._runs.clear()
        self._drain()

    def _drain(self) -> None:
        """Anything still queued (exits of the processes just reaped) is moot now; a fault method
        that raced with `stop` learns it."""
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                break
            if item[0] == "call":
                item[2].set_exception(RuntimeError("the kubelet stopped"))


def _uid(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("uid") or "")


def _rv(obj: Mapping[str, Any]) -> int:
    # This kubelet is part of the test server: it may read the store's numeric versions.
    value = str((obj.get("metadata") or {}).get("resourceVersion") or "0")
    return int(value) if value.isdigit() else 0


def _phase(pod: Mapping[str, Any]) -> str:
    return str((pod.get("status") or {}).get("phase") or "Pending")
