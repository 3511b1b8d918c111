"""Thin gRPC servicers: proto -> validated domain values -> one Master call -> proto.

Validation happens here, before the master is touched, so malformed input changes nothing and
gets INVALID_ARGUMENT naming the bad field and value. Domain refusals map to status codes in
`_status_for`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import NoReturn

import grpc

from dlrover.common import ConfigError, DLRoverError, GrpcServer
from dlrover.diagnosis import FailureKind, RankStepStats
from dlrover.master.checkpoints import MAX_STEPS_PER_RANK, MAX_WORLD_SIZE, CheckpointError
from dlrover.master.excuse_wire import excuse_from_proto, excuse_to_proto
from dlrover.master.goodput import MAX_ATTEMPTS_PER_HEARTBEAT, AttemptReport, StepMark
from dlrover.master.identity import NodeAuthenticator, NodeIdentityError, NodeImpersonationError, check_registration_key
from dlrover.master.journal import JournaledEvent, JournalError
from dlrover.master.lifecycle import (
    HostAvoidedError,
    JobFinishedError,
    JobFullError,
    NodeConflictError,
    NodeStateError,
    UnknownNodeError,
)
from dlrover.master.master import Master, ResourceSample
from dlrover.master.peer_excuses import MAX_EXCUSES_PER_NODE
from dlrover.master.resize import ResizeError, ResizeSource
from dlrover.master.states import IllegalTransitionError
from dlrover.master.status import JobSummary, NodeSummary, summarize
from dlrover.master.v1 import agent_pb2, agent_pb2_grpc, checkpoint_pb2, checkpoint_pb2_grpc, job_pb2, job_pb2_grpc
from dlrover.master.wire import WireEnumError, from_proto, proto_name

__all__ = [
    "JOURNAL_FAILED",
    "MAX_EVIDENCE_CHARS",
    "AgentServicer",
    "CheckpointServicer",
    "JobServicer",
    "MAX_EVENTS_PAGE",
    "MAX_REASON_CHARS",
    "RequestError",
    "ServiceRegistration",
    "add_master_services",
    "checked_text",
    "events_page",
    "events_response",
    "status_response",
    "translate_refusals",
]

JOURNAL_FAILED = "the master could not journal the change, so nothing changed; retry later"
MAX_NAME_CHARS = 256
MAX_EVIDENCE_CHARS = 64 * 1024
MAX_REASON_CHARS = 4096
MAX_NODE_ID = 2**53
MAX_EVENTS_PAGE = 1000
MAX_RANKS_PER_REPORT = 4096


class RequestError(DLRoverError):
    """A request field is malformed or out of range."""


_STATUS: tuple[tuple[type[Exception], grpc.StatusCode], ...] = (
    (RequestError, grpc.StatusCode.INVALID_ARGUMENT),
    (ResizeError, grpc.StatusCode.INVALID_ARGUMENT),
    (NodeImpersonationError, grpc.StatusCode.PERMISSION_DENIED),
    (NodeIdentityError, grpc.StatusCode.UNAUTHENTICATED),
    (UnknownNodeError, grpc.StatusCode.NOT_FOUND),
    (NodeConflictError, grpc.StatusCode.ALREADY_EXISTS),
    (JobFullError, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (HostAvoidedError, grpc.StatusCode.FAILED_PRECONDITION),
    (JobFinishedError, grpc.StatusCode.FAILED_PRECONDITION),
    (NodeStateError, grpc.StatusCode.FAILED_PRECONDITION),
    (IllegalTransitionError, grpc.StatusCode.FAILED_PRECONDITION),
    (CheckpointError, grpc.StatusCode.FAILED_PRECONDITION),
    # A full disk or a locked database: the change was rolled back, and a retry may succeed.
    (JournalError, grpc.StatusCode.UNAVAILABLE),
)


def _status_for(exc: DLRoverError) -> grpc.StatusCode:
    for kind, code in _STATUS:
        if isinstance(exc, kind):
            return code
    return grpc.StatusCode.FAILED_PRECONDITION


@contextmanager
def translate_refusals(context: grpc.ServicerContext) -> Iterator[None]:
    """Turn a refusal (a `DLRoverError`) into the matching status (FAILED_PRECONDITION unless its kind maps to
    another); anything else is a bug and surfaces as INTERNAL."""
    try:
        yield
    except JournalError as exc:
        _abort(context, grpc.StatusCode.UNAVAILABLE, f"{JOURNAL_FAILED}: {exc}")
    except DLRoverError as exc:
        _abort(context, _status_for(exc), str(exc))


def _abort(context: grpc.ServicerContext, code: grpc.StatusCode, message: str) -> NoReturn:
    context.abort(code, message[:MAX_REASON_CHARS])
    raise AssertionError("unreachable: context.abort raises")  # pragma: no cover


def checked_text(value: str, field: str, limit: int, *, required: bool = False) -> str:
    """`value` of request field `field`, if printable and at most `limit` characters (and not empty if `required`).

    Raises:
        RequestError: it is not.
    """
    if len(value) > limit:
        raise RequestError(f"{field} has {len(value)} characters; at most {limit}")
    if required and not value:
        raise RequestError(f"{field} must not be empty")
    if not value.isprintable():
        raise RequestError(f"{field} must be printable, got {value[:80]!r}")
    return value


def _registration_key(value: str) -> str:
    try:
        return check_registration_key(value)
    except ConfigError as exc:
        raise RequestError(str(exc)) from None


def _node_id(value: int, field: str = "node_id") -> int:
    if not 0 <= value <= MAX_NODE_ID:
        raise RequestError(f"{field} must be in 0..{MAX_NODE_ID}, got {value}")
    return value


def _finite(value: float, field: str) -> float:
    if not math.isfinite(value) or value < 0:
        raise RequestError(f"{field} must be a finite non-negative number, got {value!r}")
    return value


def _count(value: int, field: str) -> int:
    if value < 0:
        raise RequestError(f"{field} must be non-negative, got {value}")
    return value


def _metadata(context: grpc.ServicerContext) -> tuple[tuple[str, str | bytes], ...]:
    return tuple((m[0], m[1]) for m in context.invocation_metadata() or ())


class AgentServicer(agent_pb2_grpc.AgentServiceServicer):
    """AgentService on a `Master`.

    Args:
        master: the master.
        authenticator: issues and checks node credentials.
    """

    def __init__(self, master: Master, authenticator: NodeAuthenticator) -> None:
        self._master = master
        self._auth = authenticator

    def RegisterNode(
        self, request: agent_pb2.RegisterNodeRequest, context: grpc.ServicerContext
    ) -> agent_pb2.RegisterNodeResponse:
        """Register an agent; answers its node id, rank and node credential."""
        with translate_refusals(context):
            node_id = _node_id(request.node_id) if request.HasField("node_id") else None
            name = checked_text(request.node_name, "node_name", MAX_NAME_CHARS, required=True)
            host = checked_text(request.host, "host", MAX_NAME_CHARS, required=True)
            if request.local_world_size < 0:
                raise RequestError(f"local_world_size must be non-negative, got {request.local_world_size}")
            max_restarts = request.max_restarts if request.HasField("max_restarts") else None
            if max_restarts is not None and max_restarts < 0:
                raise RequestError(f"max_restarts must be non-negative, got {max_restarts}")
            metadata = _metadata(context)
            # A reconnecting agent proves who it is; a first registration has nothing to prove.
            proven = (
                self._auth.authenticate(metadata) if any(k.startswith("x-dlrover-node") for k, _ in metadata) else None
            )
            node = self._master.register(
                node_id,
                name,
                host,
                proven_node_id=proven,
                max_process_restarts=max_restarts,
                registration_key=_registration_key(request.registration_key),
            )
            cfg = self._master.config
            nodes = cfg.lifecycle.nodes
            return agent_pb2.RegisterNodeResponse(
                node_id=node.node_id,
                rank=node.rank,
                node_credential=self._auth.credential(node.node_id),
                heartbeat_interval_s=cfg.heartbeat_interval_s,
                heartbeat_timeout_s=cfg.lifecycle.heartbeat_timeout_s,
                relaunch_count=node.relaunch_count,
                min_nodes=nodes.min_nodes,
                max_nodes=nodes.max_nodes,
                node_unit=nodes.node_unit,
            )

    def Heartbeat(
        self, request: agent_pb2.HeartbeatRequest, context: grpc.ServicerContext
    ) -> agent_pb2.HeartbeatResponse:
        """Record a sign of life and progress; answers pending actions."""
        with translate_refusals(context):
            node_id = self._auth.authorize(_metadata(context), _node_id(request.node_id))
            step: int | None = None
            samples: int | None = None
            resources: ResourceSample | None = None
            if request.HasField("progress"):
                if request.progress.step < -1:
                    raise RequestError(f"progress.step must be -1 or more, got {request.progress.step}")
                step = request.progress.step
                samples = _count(request.progress.samples, "progress.samples")
            if request.HasField("resources"):
                r = request.resources
                resources = ResourceSample(
                    cpu_percent=_finite(r.cpu_percent, "resources.cpu_percent"),
                    memory_bytes=_count(r.memory_bytes, "resources.memory_bytes"),
                    gpu_percent=_finite(r.gpu_percent, "resources.gpu_percent"),
                    gpu_memory_bytes=_count(r.gpu_memory_bytes, "resources.gpu_memory_bytes"),
                )
            rank_steps = _rank_steps(request.rank_steps)
            attempts = _attempts(node_id, request.attempts)
            if len(request.excuses) > MAX_EXCUSES_PER_NODE:
                raise RequestError(f"a heartbeat carries at most {MAX_EXCUSES_PER_NODE} excuses")
            try:
                excuses = tuple(excuse_from_proto(e) for e in request.excuses)
            except ConfigError as exc:
                raise RequestError(f"excuses: {exc}") from None
            actions, job_state = self._master.heartbeat(
                node_id,
                step=step,
                samples=samples,
                resources=resources,
                rank_steps=rank_steps,
                attempts=attempts,
                excuses=excuses,
            )
            response = agent_pb2.HeartbeatResponse(
                actions=[
                    agent_pb2.Action(
                        action_id=a.action_id,
                        kind=proto_name(a.kind, agent_pb2.ActionKind),
                        reason=a.reason,
                        planned_round=a.planned_round,
                    )
                    for a in actions
                ],
                job_state=job_state.value,
            )
            response.peer_excuses.extend(excuse_to_proto(e) for e in self._master.peer_excuses(node_id))
            return response

    def ReportFailure(
        self, request: agent_pb2.ReportFailureRequest, context: grpc.ServicerContext
    ) -> agent_pb2.ReportFailureResponse:
        """Report a failure of the calling node; answers the decision taken."""
        with translate_refusals(context):
            node_id = self._auth.authorize(_metadata(context), _node_id(request.node_id))
            try:
                kind = from_proto(request.kind, agent_pb2.FailureKind, FailureKind)
            except WireEnumError as exc:
                raise RequestError(f"kind must be a known failure kind: {exc}") from None
            if len(request.evidence) > MAX_EVIDENCE_CHARS:
                raise RequestError(f"evidence has {len(request.evidence)} characters; at most {MAX_EVIDENCE_CHARS}")
            evidence = request.evidence or f"exit code {request.exit_code}"
            # proto3 has no "unset" for an int: 0 (a clean exit would not be a failure) means unknown.
            exit_code = request.exit_code or None
            decision = self._master.report_failure(
                node_id, kind, evidence, exit_code=exit_code, agent_exits=request.agent_exits
            )
            return agent_pb2.ReportFailureResponse(
                action=proto_name(decision.action, agent_pb2.ActionKind),
                kind=proto_name(decision.kind, agent_pb2.FailureKind),
                reason=decision.outcome,
                avoid_host=decision.avoid_host,
            )

    def ReportSuccess(
        self, request: agent_pb2.ReportSuccessRequest, context: grpc.ServicerContext
    ) -> agent_pb2.ReportSuccessResponse:
        """Report that the calling node's training processes succeeded."""
        with translate_refusals(context):
            node_id = self._auth.authorize(_metadata(context), _node_id(request.node_id))
            return agent_pb2.ReportSuccessResponse(job_state=self._master.report_success(node_id).value)


class CheckpointServicer(checkpoint_pb2_grpc.CheckpointServiceServicer):
    """CheckpointService on a `Master` (node identity required, like AgentService)."""

    def __init__(self, master: Master, authenticator: NodeAuthenticator) -> None:
        self._master = master
        self._auth = authenticator

    def ReportCheckpointSteps(
        self, request: checkpoint_pb2.ReportCheckpointStepsRequest, context: grpc.ServicerContext
    ) -> checkpoint_pb2.ReportCheckpointStepsResponse:
        """Record the steps some ranks hold; answers the newest step held by every rank."""
        with translate_refusals(context):
            self._auth.authorize(_metadata(context), _node_id(request.node_id))
            if not 1 <= request.world_size <= MAX_WORLD_SIZE:
                raise RequestError(f"world_size must be in 1..{MAX_WORLD_SIZE}, got {request.world_size}")
            if len(request.ranks) > MAX_RANKS_PER_REPORT:
                raise RequestError(f"{len(request.ranks)} ranks in one report; at most {MAX_RANKS_PER_REPORT}")
            ranks: dict[int, list[int]] = {}
            for entry in request.ranks:
                if entry.rank in ranks:
                    raise RequestError(f"rank {entry.rank} appears twice")
                if len(entry.steps) > MAX_STEPS_PER_RANK:
                    raise RequestError(
                        f"rank {entry.rank} reports {len(entry.steps)} steps; at most {MAX_STEPS_PER_RANK}"
                    )
                ranks[entry.rank] = list(entry.steps)
            try:
                complete, committed = self._master.report_checkpoint_steps(request.world_size, ranks)
            except CheckpointError as exc:
                raise RequestError(str(exc)) from exc
            return checkpoint_pb2.ReportCheckpointStepsResponse(
                has_complete_step=complete is not None,
                complete_step=complete if complete is not None else 0,
                has_committed_step=committed is not None,
                committed_step=committed if committed is not None else 0,
            )

    def CommitCheckpoint(
        self, request: checkpoint_pb2.CommitCheckpointRequest, context: grpc.ServicerContext
    ) -> checkpoint_pb2.CommitCheckpointResponse:
        """Commit a step held by every rank (journaled before answering)."""
        with translate_refusals(context):
            self._auth.authorize(_metadata(context), _node_id(request.node_id))
            path = checked_text(request.path, "path", MAX_REASON_CHARS)
            if request.step < 0:
                raise RequestError(f"step must be non-negative, got {request.step}")
            if request.world_size < 0:
                raise RequestError(f"world_size must be non-negative, got {request.world_size}")
            if request.world_size:
                commit = self._master.record_checkpoint(request.step, path, request.world_size)
            else:
                commit = self._master.commit_checkpoint(request.step, path)
            return checkpoint_pb2.CommitCheckpointResponse(committed_step=commit.step)


class JobServicer(job_pb2_grpc.JobServiceServicer):
    """JobService on a `Master`: status, events, stop, resize and capacity (job token only)."""

    def __init__(self, master: Master) -> None:
        self._master = master

    def GetJobStatus(
        self, request: job_pb2.GetJobStatusRequest, context: grpc.ServicerContext
    ) -> job_pb2.GetJobStatusResponse:
        """The job's state and the current node of every rank."""
        with translate_refusals(context):
            return status_response(summarize(self._master.status()))

    def ListEvents(
        self, request: job_pb2.ListEventsRequest, context: grpc.ServicerContext
    ) -> job_pb2.ListEventsResponse:
        """A page of the job's events."""
        with translate_refusals(context):
            return events_response(self._master.events(*events_page(request)))

    def StopJob(self, request: job_pb2.StopJobRequest, context: grpc.ServicerContext) -> job_pb2.StopJobResponse:
        """Stop the job; every node is stopped."""
        with translate_refusals(context):
            reason = checked_text(request.reason, "reason", MAX_REASON_CHARS) or "stopped on request"
            state = self._master.stop(reason)
            status = self._master.status()
            return job_pb2.StopJobResponse(state=state.value, exit_reason=status.exit_reason)

    def ResizeJob(self, request: job_pb2.ResizeJobRequest, context: grpc.ServicerContext) -> job_pb2.ResizeJobResponse:
        """Grow or shrink the job to `target` nodes (see `Master.resize`)."""
        with translate_refusals(context):
            reason = checked_text(request.reason, "reason", MAX_REASON_CHARS) or "resized on request"
            result = self._master.resize(request.target, reason, ResizeSource.SCALE)
            return job_pb2.ResizeJobResponse(
                wanted_nodes=result.wanted_nodes,
                target_nodes=result.target_nodes,
                placeable=_clamp_int32(result.placeable),
                launched_ranks=list(result.launched_ranks),
                leaving_nodes=list(result.leaving_nodes),
                message=result.message[:MAX_REASON_CHARS],
            )

    def SetCapacity(
        self, request: job_pb2.SetCapacityRequest, context: grpc.ServicerContext
    ) -> job_pb2.SetCapacityResponse:
        """Set the backend's slots (unset: unbounded) and follow the new capacity at once."""
        with translate_refusals(context):
            slots = request.slots if request.HasField("slots") else None
            if slots is not None and slots < 0:
                raise RequestError(f"slots must be unset (unbounded) or a non-negative integer, got {slots}")
            free = self._master.set_capacity(slots)
            return job_pb2.SetCapacityResponse(capacity=_clamp_int32(free))


def status_response(status: JobSummary) -> job_pb2.GetJobStatusResponse:
    """`GetJobStatus`'s answer for a job's summary."""
    return job_pb2.GetJobStatusResponse(
        job_name=status.job_name,
        state=status.state.value,
        exit_reason=status.exit_reason,
        nodes=[_node_status(n) for n in status.nodes],
        min_nodes=status.min_nodes,
        max_nodes=status.max_nodes,
        job_failures=status.job_failures,
        step=status.step,
        has_committed_step=status.committed_step is not None,
        committed_step=status.committed_step or 0,
        goodput=status.goodput,
        elapsed_s=status.elapsed_s,
        total_relaunches=status.total_relaunches,
        samples_per_second=status.samples_per_second,
        useful_s=status.useful_s,
        goodput_buckets=[job_pb2.GoodputBucket(name=name, seconds=seconds) for name, seconds in status.goodput_buckets],
        committed_path=status.committed_path,
        committed_wall_time=status.committed_wall_time,
        target_nodes=status.target_nodes,
        wanted_nodes=status.wanted_nodes,
        capacity=_clamp_int32(status.capacity),
        spares=[_node_status(n) for n in status.spares],
        spare_nodes=status.spare_nodes,
    )


def events_page(request: job_pb2.ListEventsRequest) -> tuple[int, int]:
    """(after_seq, limit) of a `ListEvents` request, the limit 100 when unset.

    Raises:
        RequestError: either is out of range.
    """
    if request.after_seq < 0:
        raise RequestError(f"after_seq must be non-negative, got {request.after_seq}")
    if not 0 <= request.limit <= MAX_EVENTS_PAGE:
        raise RequestError(f"limit must be in 0..{MAX_EVENTS_PAGE}, got {request.limit}")
    return request.after_seq, request.limit or 100


def events_response(events: Sequence[JournaledEvent]) -> job_pb2.ListEventsResponse:
    """`ListEvents`' answer for a page of events."""
    return job_pb2.ListEventsResponse(
        events=[
            job_pb2.JobEvent(
                seq=e.seq,
                wall_time=e.wall_time,
                kind=e.kind,
                message=e.message,
                has_node=e.node_id is not None,
                node_id=e.node_id if e.node_id is not None else 0,
                rank=e.rank if e.rank is not None else 0,
                data_json=json.dumps(dict(e.data), sort_keys=True),
            )
            for e in events
        ]
    )


def _clamp_int32(value: int | None) -> int | None:
    if value is None:
        return None
    return max(min(value, 2**31 - 1), -(2**31))


ServiceRegistration = Callable[[GrpcServer], None]


def add_master_services(server: GrpcServer, master: Master, authenticator: NodeAuthenticator) -> None:
    """Register AgentService, CheckpointService and JobService on `server` (before it starts)."""
    server.add(agent_pb2_grpc.add_AgentServiceServicer_to_server, AgentServicer(master, authenticator))
    server.add(checkpoint_pb2_grpc.add_CheckpointServiceServicer_to_server, CheckpointServicer(master, authenticator))
    server.add(job_pb2_grpc.add_JobServiceServicer_to_server, JobServicer(master))


_MAX_RANK_STEPS = 4096


_MAX_ATTEMPTS = MAX_ATTEMPTS_PER_HEARTBEAT
_MAX_MARKS = 4096


def _attempts(node_id: int, items: Iterable[agent_pb2.AttemptReport]) -> tuple[AttemptReport, ...]:
    """The heartbeat's attempt reports, checked; a bad one refuses the whole heartbeat."""
    out: list[AttemptReport] = []
    for item in items:
        if len(out) >= _MAX_ATTEMPTS:
            raise RequestError(f"a heartbeat carries at most {_MAX_ATTEMPTS} attempts")
        if len(item.marks) > _MAX_MARKS:
            raise RequestError(f"an attempt carries at most {_MAX_MARKS} marks, got {len(item.marks)}")
        if item.attempt < 0 or item.rank < 0:
            raise RequestError(f"attempt and rank must be non-negative, got {item.attempt} and {item.rank}")
        times = {
            name: _finite(getattr(item, name), f"attempts.{name}")
            for name in ("rendezvous_start", "rendezvous_end", "workers_start", "ready_time", "load_s")
        }
        marks = tuple(
            StepMark(
                step=_count(m.step, "marks.step"),
                end_time=_finite(m.end_time, "marks.end_time"),
                save_s=_finite(m.save_s, "marks.save_s"),
                samples=_count(m.samples, "marks.samples"),
            )
            for m in item.marks
        )
        out.append(
            AttemptReport(
                node_id=node_id,
                attempt=item.attempt,
                rank=item.rank,
                rendezvous_start=times["rendezvous_start"] or None,
                rendezvous_end=times["rendezvous_end"] or None,
                workers_start=times["workers_start"] or None,
                ready_time=times["ready_time"] or None,
                load_s=times["load_s"],
                marks=marks,
            )
        )
    return tuple(out)


def _rank_steps(items: Iterable[agent_pb2.RankStepStats]) -> tuple[RankStepStats, ...]:
    """The heartbeat's per-rank step stats, checked; a bad one refuses the whole heartbeat."""
    out: list[RankStepStats] = []
    for item in items:
        if len(out) >= _MAX_RANK_STEPS:
            raise RequestError(f"a heartbeat carries at most {_MAX_RANK_STEPS} rank_steps")
        try:
            out.append(
                RankStepStats(
                    rank=item.rank,
                    steps=item.steps,
                    samples=item.samples,
                    median_step_s=item.median_step_s,
                    since_step_s=item.since_step_s,
                    phase=item.phase or "train",
                    median_sync_lead_s=item.median_sync_lead_s,
                    steps_per_mark=item.steps_per_mark or 1.0,  # 0: an agent that does not say
                    sync_group=item.sync_group,
                )
            )
        except ConfigError as exc:
            raise RequestError(f"rank_steps of rank {item.rank}: {exc}") from None
    return tuple(out)


def _node_status(n: NodeSummary) -> job_pb2.NodeStatus:
    return job_pb2.NodeStatus(
        node_id=n.node_id,
        rank=n.rank,
        state=n.state.value,
        name=n.name,
        host=n.host,
        relaunch_count=n.relaunch_count,
        process_restarts=n.process_restarts,
        step=n.step,
        seconds_since_heartbeat=n.seconds_since_heartbeat,
        last_failure=n.last_failure,
        last_reason=n.last_reason,
    )
