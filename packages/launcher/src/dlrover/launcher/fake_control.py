"""An in-memory `ControlPlane` for tests: one node, scripted answers, everything recorded."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence

from dlrover.common import DLRoverError
from dlrover.diagnosis import ActionKind, Decision, PeerExcuse, RestartBudget, reported_kind
from dlrover.launcher.control import FailureReport, MasterAction, NodeRegistration, Progress, RoundAssignment
from dlrover.launcher.inprocess import InMemoryRoundStore, free_port
from dlrover.rendezvous import WaitingCount

__all__ = ["FakeControlPlane", "InMemoryRoundStore", "free_port"]


class FakeControlPlane:
    """A master whose answers a test scripts, seen from the node that gets rank 0 of every round.

    Args:
        failure_decisions: answers to successive failure reports; the last one repeats. As the
            master does, a restart is granted only within the `max_restarts` the agent declared
            when it registered, with "restart k of n" in its reason; once they are spent the
            answer is to stop the job (this one-node job has no node left).
        nodes_waiting: answers to successive `nodes_waiting` calls (0 once used up), or a
            function that answers each call.
        actions: actions returned by successive heartbeats; none once used up.
        heartbeat_interval_s: the interval handed out at registration.
        unreachable_reports: how many failure reports fail as if the master were unreachable.
        group_world_size: nodes in every round; the others exist only in `finished_ranks`.
        peers_finished: how many of the other nodes (ranks 1, 2, ...) have finished the round
            asked about; none when not given.
        waiting_retry_after_s: when each `waiting_check` asks the agent to ask again (0: not said).
    """

    def __init__(
        self,
        *,
        failure_decisions: Sequence[tuple[ActionKind, str]] = ((ActionKind.RESTART_PROCESSES, "transient"),),
        nodes_waiting: Sequence[int] | Callable[[], int] = (),
        actions: Sequence[Sequence[tuple[ActionKind, str] | MasterAction]] = (),
        heartbeat_interval_s: float = 0.05,
        unreachable_reports: int = 0,
        group_world_size: int = 1,
        peers_finished: Callable[[RoundAssignment], int] | None = None,
        waiting_retry_after_s: float = 0.0,
    ) -> None:
        if group_world_size < 1:
            raise ValueError(f"group_world_size must be at least 1, got {group_world_size}")
        self._world = group_world_size
        self._peers_finished = peers_finished
        self._lock = threading.Lock()
        self._decisions = list(failure_decisions)
        self._waiting_fn = nodes_waiting if callable(nodes_waiting) else None
        self._waiting = [] if callable(nodes_waiting) else list(nodes_waiting)
        self._actions = [list(a) for a in actions]
        self._interval = heartbeat_interval_s
        self._unreachable_reports = unreachable_reports
        self.registrations: list[int] = []
        self.declared_max_restarts: list[int | None] = []  # each registration's `max_restarts`
        self.restarts_granted = 0
        self.waiting_polls: list[bool] = []  # each nodes_waiting call's `once`
        self.waiting_retry_after_s = waiting_retry_after_s  # what each waiting check asks
        self.round_formed = False  # what `round_has_formed` answers
        self.rounds: list[RoundAssignment] = []
        self.failures: list[FailureReport] = []
        self.heartbeats: list[Progress] = []
        self.excuses_elsewhere: tuple[PeerExcuse, ...] = ()  # what `peer_excuses` answers
        self.commits: list[tuple[int, str, int]] = []  # (step, path, world size) as committed
        self.successes = 0
        self.succeeded_rounds: list[int] = []
        self.left = 0
        self.round_restarts: list[tuple[int, int]] = []  # each `restarting_for_round`'s (nodes waiting, round)
        self._store = InMemoryRoundStore()

    def register(
        self, local_world_size: int, should_stop: Callable[[], bool] = lambda: False, *, max_restarts: int | None = None
    ) -> NodeRegistration:
        with self._lock:
            self.registrations.append(local_world_size)
            self.declared_max_restarts.append(max_restarts)
            return NodeRegistration(node_id="node-0", heartbeat_interval_s=self._interval)

    def next_round(
        self,
        timeout_s: float,
        should_stop: Callable[[], bool] = lambda: False,
        open_store: Callable[[str], int] | None = None,
    ) -> RoundAssignment:
        """Complete the next round at once; this node is rank 0 (see `ControlPlane`).

        With `open_store`, the round's store is the one it opens on 127.0.0.1; the assignment is
        "published" (recorded in `rounds`) only after it returned.
        """
        with self._lock:
            number = len(self.rounds) + 1
            # The other nodes are imagined running as many workers as this one.
            local = self.registrations[-1] if self.registrations else 1
        # Outside the lock: opening may wait for an import, and a test's hook may read `rounds`.
        port = open_store("127.0.0.1") if open_store is not None else free_port()
        assignment = RoundAssignment(
            number,
            0,
            self._world,
            "127.0.0.1",
            port,
            agent_store=open_store is not None,
            first_worker_rank=0,
            worker_world_size=local * self._world,
        )
        with self._lock:
            self.rounds.append(assignment)
            return assignment

    def nodes_waiting(self, *, once: bool = False) -> int:
        with self._lock:
            self.waiting_polls.append(once)
        if self._waiting_fn is not None:
            return self._waiting_fn()
        with self._lock:
            return self._waiting.pop(0) if self._waiting else 0

    def round_has_formed(self, should_stop: Callable[[], bool] = lambda: False) -> bool:
        return self.round_formed

    def waiting_check(self) -> WaitingCount:
        return WaitingCount(self.nodes_waiting(once=True), self.waiting_retry_after_s)

    def restarting_for_round(self, nodes_waiting: int, round_number: int) -> None:
        with self._lock:
            self.round_restarts.append((nodes_waiting, round_number))

    def heartbeat(self, progress: Progress) -> Sequence[tuple[ActionKind, str] | MasterAction]:
        with self._lock:
            self.heartbeats.append(progress)
            return self._actions.pop(0) if self._actions else []

    def peer_excuses(self) -> tuple[PeerExcuse, ...]:
        """`excuses_elsewhere`: what a test says other nodes excuse."""
        with self._lock:
            return self.excuses_elsewhere

    def report_failure(self, report: FailureReport) -> Decision:
        with self._lock:
            if self._unreachable_reports > 0:
                self._unreachable_reports -= 1
                raise DLRoverError("the master is unreachable (scripted)")
            self.failures.append(report)
            action, reason = self._decisions.pop(0) if len(self._decisions) > 1 else self._decisions[0]
            limit = self.declared_max_restarts[-1] if self.declared_max_restarts else None
            if not action.restarts_processes or limit is None:
                return self._decision(action, reason)
            budget = RestartBudget(self.restarts_granted, limit, "--max-restarts")
            if budget.spent:
                return self._decision(ActionKind.ABORT_JOB, f"{reason}; {budget.used_up()}: the job stops")
            self.restarts_granted += 1
            return self._decision(action, f"{reason}; {budget.next_restart()}")

    @staticmethod
    def _decision(action: ActionKind, reason: str) -> Decision:
        # The fake diagnoses nothing: the decision keeps the kind an agent reports for a crash.
        return Decision(action, reported_kind(), "0", reason)

    def commit_checkpoint(self, step: int, path: str, world_size: int) -> None:
        with self._lock:
            self.commits.append((step, path, world_size))

    def report_success(self, assignment: RoundAssignment) -> None:
        with self._lock:
            self.successes += 1
            self.succeeded_rounds.append(assignment.round)

    def finished_ranks(self, assignment: RoundAssignment) -> frozenset[int]:
        """This node (rank 0) once it reported success, and the first `peers_finished` others."""
        peers = 0 if self._peers_finished is None else self._peers_finished(assignment)
        with self._lock:
            mine = {0} if assignment.round in self.succeeded_rounds else set()
        return frozenset(mine | set(range(1, 1 + peers)))

    def leave(self) -> None:
        with self._lock:
            self.left += 1

    def kv_get(self, keys: Sequence[str]) -> list[bytes | None]:
        """Read keys of this fake master's key-value store."""
        return self._store.kv_get(keys)

    def kv_compare_set(self, key: str, expected: bytes, desired: bytes) -> bytes:
        """Compare-and-set in this fake master's key-value store."""
        return self._store.kv_compare_set(key, expected, desired)

    def kv_delete(self, key: str) -> bool:
        """Delete a key of this fake master's key-value store; whether it was set."""
        return self._store.kv_delete(key)
