"""The scheduler Protocol: how the master gets nodes started, stopped and observed.

Local processes, external agents, and later Ray actors and Kubernetes pods all sit behind it.
A backend only does what it is told and reports what it sees; every decision stays in the
lifecycle core.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Mapping
from typing import Protocol, runtime_checkable

import attrs

from dlrover.autoscale import Resources, Role
from dlrover.common import ConfigError, DLRoverError

__all__ = [
    "MASTER_ADDR_ENV_VAR",
    "REASON_DEADLINE_EXCEEDED",
    "REASON_DELETED",
    "REASON_EVICTED",
    "REASON_NODE_LOST",
    "REASON_OOM_KILLED",
    "REASON_PREEMPTED",
    "REASON_QUOTA_EXCEEDED",
    "REASON_UNSCHEDULABLE",
    "AdjustableCapacity",
    "AdoptsNodes",
    "BackendUnavailableError",
    "HandsOverNodes",
    "MemoryRecord",
    "NodeMemoryRecords",
    "NodeRejectedError",
    "NodePlacement",
    "NodeShapeLimit",
    "NodeSpec",
    "ObservedNode",
    "ReportsChanges",
    "ObservedState",
    "SchedulerBackend",
    "SchedulerError",
    "SingleHost",
    "check_node_fits",
]


MASTER_ADDR_ENV_VAR = "DLROVER_MASTER_ADDR"
"""The variable of `NodeSpec.env` that tells a node's agent where its master is (`host:port`)."""


class SchedulerError(DLRoverError):
    """A backend could not do what it was asked; the message says what and why."""


class NodeRejectedError(SchedulerError):
    """The platform refused the node's specification itself (Kubernetes: 422 Invalid, with its message): every
    relaunch would be refused the same way, so the master stops the job with the platform's words."""


class BackendUnavailableError(SchedulerError, ConfigError):
    """The backend's platform could not be reached, or kept failing, while the backend started (an API
    server answering 429 or 5xx past the retries, a broken connection, a Role not yet in force): nothing
    is wrong with the configuration, and a master started again later may well succeed (`dlrover-master`
    exits with its "retry" status, 75, for it)."""


@attrs.frozen
class NodeSpec:
    """What a backend needs to start one node.

    Attributes:
        job_name: the job.
        node_id: the node's unique id (the agent registers with it).
        rank: its logical rank (-1 for a warm spare, which holds none until it takes over one).
        relaunch_count: how many incarnations of the rank came before.
        avoid_hosts: hosts it must not be placed on.
        env: environment for the agent: master address, node id, token file.
        role: the node group it belongs to (`worker` today; `ps`, `chief`, `evaluator` for TensorFlow
            parameter-server jobs).
        resources: CPU, memory and accelerators (with their type) to give it; None when the job asks for
            nothing (the backend's default and no limit). A backend that cannot honour a part says so
            (see `NodeShapeLimit`) rather than ignore it.
    """

    job_name: str
    node_id: int
    rank: int
    relaunch_count: int = 0
    avoid_hosts: frozenset[str] = frozenset()
    env: Mapping[str, str] = attrs.field(factory=dict)
    role: Role = Role.WORKER
    resources: Resources | None = None


class ObservedState(enum.StrEnum):
    """What a backend sees of a node it launched."""

    PENDING = "pending"
    """Asked for, not yet running (a pod being scheduled, an agent nobody started yet)."""
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    """Exited with status 0."""
    FAILED = "failed"
    """Exited with a failure; `exit_code` says how."""
    STOPPED = "stopped"
    """Stopped because the master asked."""


# The platform's words a backend puts in `ObservedNode.reason` that the master acts on (a backend may report
# others, e.g. a container's own terminated or waiting reason: they are evidence only).
REASON_OOM_KILLED = "OOMKilled"
"""The kernel's OOM killer ended the node at its memory limit: decided as host OOM (more memory next time)."""
REASON_EVICTED = "Evicted"
"""The platform evicted the node (node pressure, the eviction API): a disruption."""
REASON_PREEMPTED = "Preempted"
"""The platform's scheduler took the node's place for another: a disruption."""
REASON_NODE_LOST = "NodeLost"
"""The host stopped answering: a disruption, and the relaunch avoids that host."""
REASON_DEADLINE_EXCEEDED = "DeadlineExceeded"
"""The node ran past its own deadline (a pod's activeDeadlineSeconds): the job's limit, charged."""
REASON_UNSCHEDULABLE = "Unschedulable"
"""The node cannot be placed (pending): the evidence carries the scheduler's message."""
REASON_QUOTA_EXCEEDED = "QuotaExceeded"
"""The platform refused to create the node for now (a namespace's ResourceQuota is used up): pending, the
evidence carries the platform's message, and the create is retried until the pending timeout decides."""
REASON_DELETED = "Deleted"
"""Someone other than the master removed the node, for no reason it shows: a disruption."""


@attrs.frozen
class ObservedNode:
    """One node as a backend sees it.

    Attributes:
        node_id: the node.
        state: what the backend sees.
        exit_code: the exit status once it ended (negative: killed by that signal).
        host: where it runs, if the backend knows.
        reason: the platform's word for why it ended or waits (`OOMKilled`, `Evicted`, `Preempted`,
            `NodeLost`, `DeadlineExceeded`, `Unschedulable`, ...); empty when it has none.
        evidence: lines for the diagnosis: what the platform said (messages, exit codes, conditions).
        disruption: the platform took the node away (evicted, preempted, its host lost): not the job's
            fault, so it is relaunched without charging the failure budget.
    """

    node_id: int
    state: ObservedState
    exit_code: int | None = None
    host: str = ""
    reason: str = ""
    evidence: str = ""
    disruption: bool = False


@runtime_checkable
class SchedulerBackend(Protocol):
    """Starts, stops and observes nodes. Implementations must be safe to call from several threads."""

    @property
    def name(self) -> str:
        """The backend's name (`local`, `external`, ...)."""
        ...

    @property
    def relaunches_nodes(self) -> bool:
        """Whether `launch` starts a node itself. False (the external backend) only opens a slot
        that someone else's agent must fill: the master then restarts a failed node's processes
        rather than relaunch it while it has restarts left."""
        ...

    def capacity(self) -> int | None:
        """How many more nodes the backend could place now, beyond those it holds.

        None: unknown or unbounded (the external backend: whoever starts agents decides). Zero:
        full; a node launched now stays pending until room appears. Negative: the backend holds
        that many nodes more than it now has room for (its capacity was lowered or lost); the
        master gives that many back. Nodes the backend was told to stop do not count.
        """
        ...

    def launch(self, spec: NodeSpec) -> None:
        """Start a node; returns once it is requested, not once it runs.

        Raises:
            SchedulerError: it cannot be started (or a node with this id was launched before).
        """
        ...

    def stop(self, node_id: int) -> None:
        """Stop a node; idempotent, and a no-op for an unknown id."""
        ...

    def observe(self) -> Mapping[int, ObservedNode]:
        """Every node this backend launched, as it sees them now."""
        ...

    def close(self) -> None:
        """Stop every node still running and release everything; safe to call twice."""
        ...


@attrs.frozen
class MemoryRecord:
    """What the kernel recorded about one node's memory (its memory cgroup).

    Attributes:
        limit_mb: the limit the node ran under, in MiB.
        oom_kills: how many of its processes the kernel's OOM killer ended; None when unreadable.
        source: where it was read (the group's directory).
    """

    limit_mb: int
    oom_kills: int | None
    source: str


@runtime_checkable
class NodeMemoryRecords(Protocol):
    """A backend that limits a node's memory and can show the kernel's record of it (the local backend)."""

    @property
    def memory_enforcement(self) -> str:
        """A sentence: how node memory is limited, or why it is not (said once at the master's start)."""
        ...

    @property
    def enforces_memory(self) -> bool:
        """Whether a node's memory request becomes a limit the kernel enforces."""
        ...

    def memory_record(self, node_id: int) -> MemoryRecord | None:
        """The node's limit and OOM kill count; None for a node launched without a limit."""
        ...


@runtime_checkable
class ReportsChanges(Protocol):
    """A backend that says when what it observes may have changed (the Kubernetes backend, at each pod
    event of its watch), so the master observes at once instead of at its next tick: a lost node is acted
    on in milliseconds, not up to a tick interval later."""

    def on_change(self, listener: Callable[[], None]) -> None:
        """Call `listener` (quick, never blocking, from the backend's own thread) after each change."""
        ...


@runtime_checkable
class HandsOverNodes(Protocol):
    """A backend whose nodes outlive their master (the Kubernetes backend's pods): a master that is itself
    stopped by its platform (its pod deleted or evicted) leaves them to the master that replaces it."""

    def detach(self) -> None:
        """Release everything this master holds (watches, clients) and stop nothing: the nodes keep
        running for a successor. Safe to call twice; `close()` after it stops nothing either."""
        ...


@runtime_checkable
class AdoptsNodes(Protocol):
    """A backend that a master resuming its job tells which nodes its journal holds alive (the Kubernetes
    backend; the Ray backend, whose actors end with the master that owned them), so that a node whose pod
    vanished while no master watched is reported at once instead of waiting for the heartbeat or start
    timeout (which would also charge its failure to the job)."""

    def adopt(self, node_ids: Iterable[int]) -> None:
        """Take over `node_ids`, launched by a previous master: `observe()` reports each from now on, and one
        the backend found no trace of in its first look (its pod gone) as `FAILED`, reason `REASON_DELETED`,
        a disruption. Ids it already knows are left as they are."""
        ...


@runtime_checkable
class NodePlacement(Protocol):
    """A backend that knows which host it placed each node on (the Kubernetes backend: the pod's node).

    The master records that host for a registering node in place of the name its agent reports (inside a
    pod that is the pod's own host name), so a host avoided after a hardware fault or a straggler is one
    the backend can keep the relaunch off.
    """

    def placed_host(self, node_id: int) -> str:
        """The host the node runs on; "" when not known (yet)."""
        ...


@runtime_checkable
class NodeShapeLimit(Protocol):
    """A backend that knows the most any one of its nodes can ever have (this host, for the local backend)."""

    def largest_node(self) -> Resources:
        """The largest node this backend could ever place."""
        ...


@runtime_checkable
class SingleHost(Protocol):
    """A backend whose nodes all run on one host (the local backend): a relaunch that avoids that
    host cannot be placed, so replacing a slow node there cannot help."""

    @property
    def host(self) -> str:
        """The one host every node runs on."""
        ...


def check_node_fits(backend: object, resources: Resources | None, what: str = "node_resources") -> None:
    """Refuse `resources` that no node of `backend` could ever have (a backend that does not know: any).

    Raises:
        ConfigError: a value exceeds the largest node; the message names the value and the limit.
    """
    if resources is None or not isinstance(backend, NodeShapeLimit):
        return
    largest = backend.largest_node()
    exceeded = resources.exceeded_dimensions(largest)
    if exceeded:
        name = getattr(backend, "name", type(backend).__name__)
        raise ConfigError(
            f"{what} {resources.describe()} can never be provided by the {name} backend, whose largest node is "
            f"{largest.describe()}: {'; '.join(exceeded)}"
        )


@runtime_checkable
class AdjustableCapacity(Protocol):
    """A backend whose capacity a person sets while the job runs (the local backend's slots)."""

    def set_slots(self, slots: int | None) -> None:
        """Hold at most `slots` nodes from now on (None: unbounded).

        Raises:
            ConfigError: not None or a non-negative integer; nothing changed.
        """
        ...
