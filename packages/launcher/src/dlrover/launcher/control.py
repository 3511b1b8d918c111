"""What the agent needs from the job's control plane (the master and its rendezvous).

The agent talks to the master only through `ControlPlane`, so its loop is tested against the
in-memory `FakeControlPlane` and runs for real over gRPC through an adapter; both pass the same
contract.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple, Protocol

import attrs

from dlrover.diagnosis import ActionKind, Decision, PeerExcuse, RankStepStats
from dlrover.master.goodput import AttemptReport
from dlrover.rendezvous import WaitingCount

__all__ = [
    "ControlPlane",
    "FailureReport",
    "MasterAction",
    "NodeRegistration",
    "Progress",
    "ResourceUsage",
    "RoundAssignment",
]


class MasterAction(NamedTuple):
    """An action the master sent with a heartbeat answer.

    Attributes:
        kind: what to do.
        reason: why, in the master's words.
        planned_round: a restart for a planned round (a resize let nodes go), not for a failure,
            or the removal of a node a shrink let go: the agent has its workers seal a flash
            checkpoint before it restarts or stops them.
    """

    kind: ActionKind
    reason: str
    planned_round: bool = False


@attrs.frozen
class NodeRegistration:
    """What the master told a registering agent.

    Attributes:
        node_id: the node's id in the job.
        heartbeat_interval_s: how often to heartbeat.
    """

    node_id: str
    heartbeat_interval_s: float


@attrs.frozen
class RoundAssignment:
    """A completed rendezvous round as one node sees it.

    Attributes:
        round: the round number; rounds only increase.
        group_rank: this node's rank among nodes.
        group_world_size: nodes in the round.
        master_addr: where the round's torch.distributed store listens (MASTER_ADDR).
        master_port: its port (MASTER_PORT).
        agent_store: the agent of node rank 0 hosts that store and it listens already, so every
            worker is a client of it (`TORCHELASTIC_USE_AGENT_STORE=True`, as under torchrun);
            False: worker rank 0 starts the store in `init_process_group` on that free port.
        first_worker_rank: the global rank (RANK) of this node's local rank 0: the workers of the
            nodes ranked before it, which may each run a different number (see `worker_ranks`).
        worker_world_size: the workers of all nodes in the round (WORLD_SIZE).
    """

    round: int
    group_rank: int
    group_world_size: int
    master_addr: str
    master_port: int
    agent_store: bool = False
    first_worker_rank: int | None = None
    worker_world_size: int | None = None

    def worker_ranks(self, local_world_size: int) -> tuple[int, int]:
        """(RANK of this node's local rank 0, WORLD_SIZE) for a node running `local_world_size`.

        As the round says; an assignment that says nothing (built by hand, in tests) stands for
        a round whose every node runs `local_world_size` workers.
        """
        if self.first_worker_rank is None or self.worker_world_size is None:
            return self.group_rank * local_world_size, self.group_world_size * local_world_size
        return self.first_worker_rank, self.worker_world_size


@attrs.frozen
class ResourceUsage:
    """What one node's training uses, carried by heartbeats.

    Attributes:
        cpu_percent: CPU time of the agent and its workers since the previous sample, in percent
            of one core (400 is four cores busy).
        memory_bytes: anonymous resident memory of the agent and its workers (shared memory and
            file pages left out, so that nothing mapped by several processes counts twice).
        gpu_percent: mean utilisation of the node's GPUs (0 without GPU sampling).
        gpu_memory_bytes: GPU memory in use on the node (0 without GPU sampling).
    """

    cpu_percent: float = 0.0
    memory_bytes: int = 0
    gpu_percent: float = 0.0
    gpu_memory_bytes: int = 0


@attrs.frozen
class Progress:
    """Training progress of one node, carried by heartbeats.

    Attributes:
        step: newest finished step, -1 before the first. `dlrover-run` reports the newest step
            every local worker has finished by its step reports, or sealed as a flash
            checkpoint, whichever is newer.
        samples: samples consumed so far.
        resources: what the node uses; None sends no sample.
        rank_steps: the step stats of each local worker that reports its steps, batched to the
            master (its straggler detector compares ranks).
        attempts: step marks of local rank 0 not yet sent, per set of workers (the master's
            goodput accounting); see `dlrover.launcher.step_ledger`.
        excuses: the node's excuses for ranks of other nodes that wait on its own (a rank in a named
            phase, ranks found busy); see `StepWatch.excuses`.
    """

    step: int = -1
    samples: int = 0
    resources: ResourceUsage | None = None
    rank_steps: tuple[RankStepStats, ...] = ()
    attempts: tuple[AttemptReport, ...] = ()
    excuses: tuple[PeerExcuse, ...] = ()


@attrs.frozen
class FailureReport:
    """A worker failure as the agent saw it.

    Attributes:
        local_rank: the worker that failed first.
        exit_code: its exit status (128 + N for signal N).
        signal_name: the signal that ended it, if any.
        evidence: the tail of its stderr.
        restart_count: restarts of this node's workers so far.
        hang: the worker did not exit but stopped making progress.
        network_check: the node failed `--network-check` before any worker started (faulty, or
            a straggler under `--exclude-straggler`); `evidence` holds the verdict and every
            probe's time or error, and `local_rank` is -1.
    """

    local_rank: int
    exit_code: int
    signal_name: str | None
    evidence: str
    restart_count: int
    hang: bool = False
    network_check: bool = False


class ControlPlane(Protocol):
    """The master, as one node's agent uses it. Implementations raise `DLRoverError` subclasses."""

    def register(
        self, local_world_size: int, should_stop: Callable[[], bool] = lambda: False, *, max_restarts: int | None = None
    ) -> NodeRegistration:
        """Join the job; idempotent for the same agent. A master that is not up yet (started
        beside the agents) is waited for, until the control plane's bound or `should_stop()`.
        `max_restarts` (the agent's ``--max-restarts``) becomes the node's process-restart budget
        at the master, so its decisions and this agent's count agree.

        Raises:
            DLRoverError: refused, the master never became reachable, or stopped while waiting.
        """
        ...

    def next_round(
        self,
        timeout_s: float,
        should_stop: Callable[[], bool],
        open_store: Callable[[str], int] | None = None,
    ) -> RoundAssignment:
        """Join the next rendezvous round and block until it completes.

        While waiting, the node stays alive in the master's eyes (it keeps heartbeating).

        The node that gets rank 0 makes the round's store address known to every node. With
        `open_store`, it first calls `open_store(its own address)`, which must return the port of
        a store server that already listens, and publishes that address with `agent_store` set;
        the caller owns that store and closes it after the round. Without, it publishes a port
        that was free a moment ago, for worker rank 0 to host the store. Nodes of other ranks
        never call `open_store`; they wait for rank 0's address and take `agent_store` from it.

        Raises:
            DLRoverError: refused, timed out, `should_stop()` turned true while waiting, or
                `open_store` failed (nothing is published then).
        """
        ...

    def nodes_waiting(self, *, once: bool = False) -> int:
        """Nodes waiting to join: when positive, the running round should be replaced.

        With `once`, a single short attempt (the caller polls, and must not wait out retries).
        """
        ...

    def round_has_formed(self, should_stop: Callable[[], bool] = lambda: False) -> bool:
        """Whether the job's rendezvous has formed a round (its nodes train, or trained): a node
        that joins it then makes them stop for a new round. Callable before registering: waits,
        as `register` does, for the master to accept connections (until `should_stop`), then asks
        once; False when the master cannot say.

        Raises:
            DLRoverError: stopped, or the master did not accept a connection in time.
        """
        ...

    def waiting_check(self) -> WaitingCount:
        """`nodes_waiting(once=True)`, and when the rendezvous asks this node to ask again
        (`WaitingCount.retry_after_s`; 0 when it does not say): a job of thousands of nodes asks
        each node less often, so the master is not asked thousands of times a second."""
        ...

    def restarting_for_round(self, nodes_waiting: int, round_number: int) -> None:
        """Tell the job's rendezvous that this node's workers of round `round_number` stop now for a
        new round, because `nodes_waiting` nodes wait to join: its peers' workers, whose collectives
        break when these stop, are then restarted as that restart's consequence, charged to nobody.
        One short attempt; a master without the call is not asked again.

        Raises:
            DLRoverError: refused or unreachable (the peers' errors are then judged as before).
        """
        ...

    def heartbeat(self, progress: Progress) -> Sequence[tuple[ActionKind, str] | MasterAction]:
        """Report liveness and progress; returns the actions the master wants, with reasons (a
        `MasterAction` where it says more than the kind and the reason)."""
        ...

    def peer_excuses(self) -> tuple[PeerExcuse, ...]:
        """The other nodes' excuses the last heartbeat's answer carried, relative to when it came (none before
        the first answer): this node's ranks that wait on those are not hung while one lasts."""
        ...

    def report_failure(self, report: FailureReport) -> Decision:
        """Report a failure; returns the master's decision (`Decision.outcome`: its reason)."""
        ...

    def commit_checkpoint(self, step: int, path: str, world_size: int) -> None:
        """Tell the master that this node's checkpoint saver committed `step` of `world_size`
        ranks at `path` (the saver verified every rank's files); idempotent.

        Raises:
            DLRoverError: refused or unreachable (the caller tells it again later).
        """
        ...

    def report_success(self, assignment: RoundAssignment) -> None:
        """Report that every worker of this node finished successfully in `assignment`'s round.

        The round's other nodes see it through `finished_ranks`.
        """
        ...

    def finished_ranks(self, assignment: RoundAssignment) -> frozenset[int]:
        """The node ranks of `assignment`'s round that have reported success.

        The agent hosting the round's store keeps it open until every other node's rank is in
        it (torchrun's exit barrier): workers of a node that finishes later may still use it.
        """
        ...

    def leave(self) -> None:
        """Leave the rendezvous (the node is going away)."""
        ...
