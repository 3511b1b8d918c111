"""Group commit: every change is durable before its caller returns, and one write serves many."""

from __future__ import annotations

import threading

from dlrover.master.group_commit import GroupCommit


class Journal:
    """A write that snapshots which changes it holds; it can be held, or made to fail once."""

    def __init__(self) -> None:
        self.made: list[int] = []  # changes applied to the state, in order
        self.durable: set[int] = set()
        self.started = threading.Event()
        self.release = threading.Event()
        self.release.set()
        self.fail_next = False
        self.lock = threading.Lock()

    def write(self) -> None:
        with self.lock:
            holds = set(self.made)
        self.started.set()
        assert self.release.wait(30)
        if self.fail_next:
            self.fail_next = False
            raise OSError("disk full")
        self.durable |= holds


def change(journal: Journal, commit: GroupCommit, change_id: int, returned: list[int]) -> None:
    with journal.lock:
        journal.made.append(change_id)
    commit.changed()
    assert change_id in journal.durable  # never answered before its change is journaled
    returned.append(change_id)


def test_a_change_alone_is_written_before_it_returns() -> None:
    journal = Journal()
    commit = GroupCommit(journal.write)
    returned: list[int] = []
    for i in range(3):
        change(journal, commit, i, returned)
    assert returned == [0, 1, 2]
    assert commit.writes == 3


def test_changes_made_while_a_write_runs_share_the_next_write() -> None:
    journal = Journal()
    commit = GroupCommit(journal.write)
    returned: list[int] = []
    journal.release.clear()
    first = threading.Thread(target=change, args=(journal, commit, 0, returned))
    first.start()
    assert journal.started.wait(30)  # the first write is under way, and held
    journal.started.clear()
    others = [threading.Thread(target=change, args=(journal, commit, i, returned)) for i in range(1, 11)]
    for t in others:
        t.start()
    # Every other change is counted (its caller waits) before the first write is let go.
    while commit.changes < 11:
        assert first.is_alive()
        threading.Event().wait(0.01)
    journal.release.set()
    for t in [first, *others]:
        t.join(30)
        assert not t.is_alive()
    assert sorted(returned) == list(range(11))
    assert commit.writes == 2  # the held one, and one for the ten changes made meanwhile


def test_a_failed_write_raises_in_its_writer_and_the_waiting_changes_are_written_by_the_next() -> None:
    journal = Journal()
    commit = GroupCommit(journal.write)
    returned: list[int] = []
    errors: list[BaseException] = []

    def guarded(change_id: int) -> None:
        try:
            change(journal, commit, change_id, returned)
        except OSError as exc:
            errors.append(exc)

    journal.release.clear()
    journal.fail_next = True
    writer = threading.Thread(target=guarded, args=(0,))
    writer.start()
    assert journal.started.wait(30)
    waiter = threading.Thread(target=guarded, args=(1,))
    waiter.start()
    while commit.changes < 2:
        threading.Event().wait(0.01)
    journal.release.set()
    for t in (writer, waiter):
        t.join(30)
        assert not t.is_alive()
    assert [str(e) for e in errors] == ["disk full"]
    # The failed write's change is in memory; the next write (the waiter's) holds it too.
    assert returned == [1]
    assert journal.durable == {0, 1}
    assert commit.writes == 1
