"""1,000 worker pods through the master's Kubernetes backend on the test API server (issue 29).

The backend (`dlrover.master.scheduler.kubernetes.KubernetesScheduler`, what ``dlrover-master --backend
kubernetes`` runs) creates the pods one after another, as the master's ``_apply`` does, and follows them with
its one list + watch. Measured, each beside a peer measured in the same run on the same server:

* (a) **create rate**: the backend's ``launch`` of N pods (the manifest built per pod, the create sent
  with retries armed, the answer read whole) in pods per second, beside the same number of raw
  ``CoreV1Api.create_namespaced_pod`` calls of the same manifests from one client (into namespace
  ``peer``, run first); the ratio is backend / raw. Also when the backend's watch had shown all N.
* (b) **mass failure**: the pods of ``--fail / --pods-per-node`` simulated nodes (100 pods) are marked
  failed at once, as the test kubelet's ``lose_node`` writes them (phase Failed, reason NodeLost, a
  DisruptionTarget condition, the container terminated 137). Timed from the first status write:
  the backend's watch shows all 100 as failed (``observe``), then the backend launches 100
  replacement pods (new node ids, the lost hosts avoided, as a relaunch asks), and its watch shows
  them. The peer: a raw ``kubernetes.watch.Watch`` on the same pods, opened before the fault, seeing
  the 100 status changes. Ratios: observed / raw watch, and observed + relaunched against the raw
  watch plus 100 creates at the raw create rate of (a).
* (c) **steady-state requests**: with every pod running, the server's request record over
  ``--window-s`` while the backend's ``observe()`` is called every 0.1 s (a master tick); requests
  per node per minute, beside a design that polls each pod once per ``--poll-interval-s``.

What is simulated: the pods run no process. With 2 shared cores the test kubelet was not asked to hold
1,000 processes (its one loop thread also schedules, starts and watches each pod); the benchmark
instead writes what a kubelet writes, in-process through the server's ``Store`` (as the test kubelet
does, so those writes stay out of the request record): a binding to simulated node
``sim-<k>`` (``--pods-per-node`` pods each), then status Running (IPs, a running container); the
failures as above (the pods stay, Failed, as before the taint manager deletes them). Everything the
backend does goes over HTTP through the official client. The master's tick (which turns the
observations into relaunch decisions) is not included in (b): the relaunch is sent as soon as the
watch shows the failures.

The backend's creates run beside its own watch in the same process (decoding an ADDED event per pod
it creates), the peer's without one; building the manifests takes ~20 ms for 1,000 and is no factor.

    python benchmarks/kube_scale.py                    # 1,000 pods, 100 failed, 60 s window, 1 run
    python benchmarks/kube_scale.py --runs 2 --window-s 30
    python benchmarks/kube_scale.py --pods 200 --fail 20 --window-s 10   # quick

Every wait is bounded; the backend deletes its pods on close, and the server (threads, sockets) is
stopped; no process or file is made.
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
import threading
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from benchkit import fmt, median

try:
    import dlrover_testsupport  # noqa: F401
except ImportError:  # not installed (it is no distribution): the repository's copy
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "testsupport" / "src"))

from dlrover_testsupport.kube import ApiServer
from dlrover_testsupport.kube.store import Store

from dlrover.autoscale import Resources
from dlrover.master.kube import names
from dlrover.master.kube.watch import WatchSettings
from dlrover.master.scheduler.base import NodeSpec, ObservedState
from dlrover.master.scheduler.kubernetes import KubernetesScheduler, KubernetesSettings, WorkerTemplate, worker_pod

NS, PEER_NS, JOB = "default", "peer", "bench"
TEMPLATE = {"spec": {"containers": [{"name": "main", "image": "dlrover", "command": ["dlrover-run", "train.py"]}]}}
RESOURCES = Resources(cpu=1, memory_mb=1024)


@dataclass
class Trial:
    outcome: str = "ok"
    raw_create_s: float | None = None
    backend_create_s: float | None = None
    backend_seen_s: float | None = None  # first launch -> the watch showed all N
    fault_written_s: float | None = None
    observed_s: float | None = None
    relaunched_s: float | None = None
    relaunch_seen_s: float | None = None
    raw_watch_s: float | None = None
    window_s: float = 0.0
    live_pods: int = 0
    requests: Counter[str] = field(default_factory=Counter)


def spec(node_id: int, rank: int, *, avoid: frozenset[str] = frozenset(), relaunch: int = 0) -> NodeSpec:
    return NodeSpec(
        job_name=JOB, node_id=node_id, rank=rank, relaunch_count=relaunch, avoid_hosts=avoid, resources=RESOURCES
    )


class SimKubelet:
    """Writes what a kubelet writes for pods that run no process, through the store (not over HTTP)."""

    def __init__(self, store: Store, pods_per_node: int) -> None:
        self.store, self.pods_per_node = store, pods_per_node
        self.rt = store.resource_type("", "v1", "pods")

    def node_of(self, node_id: int) -> str:
        return f"sim-{node_id // self.pods_per_node}"

    def run(self, node_id: int) -> None:
        name, node = names.worker_pod_name(JOB, node_id), self.node_of(node_id)

        def bind(pod: dict[str, Any]) -> dict[str, Any]:
            pod = copy.deepcopy(pod)
            pod["spec"]["nodeName"] = node
            return pod

        self.store.patch(self.rt, NS, name, bind)
        ip = f"127.20.{node_id // 250}.{node_id % 250 + 1}"
        running = {
            "name": "main",
            "image": "dlrover",
            "imageID": "",
            "ready": True,
            "restartCount": 0,
            "state": {"running": {"startedAt": _now()}},
        }
        self._status(name, {
            "phase": "Running", "hostIP": f"127.10.0.{node_id // self.pods_per_node % 250 + 1}", "podIP": ip,
            "conditions": [{"type": "Ready", "status": "True"}], "containerStatuses": [_container(running, ready=True)],
        })  # fmt: skip

    def lose(self, node_id: int) -> None:
        """As the test kubelet's `lose_node` reports a pod of the lost node (before the taint manager deletes it)."""
        name = names.worker_pod_name(JOB, node_id)
        terminated = {"exitCode": 137, "reason": "ContainerStatusUnknown", "finishedAt": _now()}
        self._status(name, {
            "phase": "Failed", "reason": "NodeLost",
            "message": f"Node {self.node_of(node_id)} which was running pod {name} is unresponsive",
            "conditions": [{"type": "DisruptionTarget", "status": "True", "reason": "DeletionByTaintManager",
                            "message": "Taint manager: deleting due to NoExecute taint"}],
            "containerStatuses": [_container({"terminated": terminated}, ready=False)],
        })  # fmt: skip

    def _status(self, name: str, status: Mapping[str, Any]) -> None:
        def apply(pod: dict[str, Any]) -> dict[str, Any]:
            pod = copy.deepcopy(pod)
            pod["status"] = {**(pod.get("status") or {}), **status}
            return pod

        self.store.patch(self.rt, NS, name, apply, status=True)


def _container(state: Mapping[str, Any], *, ready: bool) -> dict[str, Any]:
    return {"name": "main", "image": "dlrover", "imageID": "", "ready": ready, "restartCount": 0, "state": state}


def _now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def _states(observed: Mapping[int, Any], ids: range | list[int], state: ObservedState) -> bool:
    return all(i in observed and observed[i].state is state for i in ids)


def run_trial(args: argparse.Namespace) -> Trial:
    """One server, one backend: (a), then (b), then (c); the backend deletes its pods on close."""
    from kubernetes import client

    trial = Trial()
    store = Store(history_limit=max(10_000, 8 * args.pods))  # no 410 in one trial: the peer watch does not relist
    with ApiServer(store) as server:
        peer_api = client.ApiClient(client.Configuration(host=server.url))
        backend: KubernetesScheduler | None = None
        try:
            core = client.CoreV1Api(peer_api)
            settings = KubernetesSettings(
                namespace=NS, job=JOB, master_address="127.0.0.1:1",
                watch=WatchSettings(watch_timeout_s=args.watch_timeout_s), pod_deletion_grace_s=0,
            )  # fmt: skip
            backend = _create(args, trial, core, lambda: KubernetesScheduler(
                client.ApiClient(client.Configuration(host=server.url)), settings, WorkerTemplate(template=TEMPLATE),
                owns_client=True,
            ))  # fmt: skip
            kubelet = SimKubelet(store, args.pods_per_node)
            if trial.outcome == "ok":
                _mass_failure(args, trial, server, core, backend=backend, kubelet=kubelet)
            if trial.outcome == "ok":
                _steady(args, trial, server, backend, kubelet)
        except Exception as exc:  # a result, not a crash of the whole benchmark
            trial.outcome = f"error: {exc!r}"
        finally:
            if backend is not None:
                backend.close()
            peer_api.close()
    return trial


def _create(args: argparse.Namespace, trial: Trial, core: Any, make_backend: Any) -> KubernetesScheduler:
    """(a): the peer's raw creates (namespace `peer`), then the backend's launches; every pod running."""
    n = args.pods
    core.create_namespace({"metadata": {"name": PEER_NS}})
    template = WorkerTemplate(template=TEMPLATE)
    peer_settings = KubernetesSettings(namespace=PEER_NS, job="peer", master_address="127.0.0.1:1")
    manifests = [worker_pod(spec(i, i), peer_settings, template) for i in range(n)]
    t0 = time.monotonic()
    for manifest in manifests:  # one client, one after another, the answer read whole
        core.create_namespaced_pod(PEER_NS, manifest, _preload_content=False).data  # noqa: B018
    trial.raw_create_s = time.monotonic() - t0
    backend: KubernetesScheduler = make_backend()
    t0 = time.monotonic()
    for i in range(n):  # as the master's _apply: one launch after another
        backend.launch(spec(i, i))
    trial.backend_create_s = time.monotonic() - t0
    if not backend.wait_for(lambda o: _states(o, range(n), ObservedState.PENDING), args.timeout_s):
        trial.outcome = "the watch did not show every pod"
        return backend
    trial.backend_seen_s = time.monotonic() - t0
    return backend


def _mass_failure(
    args: argparse.Namespace, trial: Trial, server: ApiServer, core: Any, *, backend: KubernetesScheduler,
    kubelet: SimKubelet,
) -> None:  # fmt: skip
    """(b): the pods of the first `fail / pods_per_node` simulated nodes fail at once."""
    from kubernetes import watch

    n, fail = args.pods, args.fail
    for i in range(n):
        kubelet.run(i)
    if not backend.wait_for(lambda o: _states(o, range(n), ObservedState.RUNNING), args.timeout_s):
        trial.outcome = "the watch did not show every pod running"
        return
    targets = list(range(fail))
    target_names = {names.worker_pod_name(JOB, i) for i in targets}
    raw_done: list[float] = []
    watches_before = server.open_watches()
    raw = watch.Watch()

    def raw_watch() -> None:
        failed: set[str] = set()
        for event in raw.stream(
            core.list_namespaced_pod, NS, label_selector=names.worker_selector(JOB),
            resource_version=str(kubelet.store.resource_version), timeout_seconds=int(args.timeout_s),
            deserialize=False,  # plain JSON: the least a client can do per event
        ):  # fmt: skip
            pod = event["object"]
            name = pod["metadata"]["name"]
            if name in target_names and (pod.get("status") or {}).get("phase") == "Failed":
                failed.add(name)
                if len(failed) == len(target_names):
                    raw_done.append(time.monotonic())
                    raw.stop()

    relaunch: dict[str, float] = {}

    def backend_side() -> None:
        if not backend.wait_for(lambda o: _states(o, targets, ObservedState.FAILED), args.timeout_s):
            return
        relaunch["observed"] = time.monotonic()
        for k, i in enumerate(targets):  # a relaunch: a new node id, the lost host avoided
            backend.launch(spec(n + k, i, avoid=frozenset({kubelet.node_of(i)}), relaunch=1))
        relaunch["relaunched"] = time.monotonic()
        new = list(range(n, n + fail))
        if backend.wait_for(lambda o: _states(o, new, ObservedState.PENDING), args.timeout_s):
            relaunch["seen"] = time.monotonic()

    threads = [threading.Thread(target=raw_watch), threading.Thread(target=backend_side)]
    threads[0].start()
    deadline = time.monotonic() + args.timeout_s
    while server.open_watches() <= watches_before and time.monotonic() < deadline:
        time.sleep(0.01)  # the peer's watch is open before the fault
    threads[1].start()
    t_fault = time.monotonic()
    for i in targets:
        kubelet.lose(i)
    trial.fault_written_s = time.monotonic() - t_fault
    for thread in threads:
        thread.join(timeout=args.timeout_s + 30)
    if raw_done:
        trial.raw_watch_s = raw_done[0] - t_fault
    trial.observed_s, trial.relaunched_s, trial.relaunch_seen_s = (
        relaunch[k] - t_fault if k in relaunch else None for k in ("observed", "relaunched", "seen")
    )
    if "seen" not in relaunch or not raw_done:
        trial.outcome = "the mass failure was not seen (or not relaunched) in time"


def _steady(
    args: argparse.Namespace, trial: Trial, server: ApiServer, backend: KubernetesScheduler, kubelet: SimKubelet
) -> None:
    """(c): every live pod running, the master's tick reading the backend's cache; the requests counted."""
    n, fail = args.pods, args.fail
    for i in range(n, n + fail):
        kubelet.run(i)
    live = [*range(fail, n), *range(n, n + fail)]
    if not backend.wait_for(lambda o: _states(o, live, ObservedState.RUNNING), args.timeout_s):
        trial.outcome = "the replacements were not seen running"
        return
    server.clear_requests()
    t0 = time.monotonic()
    while time.monotonic() - t0 < args.window_s:
        backend.observe()
        time.sleep(0.1)
    trial.window_s = time.monotonic() - t0
    trial.live_pods = len(live)
    trial.requests = Counter(f"{r.verb or r.method} {r.rbac_resource}" for r in server.requests())


def _rate(n: int, s: float | None) -> float | None:
    return n / s if s else None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pods", type=int, default=1000, help="worker pods of the job")
    p.add_argument("--fail", type=int, default=100, help="pods failed at once (whole simulated nodes)")
    p.add_argument("--pods-per-node", type=int, default=10, help="pods per simulated node")
    p.add_argument("--window-s", type=float, default=60.0, help="steady-state window for the request count")
    p.add_argument("--watch-timeout-s", type=float, default=30.0, help="the backend's --kube-watch-timeout-s")
    p.add_argument("--poll-interval-s", type=float, default=10.0, help="the polling design's interval per pod")
    p.add_argument("--timeout-s", type=float, default=120.0, help="bound on every wait")
    p.add_argument("--runs", type=int, default=1)
    args = p.parse_args(argv)
    if args.fail % args.pods_per_node or not 0 < args.fail < args.pods:
        p.error("--fail must be whole simulated nodes (a multiple of --pods-per-node) and fewer than --pods")
    print(
        f"# kube scale: {args.pods} worker pods on the test API server ({args.pods_per_node} per simulated node, "
        f"no processes: statuses written as a kubelet would), {args.fail} failed at once, {args.window_s:g} s "
        f"steady window, watch timeout {args.watch_timeout_s:g} s, {os.cpu_count()} CPUs"
    )
    results: list[Trial] = []
    for rep in range(args.runs):
        t = run_trial(args)
        results.append(t)
        req = sum(t.requests.values())
        print(
            f"  rep {rep} {t.outcome}: raw create {fmt(t.raw_create_s)} s, backend create {fmt(t.backend_create_s)} s "
            f"(all seen {fmt(t.backend_seen_s)} s); fault written {fmt(t.fault_written_s)} s, raw watch "
            f"{fmt(t.raw_watch_s)} s, backend observed {fmt(t.observed_s)} s, relaunched {fmt(t.relaunched_s)} s, "
            f"replacements seen {fmt(t.relaunch_seen_s)} s; {req} requests in {t.window_s:.1f} s "
            f"{dict(t.requests)}",
            flush=True,
        )
    ok = [t for t in results if t.outcome == "ok"]
    n, fail = args.pods, args.fail
    raw_rate = median(_rate(n, t.raw_create_s) for t in ok)
    backend_rate = median(_rate(n, t.backend_create_s) for t in ok)
    seen_rate = median(_rate(n, t.backend_seen_s) for t in ok)
    print("\n| measure | backend | peer | ratio |")
    print("|---|---|---|---|")
    ratio = f"{backend_rate / raw_rate:.2f}x" if backend_rate and raw_rate else "-"
    print(
        f"| (a) pods created per second | {fmt(backend_rate)} | {fmt(raw_rate)} (raw create_namespaced_pod) | {ratio} |"
    )
    print(f"| (a) pods created and shown by the watch, per second | {fmt(seen_rate)} | - | - |")
    raw_watch = median(t.raw_watch_s for t in ok)
    observed = median(t.observed_s for t in ok)
    relaunched = median(t.relaunched_s for t in ok)
    seen = median(t.relaunch_seen_s for t in ok)
    ratio = f"{observed / raw_watch:.2f}x" if observed and raw_watch else "-"
    print(f"| (b) {fail} failures observed, s | {fmt(observed)} | {fmt(raw_watch)} (raw watch) | {ratio} |")
    peer_total = raw_watch + fail / raw_rate if raw_watch and raw_rate else None
    ratio = f"{relaunched / peer_total:.2f}x" if relaunched and peer_total else "-"
    print(
        f"| (b) failures observed + {fail} replacements created, s | {fmt(relaunched)} "
        f"| {fmt(peer_total)} (raw watch + {fail} raw creates) | {ratio} |"
    )
    print(f"| (b) replacements shown by the watch, s | {fmt(seen)} | - | - |")
    per_node = median(sum(t.requests.values()) / t.live_pods / (t.window_s / 60) for t in ok if t.live_pods)
    polling = 60 / args.poll_interval_s
    ratio = f"{per_node / polling:.5f}x" if per_node is not None else "-"
    print(
        f"| (c) API requests per node per minute, steady | {per_node:.5f} | {polling:.2f} (one GET per pod per "
        f"{args.poll_interval_s:g} s) | {ratio} |"
        if per_node is not None
        else "| (c) API requests per node per minute, steady | - | - | - |"
    )
    print(f"\nsteady-state requests by verb (all runs): {dict(sum((t.requests for t in ok), Counter()))}")
    return 0 if len(ok) == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
