"""The Ray cluster as the backend sees it: its node table and one agent actor per job node.

`RayCluster` is the Protocol the backend drives; `RayApiCluster` implements it with Ray's public
API (`ray.init`, `ray.nodes`, actors placed by `NodeAffinitySchedulingStrategy`, `ray.wait`,
`ray.kill`), and is the only module of the backend that imports `ray`.
`dlrover.master.scheduler.ray.fake.FakeRayCluster` implements it in memory for tests;
tests/ray/test_ray_backend_contract.py checks on a real cluster that Ray does what the fake plays.
"""

from __future__ import annotations

import contextlib
import enum
import logging
import secrets
import socket
import threading
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import attrs

from dlrover.autoscale import Resources
from dlrover.common import ConfigError
from dlrover.master.scheduler.base import SchedulerError
from dlrover.master.scheduler.ray.settings import SUPPORTED_RAY_VERSIONS, RaySettings

__all__ = [
    "AgentFate",
    "AgentLaunch",
    "AgentReport",
    "RayApiCluster",
    "RayCluster",
    "RayNode",
    "actor_request",
    "node_shape",
]

_log = logging.getLogger(__name__)

_MIB = 1024 * 1024


@attrs.frozen
class RayNode:
    """One Ray node in the cluster's node table.

    Attributes:
        node_id: Ray's node id (hex): the key, never the IP (every node on one host shares it).
        alive: whether the cluster counts it alive.
        resources: what it has in total (Ray's names: `CPU`, `GPU`, `memory` in bytes, custom ones).
        address: its IP (evidence only).
    """

    node_id: str
    alive: bool
    resources: Mapping[str, float] = attrs.field(factory=dict)
    address: str = ""


class AgentFate(enum.Enum):
    """What became of an agent actor."""

    PENDING = "pending"
    """Its actor is not placed yet (waiting for the node's resources) or its agent not started yet."""
    RUNNING = "running"
    EXITED = "exited"
    """The agent process exited; `exit_code` says how."""
    START_FAILED = "start_failed"
    """The actor ran but could not start the agent (the command cannot be run)."""
    DIED = "died"
    """Ray says the actor died (its process killed, or its node gone)."""
    UNREACHABLE = "unreachable"
    """Ray cannot reach the actor now: maybe dead, maybe not (confirm before acting)."""


@attrs.frozen
class AgentReport:
    """An agent actor's fate; `exit_code` for EXITED, `error` for the others that ended."""

    fate: AgentFate
    exit_code: int | None = None
    error: str = ""


@attrs.frozen
class AgentLaunch:
    """One agent actor to create.

    Attributes:
        node_id: the job node it serves (its actor is named after it).
        ray_node: the Ray node id it is pinned to.
        request: the Ray resources it asks for (`actor_request`).
        command: the agent's argv.
        env: added to the actor's environment for the agent.
        log_path: the agent's output file on that node; None: the actor's own Ray log.
    """

    node_id: int
    ray_node: str
    request: Mapping[str, float]
    command: Sequence[str]
    env: Mapping[str, str]
    log_path: str | None = None


def node_shape(node: RayNode) -> Resources:
    """A Ray node's totals as `Resources` (memory from bytes to MiB; accelerators of no stated type)."""
    return Resources(
        cpu=float(node.resources.get("CPU", 0.0)),
        memory_mb=int(node.resources.get("memory", 0.0) // _MIB),
        gpu=int(node.resources.get("GPU", 0.0)),
    )


def actor_request(resources: Resources | None, default_cpus: float) -> dict[str, float]:
    """The Ray resources an agent actor asks for: the node's resources, else `default_cpus` CPUs."""
    if resources is None:
        return {"CPU": default_cpus}
    request = {"CPU": resources.cpu}
    if resources.memory_mb:
        request["memory"] = float(resources.memory_mb * _MIB)
    if resources.gpu:
        request["GPU"] = float(resources.gpu)
    return request


@runtime_checkable
class RayCluster(Protocol):
    """A Ray cluster that runs one agent actor per job node. Safe to call from several threads."""

    def nodes(self) -> Sequence[RayNode]:
        """The cluster's node table (dead nodes included while the cluster remembers them)."""
        ...

    def start_agent(self, launch: AgentLaunch) -> None:
        """Create the agent actor `launch` describes and have it start the agent; returns once asked
        for, not once running.

        Raises:
            SchedulerError: the actor cannot even be asked for.
        """
        ...

    def report(self, node_id: int) -> AgentReport:
        """What became of the agent of `node_id`, without blocking."""
        ...

    def recheck(self, node_id: int) -> AgentReport:
        """After UNREACHABLE: ask the actor again, without blocking (a ping sent now is read at a later call);
        RUNNING once it answered (its exit is watched anew), DIED when Ray says it died, UNREACHABLE while
        Ray cannot tell yet."""
        ...

    def driver_address(self) -> str:
        """The IP of the Ray node this process is attached to ("" when unknown)."""
        ...

    def wait(self, timeout_s: float) -> bool:
        """Block until an agent's fate may have changed (True) or `timeout_s` passed (False)."""
        ...

    def stop_agent(self, node_id: int, grace_s: float) -> None:
        """SIGTERM the agent, SIGKILL it after `grace_s`, then end its actor; blocks until done (bounded)."""
        ...

    def release(self, node_id: int) -> None:
        """End the actor of an agent that ended, so its Ray node's resources are free again; never blocks."""
        ...

    def close(self) -> None:
        """End every actor and release the cluster connection (if this object made it)."""
        ...


def check_ray_version(version: str) -> None:
    """Refuse a Ray outside `SUPPORTED_RAY_VERSIONS`.

    Raises:
        ConfigError: naming the version found and the range supported.
    """
    try:
        found = tuple(int(part) for part in version.split(".")[:2])
    except ValueError as exc:
        raise ConfigError(f"cannot read the Ray version {version!r}") from exc
    low, high = SUPPORTED_RAY_VERSIONS
    if not low <= found < high:
        raise ConfigError(
            f"Ray {version} is not supported: the Ray backend runs on Ray {low[0]}.{low[1]} up to, not "
            f"including, {high[0]}.{high[1]}"
        )


def check_reachable(address: str, timeout_s: float) -> None:
    """Refuse an address with nothing listening, before `ray.init` waits its own minute.

    Raises:
        ConfigError: naming the address and why it cannot be reached.
    """
    if address == "auto":
        return  # Ray finds the cluster itself and says what it found
    host, sep, port_text = address.removeprefix("ray://").rpartition(":")
    if not sep:
        return
    try:
        port = int(port_text)
    except ValueError as exc:
        raise ConfigError(f"the Ray address {address!r} has no port number") from exc
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            pass
    except OSError as exc:
        raise ConfigError(f"no Ray cluster at {address}: cannot connect to {host}:{port} ({exc})") from exc


_ACTOR_THREADS = 16
"""Calls an agent actor serves at once: `wait_exit` holds one for the agent's life (more after a connection
blip, when it is asked again), `stop` and `ping` must still be answered."""


class _Agent:
    """One actor's handles: the call that starts its agent, then the call that waits for its exit, and a ping
    in flight after Ray could not reach it."""

    def __init__(self, actor: Any, start_ref: Any) -> None:
        self.actor = actor
        self.start_ref = start_ref
        self.exit_ref: Any = None
        self.ping_ref: Any = None
        self.final: AgentReport | None = None


class RayApiCluster:
    """`RayCluster` on a real cluster through Ray's public API.

    Args:
        settings: the address, namespace, temp dir and timeouts.
        job_name: names the job's actors (`dlrover-<job>-node-<id>`) and, by default, their namespace.

    Raises:
        ConfigError: Ray is not installed or not a supported version, or there is no cluster at the address.
    """

    def __init__(self, settings: RaySettings, job_name: str) -> None:
        try:
            import ray
        except ImportError as exc:
            raise ConfigError(
                "the Ray backend needs Ray: pip install 'dlrover-master[ray]' (ray 2.40 or newer)"
            ) from exc
        check_ray_version(ray.__version__)
        self._ray: Any = ray  # Ray's own annotations are partial: its calls are checked by the tests
        self._job = job_name
        self._settings = settings
        self._namespace = settings.namespace or f"dlrover-{job_name}"
        self._owns_connection = not ray.is_initialized()
        if self._owns_connection:
            check_reachable(settings.address, settings.connect_timeout_s)
            init_args: dict[str, Any] = {
                "address": settings.address,
                "namespace": self._namespace,
                "log_to_driver": False,
                "configure_logging": False,
            }
            if settings.temp_dir is not None:
                init_args["_temp_dir"] = settings.temp_dir
            try:
                ray.init(**init_args)
            except Exception as exc:  # Ray raises many kinds; the user needs one sentence
                raise ConfigError(f"cannot connect to a Ray cluster at {settings.address}: {exc}") from exc
        from dlrover.master.scheduler.ray.actor import NodeAgentActor

        self._actor_class: Any = ray.remote(NodeAgentActor)
        self._lock = threading.Lock()
        self._agents: dict[int, _Agent] = {}
        self._announced: set[Any] = set()  # refs `wait` reported ready: not waited for again
        self._run_id = secrets.token_hex(4)
        self._closed = False

    def nodes(self) -> Sequence[RayNode]:
        return [
            RayNode(
                node_id=str(entry.get("NodeID", "")),
                alive=bool(entry.get("Alive", False)),
                resources={str(k): float(v) for k, v in dict(entry.get("Resources") or {}).items()},
                address=str(entry.get("NodeManagerAddress", "")),
            )
            for entry in self._ray.nodes()
        ]

    def start_agent(self, launch: AgentLaunch) -> None:
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        options: dict[str, Any] = {
            # The run id: a second master of a job of the same name (on the same cluster) gets its own actors.
            "name": f"dlrover-{self._job}-{self._run_id}-node-{launch.node_id}",
            "namespace": self._namespace,
            "max_restarts": 0,  # the master decides every relaunch
            "max_task_retries": 0,
            "max_concurrency": _ACTOR_THREADS,
            "num_cpus": float(launch.request.get("CPU", 0.0)),
            "scheduling_strategy": NodeAffinitySchedulingStrategy(node_id=launch.ray_node, soft=False),
        }
        if launch.request.get("GPU"):
            options["num_gpus"] = float(launch.request["GPU"])
        if launch.request.get("memory"):
            options["memory"] = float(launch.request["memory"])
        custom = {k: v for k, v in launch.request.items() if k not in ("CPU", "GPU", "memory")}
        if custom:
            options["resources"] = custom
        with self._lock:
            if launch.node_id in self._agents:
                raise SchedulerError(f"node {launch.node_id} has an agent actor already")
            try:
                actor = self._actor_class.options(**options).remote()
                start_ref = actor.start.remote(list(launch.command), dict(launch.env), launch.log_path)
            except Exception as exc:  # Ray raises many kinds; the caller gets one
                raise SchedulerError(
                    f"cannot create the agent actor of node {launch.node_id} on Ray node {launch.ray_node}: {exc}"
                ) from exc
            self._agents[launch.node_id] = _Agent(actor, start_ref)

    def _resolve(self, agent: _Agent) -> AgentReport:
        """The agent's fate from its outstanding call (lock held; never blocks)."""
        if agent.final is not None:
            return agent.final
        ref = agent.exit_ref if agent.exit_ref is not None else agent.start_ref
        ready, _ = self._ray.wait([ref], timeout=0)
        if not ready:
            return AgentReport(AgentFate.RUNNING if agent.exit_ref is not None else AgentFate.PENDING)
        self._announced.discard(ref)
        value, report = self._result(ref)
        if report is not None:
            if report.fate is not AgentFate.UNREACHABLE:
                agent.final = report
            return report
        if agent.exit_ref is None:
            agent.exit_ref = agent.actor.wait_exit.remote()  # started: now watch for its exit
            return AgentReport(AgentFate.RUNNING)
        agent.final = AgentReport(AgentFate.EXITED, exit_code=int(value))
        return agent.final

    def _result(self, ref: Any) -> tuple[Any, AgentReport | None]:
        """A finished call's value, or the report its error makes."""
        errors = self._ray.exceptions
        try:
            return self._ray.get(ref, timeout=0), None
        except errors.ActorUnavailableError as exc:
            return None, AgentReport(AgentFate.UNREACHABLE, error=str(exc))
        except errors.RayActorError as exc:
            return None, AgentReport(AgentFate.DIED, error=str(exc))
        except errors.RayTaskError as exc:  # the actor's start raised: the command cannot run
            return None, AgentReport(AgentFate.START_FAILED, error=str(exc.cause if exc.cause else exc))
        except errors.RayError as exc:
            # Anything else Ray says of the call (the actor unschedulable on a node that died, its worker
            # failing to start): the actor is gone; the node table tells lost from charged.
            return None, AgentReport(AgentFate.DIED, error=f"{type(exc).__name__}: {exc}")

    def _agent(self, node_id: int) -> _Agent:
        agent = self._agents.get(node_id)
        if agent is None:
            raise SchedulerError(f"node {node_id} has no agent actor")
        return agent

    def report(self, node_id: int) -> AgentReport:
        with self._lock:
            return self._resolve(self._agent(node_id))

    def recheck(self, node_id: int) -> AgentReport:
        with self._lock:
            agent = self._agent(node_id)
            if agent.final is not None:
                return agent.final
            if agent.ping_ref is None:
                agent.ping_ref = agent.actor.ping.remote()
                return AgentReport(AgentFate.UNREACHABLE, error="asked again; no answer yet")
            ready, _ = self._ray.wait([agent.ping_ref], timeout=0)
            if not ready:
                return AgentReport(AgentFate.UNREACHABLE, error="asked again; no answer yet")
            ping, agent.ping_ref = agent.ping_ref, None
            _, report = self._result(ping)
            if report is None:
                # It answered: the exit call was lost with the connection; watch the running agent anew.
                agent.exit_ref = agent.actor.wait_exit.remote()
                return AgentReport(AgentFate.RUNNING)
            if report.fate is not AgentFate.UNREACHABLE:
                agent.final = report
            return report

    def driver_address(self) -> str:
        try:
            return str(self._ray.util.get_node_ip_address())
        except Exception:  # an address is a hint for a message; never worth failing for
            return ""

    def wait(self, timeout_s: float) -> bool:
        with self._lock:
            refs = [
                ref
                for agent in self._agents.values()
                if agent.final is None
                for ref in [agent.exit_ref if agent.exit_ref is not None else agent.start_ref]
                if ref not in self._announced
            ]
        if not refs:
            return False
        ready, _ = self._ray.wait(refs, num_returns=1, timeout=timeout_s)
        with self._lock:
            self._announced.update(ready)
        return bool(ready)

    def stop_agent(self, node_id: int, grace_s: float) -> None:
        errors = self._ray.exceptions
        with self._lock:
            agent = self._agents.get(node_id)
        if agent is None:
            return
        if agent.final is None and agent.exit_ref is not None:
            with contextlib.suppress(errors.RayError):
                # Bounded: the actor SIGKILLs the agent after the grace; the margin covers Ray's round trip.
                self._ray.get(agent.actor.stop.remote(grace_s), timeout=grace_s + self._settings.call_timeout_s)
        with contextlib.suppress(errors.RayError, ValueError):
            self._ray.kill(agent.actor, no_restart=True)

    def release(self, node_id: int) -> None:
        with self._lock:
            agent = self._agents.get(node_id)
        if agent is not None:
            with contextlib.suppress(self._ray.exceptions.RayError, ValueError):
                self._ray.kill(agent.actor, no_restart=True)

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            agents = list(self._agents.values())
        for agent in agents:
            with contextlib.suppress(self._ray.exceptions.RayError, ValueError):
                self._ray.kill(agent.actor, no_restart=True)
        if self._owns_connection:
            self._ray.shutdown()
