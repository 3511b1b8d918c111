"""Child process for the SIGKILL test: commits batches forever, printing each committed count."""

from __future__ import annotations

import sys

from dlrover.master.journal import JournalBatch, JournaledEvent, SqliteJournal
from dlrover.master.records import NodeRecord
from dlrover.master.states import NodeState


def main() -> None:
    journal = SqliteJournal(sys.argv[1])
    start = journal.load().last_event_seq
    i = start
    while True:
        i += 1
        # Each batch writes a node and an event together: after a kill both or neither exist.
        node = NodeRecord(node_id=i, rank=i % 7, state=NodeState.RUNNING, name="x" * 2000)
        event = JournaledEvent(0, float(i), "tick", f"batch {i}", i, i % 7, {"i": i})
        journal.commit(JournalBatch(nodes=(node,), events=(event,), job={"i": i}))
        print(i, flush=True)


if __name__ == "__main__":
    main()
