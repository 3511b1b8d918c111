"""`MasterClient`'s replies in domain types: what it makes of the wire's strings and JSON."""

from __future__ import annotations

import pytest

from dlrover.common import DLRoverError
from dlrover.master.client import _event, _state
from dlrover.master.states import JobState, NodeState
from dlrover.master.v1 import job_pb2
from dlrover.master.wire import WireEnumError


def test_states_are_read_by_value_and_an_unknown_one_is_a_clear_error() -> None:
    assert _state("stopped", JobState, "the job state") is JobState.STOPPED
    assert _state("relaunching", NodeState, "the node state") is NodeState.RELAUNCHING
    with pytest.raises(WireEnumError, match="the master answered the job state 'paused'"):
        _state("paused", JobState, "the job state")


def test_an_event_reads_back_as_the_master_journaled_it() -> None:
    wire = job_pb2.JobEvent(
        seq=7, wall_time=12.5, kind="failure", message="m", has_node=True, node_id=0, rank=0, data_json='{"a": [1]}'
    )
    event = _event(wire)
    assert (event.seq, event.wall_time, event.kind, event.message) == (7, 12.5, "failure", "m")
    # Node 0 and rank 0 are real values when the event names a node, None when it names none.
    assert (event.node_id, event.rank, dict(event.data)) == (0, 0, {"a": [1]})
    job_wide = _event(job_pb2.JobEvent(seq=8, kind="job_start"))
    assert (job_wide.node_id, job_wide.rank, dict(job_wide.data)) == (None, None, {})


@pytest.mark.parametrize("data", ["{not json", "[1, 2]"])
def test_event_data_that_is_not_a_json_object_is_refused(data: str) -> None:
    with pytest.raises(DLRoverError, match="event 3 carries data that is not"):
        _event(job_pb2.JobEvent(seq=3, kind="x", data_json=data))
