"""The Ray backend: each job node is an agent actor on its own Ray node.

`launch` picks a Ray node for the job node: alive, not one the node must avoid, holding no other
agent of this job, and big enough for the node's resources; the actor is pinned there (node
affinity) and runs the agent command the local backend would run. A job node no Ray node can take
now waits, observed as pending (`Unschedulable`, with what was missing), and is placed as soon as
a node joins or frees: a pending launch is the lifecycle's to time out, as a pod's.

Failures come from Ray: an agent that exits is told at once (the backend waits on the actors'
exit calls and wakes the master, see `ReportsChanges`); an actor Ray reports dead or unreachable is
confirmed against the node table before anything is decided. A dead Ray node makes it `NodeLost`
(a disruption: relaunched elsewhere without charging the failure budget, the node avoided); an
actor gone while its node lives, after `death_confirm_s`, is the node's own failure. Nothing is
keyed by IP: every Ray node on one host has the same one; `placed_host` is the Ray node id.

Capacity is the Ray nodes that could take one more agent, less the launches still waiting: it
grows when nodes join (the master grows the job at the next round) and turns negative when a
node that held an agent leaves and its relaunch finds no room (the master goes on with fewer).

Actors belong to the master's Ray driver: a master that exits ends them, and their agents and
workers die with them (parent-death signals). A master restart therefore restarts the job's
processes; the journal and the checkpoints persisted by the workers carry the job on.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

import attrs

from dlrover.autoscale import Resources
from dlrover.common import Clock, ConfigError, SystemClock
from dlrover.common.auth import TOKEN_ENV_VAR, TOKEN_FILE_ENV_VAR, load_token
from dlrover.master.scheduler.base import (
    MASTER_ADDR_ENV_VAR,
    REASON_DELETED,
    REASON_NODE_LOST,
    REASON_UNSCHEDULABLE,
    NodeRejectedError,
    NodeSpec,
    ObservedNode,
    ObservedState,
    SchedulerError,
)
from dlrover.master.scheduler.ray.cluster import (
    AgentFate,
    AgentLaunch,
    AgentReport,
    RayApiCluster,
    RayCluster,
    RayNode,
    actor_request,
    node_shape,
)
from dlrover.master.scheduler.ray.settings import RaySettings

__all__ = ["REASON_ACTOR_DIED", "REASON_AGENT_START_FAILED", "RayScheduler", "dialable_address"]

_log = logging.getLogger(__name__)

REASON_ACTOR_DIED = "ActorDied"
"""The agent's actor died while its Ray node stayed alive (its process killed): the node's own failure."""
REASON_AGENT_START_FAILED = "AgentStartFailed"
"""The actor could not start the agent command."""


@attrs.define
class _JobNode:
    spec: NodeSpec
    request: dict[str, float]
    ray_node: str = ""  # where its actor was placed; "" while it waits for room
    stopping: bool = False
    stop_done: bool = False  # its agent and actor are gone after a stop (its Ray node takes another again)
    ended: ObservedNode | None = None  # its final observation, once it ended
    suspect_since: float | None = None  # when its actor was first reported dead or unreachable on a live node
    suspect_error: str = ""


def _fits(node: RayNode, request: Mapping[str, float]) -> bool:
    return all(node.resources.get(name, 0.0) >= amount for name, amount in request.items())


class RayScheduler:
    """Agents as Ray actors, one per Ray node.

    Args:
        command: argv of the agent; the node's environment tells it who it is.
        cluster: the Ray cluster (`RayApiCluster` connects to one; tests pass a fake).
        settings: the timeouts and the agent's default CPUs.
        node_resources: what each job node asks for (None: `settings.agent_cpus` CPUs): the actor's
            resource request, and what capacity is counted in.
        clock: time source of the death confirmation (injectable for tests).
        watch: run the thread that wakes the master on agent exits and node-table changes.
    """

    name = "ray"
    relaunches_nodes = True

    def __init__(
        self,
        command: Sequence[str],
        cluster: RayCluster,
        *,
        settings: RaySettings | None = None,
        node_resources: Resources | None = None,
        clock: Clock | None = None,
        watch: bool = True,
    ) -> None:
        if not command:
            raise ConfigError("the Ray backend needs an agent command, got an empty one")
        self._command = list(command)
        self._cluster = cluster
        self._settings = settings or RaySettings()
        self._request = actor_request(node_resources, self._settings.agent_cpus)
        self._clock = clock or SystemClock()
        self._lock = threading.Lock()
        self._nodes: dict[int, _JobNode] = {}
        # Nodes a previous master's journal holds alive, whose actors ended with that master (`adopt`).
        self._adopted_gone: dict[int, ObservedNode] = {}
        self._listeners: list[Callable[[], None]] = []
        self._stoppers: list[threading.Thread] = []
        self._closed = threading.Event()
        self._last_alive: dict[str, RayNode] = {}
        self._watcher: threading.Thread | None = None
        if watch:
            self._watcher = threading.Thread(target=self._watch, name="dlrover-ray-watch", daemon=True)
            self._watcher.start()

    @classmethod
    def connect(
        cls,
        command: Sequence[str],
        settings: RaySettings,
        *,
        job_name: str,
        node_resources: Resources | None = None,
    ) -> RayScheduler:
        """Connect to the cluster `settings.address` names (or use this process's connection) and refuse,
        before anything starts, node resources no alive Ray node has.

        Raises:
            ConfigError: no cluster there, an unsupported Ray, or resources no node can provide.
        """
        cluster = RayApiCluster(settings, job_name)
        try:
            backend = cls(command, cluster, settings=settings, node_resources=node_resources)
        except BaseException:
            cluster.close()
            raise
        try:
            backend.check_any_node_fits()
        except BaseException:
            backend.close()
            raise
        return backend

    # ------------------------------------------------------------------ the cluster

    def _alive(self) -> dict[str, RayNode]:
        if self._closed.is_set():
            return self._last_alive  # the connection is gone: what was seen last (status after the job)
        alive = {node.node_id: node for node in self._cluster.nodes() if node.alive}
        self._last_alive = alive
        return alive

    def check_any_node_fits(self) -> None:
        """Refuse a node request that no alive Ray node could ever hold.

        Raises:
            ConfigError: naming the request and the largest nodes there are.
        """
        alive = self._alive()
        if any(_fits(node, self._request) for node in alive.values()):
            return
        shapes = sorted({node_shape(node).describe() for node in alive.values()}) or ["none alive"]
        raise ConfigError(
            f"no Ray node can hold an agent asking for {_describe(self._request)}: the cluster's nodes have "
            f"{', '.join(shapes)}"
        )

    def largest_node(self) -> Resources:
        """The most of each resource any alive Ray node has (see `NodeShapeLimit`)."""
        shapes = [node_shape(node) for node in self._alive().values()]
        return Resources(
            cpu=max((s.cpu for s in shapes), default=0.0),
            memory_mb=max((s.memory_mb for s in shapes), default=0),
            gpu=max((s.gpu for s in shapes), default=0),
        )

    def _active(self, node: _JobNode) -> bool:
        return node.ended is None and not node.stopping

    def _held_ray_nodes(self) -> set[str]:
        return {n.ray_node for n in self._nodes.values() if n.ray_node and self._active(n)}

    def _busy_ray_nodes(self) -> set[str]:
        """Ray nodes an agent of this job still runs on: held, or one being stopped (in its grace period)."""
        stopping = {n.ray_node for n in self._nodes.values() if n.ray_node and n.stopping and not n.stop_done}
        return self._held_ray_nodes() | stopping

    def capacity(self) -> int | None:
        """Ray nodes that could take one more agent, less the launches still waiting for one."""
        alive = self._alive()
        with self._lock:
            held = self._held_ray_nodes()
            free = sum(1 for node_id, node in alive.items() if node_id not in held and _fits(node, self._request))
            waiting = sum(1 for n in self._nodes.values() if not n.ray_node and self._active(n))
        return free - waiting

    def placed_host(self, node_id: int) -> str:
        """The Ray node id the node's actor was placed on; "" while it waits (see `NodePlacement`)."""
        with self._lock:
            node = self._nodes.get(node_id)
            return node.ray_node if node is not None else ""

    # ------------------------------------------------------------------ launch and stop

    def _agent_env(self, spec: NodeSpec) -> dict[str, str]:
        env = dict(spec.env)
        if self._settings.master_address:
            env[MASTER_ADDR_ENV_VAR] = self._settings.master_address
        elif env.get(MASTER_ADDR_ENV_VAR):
            env[MASTER_ADDR_ENV_VAR] = dialable_address(env[MASTER_ADDR_ENV_VAR], self._cluster.driver_address())
        token_file = env.pop(TOKEN_FILE_ENV_VAR, None)
        if token_file:
            # The file is on the master's host; the agent may run on another: it gets the token itself.
            env[TOKEN_ENV_VAR] = load_token(token_file=token_file)
        return env

    def _unreachable_master(self, env: Mapping[str, str], target: RayNode) -> str:
        """Why an agent on `target` could not dial the master address in `env` ("" when it can)."""
        host = env.get(MASTER_ADDR_ENV_VAR, "").rpartition(":")[0].strip("[]")
        if host not in ("127.0.0.1", "::1", "localhost"):
            return ""
        here = self._cluster.driver_address()
        if not here or not target.address or target.address == here:
            return ""
        return (
            f"the master listens on {host}, which an agent on Ray node {target.node_id} ({target.address}, another "
            f"host than the master's {here}) cannot dial: start the master with --bind-address 0.0.0.0 or give "
            "--ray-master-address"
        )

    def _place(self, node: _JobNode, alive: Mapping[str, RayNode], *, launching: bool = False) -> str | None:
        """Start `node`'s actor on a Ray node that can take it (lock held); None: the reason none can.

        A Ray node whose agent could not dial the master (a master on loopback, the Ray node on another host)
        cannot take it. When that is all there is room on: `launching` (the master's launch) refuses the node
        for good, since the master's address is the same at every try; a node already waiting for room stays
        pending with that reason, which the pending timeout acts on.

        Raises:
            NodeRejectedError: `launching`, and only Ray nodes the agent could not dial the master from fit.
            SchedulerError: the actor cannot be started there (nothing is recorded).
        """
        busy = self._busy_ray_nodes()
        avoided = too_small = 0
        unreachable = ""
        env: dict[str, str] | None = None
        for ray_id in sorted(alive):
            if ray_id in node.spec.avoid_hosts:
                avoided += 1
            elif ray_id in busy:
                continue
            elif not _fits(alive[ray_id], node.request):
                too_small += 1
            else:
                env = self._agent_env(node.spec) if env is None else env
                why = self._unreachable_master(env, alive[ray_id])
                if why:
                    unreachable = unreachable or why
                    continue
                log_dir = self._settings.log_dir
                log_path = str(Path(log_dir) / f"node-{node.spec.node_id}.log") if log_dir else None
                self._cluster.start_agent(
                    AgentLaunch(node.spec.node_id, ray_id, node.request, self._command, env, log_path)
                )
                node.ray_node = ray_id
                _log.info("node %d: agent actor placed on Ray node %s", node.spec.node_id, ray_id)
                return None
        if unreachable and launching:
            raise NodeRejectedError(unreachable)
        reason = (
            f"no Ray node can take node {node.spec.node_id} ({_describe(node.request)}): {len(alive)} alive, "
            f"{len(busy)} hold this job's agents, {avoided} avoided, {too_small} too small"
        )
        return f"{reason}; and {unreachable}" if unreachable else reason

    def launch(self, spec: NodeSpec) -> None:
        """Place the node's agent actor on a free Ray node, or have it wait for one (pending)."""
        alive = self._alive()
        with self._lock:
            if self._closed.is_set():
                raise SchedulerError("the Ray backend is closed")
            if spec.node_id in self._nodes or spec.node_id in self._adopted_gone:
                raise SchedulerError(f"node {spec.node_id} was already launched")
            request = actor_request(spec.resources, self._settings.agent_cpus) if spec.resources else self._request
            node = _JobNode(spec, request)
            self._place(node, alive, launching=True)  # raises SchedulerError: nothing recorded
            self._nodes[spec.node_id] = node

    def adopt(self, node_ids: Iterable[int]) -> None:
        """Take over the nodes a previous master's journal holds alive (see `AdoptsNodes`): their agents'
        actors belonged to that master's Ray driver and ended with it (Ray ends an actor whose owner is
        gone), so each is reported FAILED, `Deleted`, a disruption, at the next `observe()`: relaunched at
        once without a charge, rather than charged once its heartbeats time out."""
        with self._lock:
            for node_id in node_ids:
                if node_id in self._nodes or node_id in self._adopted_gone:
                    continue
                self._adopted_gone[node_id] = ObservedNode(
                    node_id,
                    ObservedState.FAILED,
                    reason=REASON_DELETED,
                    evidence="its agent's Ray actor belonged to the previous master's Ray driver and ended with it",
                    disruption=True,
                )

    def stop(self, node_id: int) -> None:
        """Stop the node's agent (SIGTERM, SIGKILL after the grace) and end its actor, in the background."""
        with self._lock:
            node = self._nodes.get(node_id)
            if node is None or node.stopping or node.ended is not None:
                return
            node.stopping = True
            if not node.ray_node:
                return  # never placed: nothing runs
            stopper = threading.Thread(
                target=self._stop_agent, args=(node,), name=f"dlrover-ray-stop-{node_id}", daemon=True
            )
            self._stoppers.append(stopper)
        stopper.start()

    def _stop_agent(self, node: _JobNode) -> None:
        try:
            self._cluster.stop_agent(node.spec.node_id, self._settings.stop_grace_s)
        finally:
            with self._lock:
                node.stop_done = True

    # ------------------------------------------------------------------ observe

    def observe(self) -> Mapping[int, ObservedNode]:
        """Every node launched, as Ray shows it now; waiting launches are placed where room appeared."""
        alive = self._alive()
        with self._lock:
            seen = {node_id: self._observe_node(node, alive) for node_id, node in self._nodes.items()}
            return {**self._adopted_gone, **seen}

    def _observe_node(self, node: _JobNode, alive: Mapping[str, RayNode]) -> ObservedNode:
        node_id = node.spec.node_id
        if node.ended is not None:
            return node.ended
        if node.stopping:
            return ObservedNode(node_id, ObservedState.STOPPED, host=node.ray_node)
        if not node.ray_node:
            try:
                reason = self._place(node, alive)
            except SchedulerError as exc:
                observed = ObservedNode(
                    node_id, ObservedState.FAILED, reason=REASON_AGENT_START_FAILED, evidence=str(exc)
                )
                return self._end(node, observed)
            if reason is not None:
                return ObservedNode(node_id, ObservedState.PENDING, reason=REASON_UNSCHEDULABLE, evidence=reason)
        return self._observe_placed(node, alive)

    def _observe_placed(self, node: _JobNode, alive: Mapping[str, RayNode]) -> ObservedNode:
        node_id, host = node.spec.node_id, node.ray_node
        report = self._cluster.report(node_id)
        if report.fate is AgentFate.PENDING:
            if host not in alive:
                return self._end(node, self._lost(node, "before its agent actor started"))
            return ObservedNode(node_id, ObservedState.PENDING, host=host)
        if report.fate is AgentFate.RUNNING:
            node.suspect_since = None
            return ObservedNode(node_id, ObservedState.RUNNING, host=host)
        if report.fate is AgentFate.EXITED:
            code = report.exit_code
            state = ObservedState.SUCCEEDED if code == 0 else ObservedState.FAILED
            return self._end(node, ObservedNode(node_id, state, exit_code=code, host=host))
        if report.fate is AgentFate.START_FAILED:
            observed = ObservedNode(
                node_id, ObservedState.FAILED, host=host, reason=REASON_AGENT_START_FAILED, evidence=report.error
            )
            return self._end(node, observed)
        return self._observe_gone(node, report, alive)

    def _observe_gone(self, node: _JobNode, report: AgentReport, alive: Mapping[str, RayNode]) -> ObservedNode:
        """An actor Ray reports dead or unreachable: a dead Ray node explains it; else confirm before calling
        it the node's own failure."""
        node_id, host = node.spec.node_id, node.ray_node
        if host not in alive:
            return self._end(node, self._lost(node, report.error))
        if report.fate is AgentFate.UNREACHABLE:
            # Maybe dead, maybe a blip: asked again (answered at a later observe). Never charged for that
            # alone; an agent that stays silent fails on the master's heartbeat timeout.
            report = self._cluster.recheck(node_id)
            if report.fate in (AgentFate.RUNNING, AgentFate.UNREACHABLE):
                return ObservedNode(node_id, ObservedState.RUNNING, host=host)
            if report.fate is not AgentFate.DIED:
                return self._observe_placed(node, alive)
        now = self._clock.now()
        if node.suspect_since is None:
            node.suspect_since, node.suspect_error = now, report.error
        if now - node.suspect_since < self._settings.death_confirm_s:
            return ObservedNode(node_id, ObservedState.RUNNING, host=host)  # not decided yet
        evidence = report.error or node.suspect_error
        observed = ObservedNode(
            node_id,
            ObservedState.FAILED,
            host=host,
            reason=REASON_ACTOR_DIED,
            evidence=f"the agent's actor on Ray node {host} is gone while the node lives: {evidence}",
        )
        return self._end(node, observed)

    def _lost(self, node: _JobNode, error: str) -> ObservedNode:
        evidence = f"Ray node {node.ray_node} died (the cluster's node table shows it dead)"
        return ObservedNode(
            node.spec.node_id,
            ObservedState.FAILED,
            host=node.ray_node,
            reason=REASON_NODE_LOST,
            evidence=f"{evidence}: {error}" if error else evidence,
            disruption=True,
        )

    def _end(self, node: _JobNode, observed: ObservedNode) -> ObservedNode:
        node.ended = observed
        # An actor outlives its agent until ended: it would hold its Ray node's resources from the next launch.
        self._cluster.release(node.spec.node_id)
        spec = node.spec
        _log.info("node %d ended: %s %s %s", spec.node_id, observed.state.value, observed.reason, observed.evidence)
        return observed

    # ------------------------------------------------------------------ changes

    def on_change(self, listener: Callable[[], None]) -> None:
        """Call `listener` when an agent exits or the cluster's nodes change (see `ReportsChanges`)."""
        with self._lock:
            self._listeners.append(listener)

    def _watch(self) -> None:
        seen: frozenset[str] | None = None
        while not self._closed.is_set():
            changed = False
            try:
                changed = self._cluster.wait(self._settings.poll_interval_s)
                alive = frozenset(self._alive())
            except Exception:  # a lost connection must not end the watch; observe says what failed
                _log.warning("the Ray watch failed; retrying", exc_info=True)
                self._closed.wait(self._settings.poll_interval_s)
                continue
            if seen is not None and alive != seen:
                changed = True
            seen = alive
            if not changed:
                # Nothing to wait on (no actor yet) returns at once: wait the interval here instead.
                self._closed.wait(self._settings.poll_interval_s)
                continue
            with self._lock:
                listeners = tuple(self._listeners)
            for listener in listeners:
                listener()

    def close(self) -> None:
        """Stop every agent still running (SIGTERM, then SIGKILL after the grace), end every actor, and release
        the cluster; safe to call twice."""
        with self._lock:
            if self._closed.is_set():
                return
            self._closed.set()
            active = [n for n in self._nodes.values() if self._active(n)]
            running = [n for n in active if n.ray_node]
            for node in active:
                node.stopping = True
            stoppers = list(self._stoppers)
        for node in running:
            stopper = threading.Thread(
                target=self._stop_agent, args=(node,), name=f"dlrover-ray-stop-{node.spec.node_id}", daemon=True
            )
            stopper.start()
            stoppers.append(stopper)
        for stopper in stoppers:
            stopper.join()
        if self._watcher is not None:
            self._watcher.join()
        self._cluster.close()


def dialable_address(address: str, here: str = "") -> str:
    """`address` with a wildcard host (a master bound to every interface) replaced by `here` (the address of
    the Ray node the master is attached to), else by this host's outgoing address."""
    host, sep, port = address.rpartition(":")
    if not sep or host.strip("[]") not in ("0.0.0.0", "::", ""):  # noqa: S104 (compared, not bound)
        return address
    if here:
        return f"{here}:{port}"
    with contextlib.suppress(OSError), socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect(("192.0.2.1", 9))  # TEST-NET-1: no packet is sent; the kernel picks the outgoing interface
        return f"{probe.getsockname()[0]}:{port}"
    return f"{socket.gethostbyname(socket.gethostname())}:{port}"


def _describe(request: Mapping[str, float]) -> str:
    parts = []
    for name, amount in sorted(request.items()):
        if name == "memory":
            parts.append(f"memory {amount / (1024 * 1024):.0f}MiB")
        else:
            parts.append(f"{name} {amount:g}")
    return ", ".join(parts) or "nothing"
