"""Hypothesis state machine: whatever happens, a master restarted from its journal holds the same job.

Rules drive a Master (fake scheduler, manual clock) through registrations, heartbeats, failures,
successes, scheduler observations, timeouts, checkpoint commits and stops; `restart` builds a new
Master from the same journal. The invariant compares the restarted master with the live one: same
nodes (ids, ranks, states, histories, budgets), same job state and reason, same commits, same
actions waiting for delivery. Heartbeat times and steps are deliberately not journaled and are
left out of the comparison.

The journal fails at times (`break_journal`): a request whose change it refuses raises
`JournalError` and leaves the master exactly as it was (same digest), so the invariant, memory
equals journal, holds through failures too; a process restart whose delivery failed is delivered
later, once.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import attrs
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from dlrover.common import ManualClock
from dlrover.diagnosis import ActionKind, Decision, FailureKind
from dlrover.master.checkpoints import CheckpointError
from dlrover.master.config import LifecycleConfig, MasterConfig, NodeRange
from dlrover.master.journal import JournalBatch, JournalError, MemoryJournal
from dlrover.master.lifecycle import LifecycleError
from dlrover.master.master import Master
from dlrover.master.metrics import MasterMetrics
from dlrover.master.policy import DefaultFailurePolicy, Failure
from dlrover.master.records import NodeRecord
from dlrover.master.scheduler.base import ObservedState
from dlrover.master.scheduler.fake import FakeScheduler
from dlrover.master.states import IllegalTransitionError

NODES = 3


class FlakyJournal(MemoryJournal):
    """A memory journal whose commits fail while `failing` is set (a full disk)."""

    failing = False

    def commit(self, batch: JournalBatch) -> tuple[int, ...]:
        if self.failing and not batch.empty:
            raise JournalError("disk full")
        return super().commit(batch)


class RestartOddExits(DefaultFailurePolicy):
    """The default policy, except that an exit with an odd status restarts processes (a queued action)."""

    def decide(self, failure: Failure) -> Decision:
        if failure.observed_by_master and failure.exit_code is not None and failure.exit_code % 2:
            node_id = str(failure.node.node_id)
            return Decision(ActionKind.RESTART_PROCESSES, failure.kind, node_id, f"odd exit {failure.exit_code}")
        return super().decide(failure)


def durable(node: NodeRecord) -> NodeRecord:
    # A resumed master restarts every wait it times (heartbeats, a charge's wait for a cause) from its start.
    awaited = None if node.awaiting_cause is None else attrs.evolve(node.awaiting_cause, since=0.0)
    return attrs.evolve(node, last_heartbeat=0.0, state_since=0.0, step=-1, samples=0, awaiting_cause=awaited)


class MasterRestartMachine(RuleBasedStateMachine):
    @initialize()
    def setup(self) -> None:
        self.config = MasterConfig(
            job_name="sm",
            lifecycle=LifecycleConfig(
                nodes=NodeRange(2, NODES),
                heartbeat_timeout_s=10.0,
                node_start_timeout_s=50.0,
                max_relaunches=2,
                max_job_failures=6,
                insufficient_nodes_window_s=40.0,
            ),
            heartbeat_interval_s=1.0,
            progress_event_interval_s=0.0,
        )
        self.journal = FlakyJournal()
        self.delivered: dict[int, int] = {}  # action id -> times handed out
        self.check_metrics = MasterMetrics("check")  # one registry for every check: building one is slow
        self.clock = ManualClock()
        self.scheduler = FakeScheduler()
        self.master = Master(self.config, self.scheduler, self.journal, self.clock, policy=RestartOddExits())
        self.master.start()

    def _attempt(self, call: Callable[[], object]) -> None:
        """Run a request; refused input or a refused journal write must change nothing."""
        before = self.master.state_digest()
        try:
            call()
        except JournalError:
            assert self.journal.failing
            assert self.master.state_digest() == before
        except (LifecycleError, IllegalTransitionError):
            assert self.master.state_digest() == before

    def _rank_node(self, rank: int) -> int:
        return self.master.status().nodes[rank].node_id

    @rule(rank=st.integers(0, NODES - 1))
    def register(self, rank: int) -> None:
        node_id = self._rank_node(rank)
        self._attempt(lambda: self.master.register(node_id, f"a{node_id}", f"h{node_id}"))

    @rule(rank=st.integers(0, NODES - 1), step=st.integers(0, 50))
    def heartbeat(self, rank: int, step: int) -> None:
        def call() -> None:
            actions, _ = self.master.heartbeat(self._rank_node(rank), step=step, samples=step)
            for action in actions:
                if action.kind is ActionKind.RESTART_PROCESSES:
                    self.delivered[action.action_id] = self.delivered.get(action.action_id, 0) + 1

        self._attempt(call)

    @rule(rank=st.integers(0, NODES - 1), kind=st.sampled_from(FailureKind))
    def fail(self, rank: int, kind: FailureKind) -> None:
        self._attempt(lambda: self.master.report_failure(self._rank_node(rank), kind, "boom"))

    @rule(rank=st.integers(0, NODES - 1))
    def succeed(self, rank: int) -> None:
        self._attempt(lambda: self.master.report_success(self._rank_node(rank)))

    @rule(rank=st.integers(0, NODES - 1), state=st.sampled_from(ObservedState), code=st.integers(-9, 3))
    def observe(self, rank: int, state: ObservedState, code: int) -> None:
        self.scheduler.set_state(self._rank_node(rank), state, code)
        # A tick is several changes, each journaled on its own: some may stand before one fails.
        with contextlib.suppress(JournalError):
            self.master.tick()

    @rule(seconds=st.sampled_from([1.0, 11.0, 45.0]))
    def advance(self, seconds: float) -> None:
        self.clock.advance(seconds)
        self._attempt(self.master.tick)

    @rule(step=st.integers(0, 5))
    def checkpoint(self, step: int) -> None:
        self.master.report_checkpoint_steps(2, {0: [step], 1: [step]})  # held steps are not journaled
        with contextlib.suppress(CheckpointError):
            self._attempt(lambda: self.master.commit_checkpoint(step, f"/ck/{step}"))

    @rule()
    def stop(self) -> None:
        self._attempt(lambda: self.master.stop("operator"))

    @rule(failing=st.booleans())
    def break_journal(self, failing: bool) -> None:
        self.journal.failing = failing

    @rule()
    def restart(self) -> None:
        """The master dies and a new one resumes from the journal (a new, empty scheduler)."""
        self.journal.failing = False  # a master that cannot journal its restart does not start
        self.scheduler = FakeScheduler()
        self.master = Master(self.config, self.scheduler, self.journal, self.clock, policy=RestartOddExits())
        self.master.start()
        assert self.master.restored
        assert self.scheduler.specs == {}

    @invariant()
    def a_restarted_master_holds_the_same_job(self) -> None:
        live = self.master
        resumed = Master(self.config, FakeScheduler(), _Readonly(self.journal), self.clock, metrics=self.check_metrics)
        assert {i: durable(n) for i, n in resumed.nodes().items()} == {i: durable(n) for i, n in live.nodes().items()}
        a, b = live.status(), resumed.status()
        assert (a.state, a.exit_reason, a.job_failures, a.committed_step) == (
            b.state,
            b.exit_reason,
            b.job_failures,
            b.committed_step,
        )
        assert [n.node_id for n in a.nodes] == [n.node_id for n in b.nodes]
        assert {i: live.pending_actions(i) for i in live.nodes()} == {
            i: resumed.pending_actions(i) for i in live.nodes()
        }

    @invariant()
    def no_action_is_delivered_twice(self) -> None:
        assert all(times == 1 for times in self.delivered.values()), self.delivered


class _Readonly(MemoryJournal):
    """Reads another journal's state and drops writes, so checking does not change what is checked."""

    def __init__(self, source: MemoryJournal) -> None:
        super().__init__()
        self._source = source

    def load(self):  # type: ignore[no-untyped-def]
        return self._source.load()

    def events(self, after_seq: int = 0, limit: int = 1000):  # type: ignore[no-untyped-def]
        return self._source.events(after_seq, limit)

    def commit(self, batch):  # type: ignore[no-untyped-def]
        return tuple(range(len(batch.events)))


# Every step rebuilds a master from the journal to check it, so examples are costly: at most 100.
_base = MasterRestartMachine.TestCase.settings
MasterRestartMachine.TestCase.settings = settings(
    _base, stateful_step_count=20, max_examples=min(_base.max_examples, 100)
)
TestMasterRestart = MasterRestartMachine.TestCase
