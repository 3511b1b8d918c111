"""JobService on a parameter-server job's master: its status, its events, and a stop.

The same service and messages as a worker job's master (`dlrover-master status/events/stop` and the operator's
status mirror work unchanged), answered from what `PsJobMaster` publishes after each look: every task is a node
named `role:index` (`ps:1`) with its index as the rank. A parameter-server job is not resized by a node count and
has no slots, so `ResizeJob` and `SetCapacity` are refused (FAILED_PRECONDITION) with what sizes it instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import grpc

from dlrover.common import DLRoverError
from dlrover.master.journal import JournaledEvent
from dlrover.master.servicers import (
    MAX_REASON_CHARS,
    checked_text,
    events_page,
    events_response,
    status_response,
    translate_refusals,
)
from dlrover.master.status import JobSummary
from dlrover.master.v1 import job_pb2, job_pb2_grpc

__all__ = ["PsJobServicer", "PsJobStatusSource"]


class PsJobStatusSource(Protocol):
    """What the service asks of the job's master (thread-safe: it answers from gRPC's threads)."""

    def summary(self) -> JobSummary:
        """The job's state and tasks as of the master's last look."""

    def events(self, after_seq: int, limit: int) -> Sequence[JournaledEvent]:
        """Up to `limit` of the job's events after sequence number `after_seq`."""

    def request_stop(self, reason: str) -> JobSummary:
        """Stop the job (its master stops every task at its next look and ends); the summary after it (a job that
        had ended stays as it ended)."""


class PsJobServicer(job_pb2_grpc.JobServiceServicer):
    """JobService on a `PsJobMaster` (job token only, as the master's other services)."""

    def __init__(self, master: PsJobStatusSource) -> None:
        self._master = master

    def GetJobStatus(
        self, request: job_pb2.GetJobStatusRequest, context: grpc.ServicerContext
    ) -> job_pb2.GetJobStatusResponse:
        """The job's state and every task's current node."""
        with translate_refusals(context):
            return status_response(self._master.summary())

    def ListEvents(
        self, request: job_pb2.ListEventsRequest, context: grpc.ServicerContext
    ) -> job_pb2.ListEventsResponse:
        """A page of the job's events."""
        with translate_refusals(context):
            return events_response(self._master.events(*events_page(request)))

    def StopJob(self, request: job_pb2.StopJobRequest, context: grpc.ServicerContext) -> job_pb2.StopJobResponse:
        """Stop the job: every task is stopped and the master ends (a job that ended already stays as it ended)."""
        with translate_refusals(context):
            reason = checked_text(request.reason, "reason", MAX_REASON_CHARS) or "stopped on request"
            summary = self._master.request_stop(reason)
            return job_pb2.StopJobResponse(state=summary.state.value, exit_reason=summary.exit_reason)

    def ResizeJob(self, request: job_pb2.ResizeJobRequest, context: grpc.ServicerContext) -> job_pb2.ResizeJobResponse:
        """Refused: see the module."""
        with translate_refusals(context):
            raise DLRoverError(
                "a parameter-server job is not resized by a node count: its workers are --workers/--min-workers, "
                "and servers are added by --hot-ps or --ps-state-ratio"
            )

    def SetCapacity(
        self, request: job_pb2.SetCapacityRequest, context: grpc.ServicerContext
    ) -> job_pb2.SetCapacityResponse:
        """Refused: see the module."""
        with translate_refusals(context):
            raise DLRoverError("a parameter-server job's backend has no slots to set")
