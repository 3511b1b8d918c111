"""The commit protocol as a state machine: ranks write (and crash part way), the coordinator commits.

Model: which ranks finished each step, and which steps were committed. Invariants: the tracker
names exactly the newest committed step, only moves forward, and every rank of the step it names
loads completely and equals what that rank saved.
"""

from __future__ import annotations

import torch
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import Bundle, RuleBasedStateMachine, invariant, precondition, rule

from dlrover.flashckpt.commit import Committer, RetentionPolicy
from dlrover.flashckpt.payloads import payload_from_state
from dlrover.flashckpt.persist import persist_rank
from dlrover.flashckpt.storage import InMemoryStorage
from dlrover.flashckpt.storage_loader import StorageReader

WORLD = 2


class Crash(Exception):
    pass


def _state(step: int, rank: int) -> dict[str, object]:
    return {"w": torch.full((3,), float(step * 100 + rank)), "step": step, "rank": rank}


class CommitProtocol(RuleBasedStateMachine):
    steps = Bundle("steps")

    def __init__(self) -> None:
        super().__init__()
        self.storage = InMemoryStorage()
        self.committer = Committer(self.storage, RetentionPolicy(keep_last=2))
        self.next_step = 1
        self.done: dict[int, set[int]] = {}
        self.committed: list[int] = []
        self.last_tracker = -1

    @rule(target=steps)
    def new_step(self) -> int:
        step = self.next_step
        self.next_step += 1
        self.done[step] = set()
        return step

    @rule(step=steps, rank=st.integers(0, WORLD - 1), crash_after=st.one_of(st.none(), st.integers(0, 2)))
    def write_rank(self, step: int, rank: int, crash_after: int | None) -> None:
        if self.committed and step < self.committed[-1]:
            return  # retention may have removed older steps; a real rank never writes backwards
        writes = [0]

        def before(path: str) -> None:
            if crash_after is not None and writes[0] == crash_after:
                raise Crash(path)
            writes[0] += 1

        self.storage.before_write = before
        try:
            persist_rank(self.storage, payload_from_state(step, rank, WORLD, _state(step, rank)))
            self.done[step].add(rank)
        except Crash:
            pass  # the marker is the last write: a crash before it leaves the rank not done
        finally:
            self.storage.before_write = None

    @precondition(lambda self: self.done)
    @rule(step=steps)
    def commit(self, step: int) -> None:
        decision = self.committer.try_commit(step, WORLD)
        newest = self.committed[-1] if self.committed else -1
        expected = self.done.get(step) == set(range(WORLD)) and step > newest
        assert decision.commit == expected, decision.reason
        if decision.commit:
            self.committed.append(step)

    @invariant()
    def tracker_names_newest_complete_checkpoint(self) -> None:
        tracker = self.committer.tracker()
        if not self.committed:
            assert tracker is None
            return
        assert tracker is not None
        assert tracker.step == self.committed[-1]
        assert tracker.step >= self.last_tracker
        self.last_tracker = tracker.step
        for rank in range(WORLD):
            loaded = StorageReader(self.storage).load(rank, WORLD)
            assert loaded.step == tracker.step
            assert loaded.state["rank"] == rank
            assert torch.equal(loaded.state["w"], _state(tracker.step, rank)["w"])  # type: ignore[arg-type]


CommitProtocol.TestCase.settings = settings(CommitProtocol.TestCase.settings, stateful_step_count=25)
TestCommitProtocol = CommitProtocol.TestCase
