"""`MasterClient`: what an agent (or a tool) uses to talk to the master.

After `register`, every agent call carries the node identity metadata automatically.
"""

from __future__ import annotations

import enum
import functools
import json
import logging
import secrets
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, TypeVar

import attrs
import grpc

from dlrover.common import (
    ChannelConfig,
    Clock,
    ConfigError,
    DLRoverError,
    RetryPolicy,
    call_unary,
    create_channel,
    master_channel_config,
)
from dlrover.diagnosis import ActionKind, Decision, FailureKind, PeerExcuse, RankStepStats
from dlrover.master.excuse_wire import excuse_from_proto, excuse_to_proto
from dlrover.master.goodput import AttemptReport
from dlrover.master.identity import node_metadata
from dlrover.master.journal import JournaledEvent
from dlrover.master.records import Action, ResourceSample
from dlrover.master.resize import ResizeResult
from dlrover.master.states import JobState, NodeState
from dlrover.master.status import JobSummary, NodeSummary
from dlrover.master.v1 import agent_pb2, agent_pb2_grpc, checkpoint_pb2, checkpoint_pb2_grpc, job_pb2, job_pb2_grpc
from dlrover.master.wire import WireEnumError, from_proto, proto_name

__all__ = ["CheckpointStepsAnswer", "HeartbeatAnswer", "MasterClient", "Registration", "StopAnswer"]

_log = logging.getLogger(__name__)

_S = TypeVar("_S", bound=enum.Enum)


@attrs.frozen
class Registration:
    """The master's answer to `MasterClient.register`.

    Attributes:
        node_id: the node's id (the one asked for, or a new one).
        rank: its rank in the job.
        node_credential: what proves the node's identity on later calls (sent automatically).
        heartbeat_interval_s: how often to heartbeat.
        heartbeat_timeout_s: how long a silent node is waited for.
        relaunch_count: how many times this rank was relaunched.
        min_nodes, max_nodes, node_unit: the job's node range.
    """

    node_id: int
    rank: int
    node_credential: str
    heartbeat_interval_s: float
    heartbeat_timeout_s: float
    relaunch_count: int
    min_nodes: int
    max_nodes: int
    node_unit: int


@attrs.frozen
class HeartbeatAnswer:
    """The master's answer to `MasterClient.heartbeat`.

    Attributes:
        actions: what the node is asked to do (kinds are `dlrover.diagnosis.ActionKind`).
        job_state: the job's state.
        peer_excuses: the lasting excuses of other nodes' ranks (a named phase, ranks busy running code),
            relative to when the answer was sent, the earliest begun first.
    """

    actions: tuple[Action, ...]
    job_state: JobState
    peer_excuses: tuple[PeerExcuse, ...] = ()


@attrs.frozen
class CheckpointStepsAnswer:
    """The master's answer to `MasterClient.report_checkpoint_steps`.

    Attributes:
        complete_step: the newest step every rank holds; None while no step is held by all.
        committed_step: the newest committed step; None before any commit.
    """

    complete_step: int | None
    committed_step: int | None


@attrs.frozen
class StopAnswer:
    """The master's answer to `MasterClient.stop_job`.

    Attributes:
        state: the job's state after the stop (an ended job keeps the state it ended in).
        exit_reason: why the job ended.
    """

    state: JobState
    exit_reason: str


def _state(value: str, domain: type[_S], what: str) -> _S:
    """The member of `domain` a reply names by value.

    Raises:
        WireEnumError: the master named a state this client does not know.
    """
    try:
        return domain(value)
    except ValueError:
        raise WireEnumError(f"the master answered {what} {value!r}, which this client does not know") from None


def _event(event: job_pb2.JobEvent) -> JournaledEvent:
    """An event as the master journaled it.

    Raises:
        DLRoverError: its data is not a JSON object.
    """
    try:
        data = json.loads(event.data_json) if event.data_json else {}
    except ValueError as exc:
        raise DLRoverError(f"event {event.seq} carries data that is not JSON: {exc}") from None
    if not isinstance(data, dict):
        raise DLRoverError(f"event {event.seq} carries data that is not a JSON object: {event.data_json[:200]!r}")
    return JournaledEvent(
        seq=event.seq,
        wall_time=event.wall_time,
        kind=event.kind,
        message=event.message,
        node_id=event.node_id if event.has_node else None,
        rank=event.rank if event.has_node else None,
        data=data,
    )


class MasterClient:
    """A client of the master's AgentService, CheckpointService and JobService.

    Args:
        target: the master's `host:port`.
        token: the job token.
        channel_config: size limits and TLS; None: `master_channel_config()` (TLS as the
            ``DLROVER_MASTER_TLS_*`` variables say, else plaintext).
        policy: deadlines and retries (idempotent calls only are retried).
        clock: time source for retries.
    """

    def __init__(
        self,
        target: str,
        token: str,
        *,
        channel_config: ChannelConfig | None = None,
        policy: RetryPolicy | None = None,
        clock: Clock | None = None,
    ) -> None:
        self._channel = create_channel(
            target, token, channel_config if channel_config is not None else master_channel_config()
        )
        # The generated stubs are untyped; the typed surface is this class's methods.
        self._agent: Any = agent_pb2_grpc.AgentServiceStub(self._channel)  # type: ignore[no-untyped-call]
        self._ckpt: Any = checkpoint_pb2_grpc.CheckpointServiceStub(self._channel)  # type: ignore[no-untyped-call]
        self._job: Any = job_pb2_grpc.JobServiceStub(self._channel)  # type: ignore[no-untyped-call]
        self._policy = policy or RetryPolicy()
        self._clock = clock
        self.node_id: int | None = None
        self.credential: str | None = None
        # A bearer secret (with the job token it gets this node's credential): drawn here, never
        # taken from a caller, so it is never guessable.
        self._registration_key = secrets.token_hex(16)

    def _call(self, method: Any, request: Any, *, idempotent: bool, identity: bool = True) -> Any:
        if identity and self.node_id is not None and self.credential is not None:
            method = functools.partial(method, metadata=node_metadata(self.node_id, self.credential))
        return call_unary(method, request, idempotent=idempotent, policy=self._policy, clock=self._clock)

    def _own_id(self, node_id: int | None) -> int:
        chosen = self.node_id if node_id is None else node_id
        if chosen is None:
            raise ValueError("register first, or pass node_id")
        return chosen

    def set_identity(self, node_id: int, credential: str) -> None:
        """Use a known identity (an agent that registered before, e.g. across a master restart)."""
        self.node_id = node_id
        self.credential = credential

    def register(
        self,
        node_name: str,
        host: str,
        *,
        node_id: int | None = None,
        local_world_size: int = 0,
        max_restarts: int | None = None,
    ) -> Registration:
        """Register and remember the node's identity for later calls.

        `max_restarts`: the worker restarts this agent allows (its ``--max-restarts``), the
        node's process-restart budget at the master; None leaves the master's own.

        Retried like an idempotent call: every registration carries this client's registration
        key (random, drawn once per client), and the master answers a repeat with the node the
        first attempt registered, so an answer lost on the way back is not a conflict. The master
        must know registration keys (a master of an older release ignores them, and a repeat of
        a registration that claims no node would take a second rank there): run the agents and
        the master of a job from one release.

        Raises:
            RpcError: refused (the status code says why).
        """
        request = agent_pb2.RegisterNodeRequest(node_name=node_name, host=host, local_world_size=local_world_size)
        if node_id is not None:
            request.node_id = node_id
        if max_restarts is not None:
            request.max_restarts = max_restarts
        request.registration_key = self._registration_key
        response: agent_pb2.RegisterNodeResponse = self._call(self._agent.RegisterNode, request, idempotent=True)
        self.set_identity(response.node_id, response.node_credential)
        return Registration(
            node_id=response.node_id,
            rank=response.rank,
            node_credential=response.node_credential,
            heartbeat_interval_s=response.heartbeat_interval_s,
            heartbeat_timeout_s=response.heartbeat_timeout_s,
            relaunch_count=response.relaunch_count,
            min_nodes=response.min_nodes,
            max_nodes=response.max_nodes,
            node_unit=response.node_unit,
        )

    def heartbeat(
        self,
        *,
        step: int | None = None,
        samples: int = 0,
        resources: ResourceSample | None = None,
        node_id: int | None = None,
        rank_steps: Sequence[RankStepStats] = (),
        attempts: Sequence[AttemptReport] = (),
        excuses: Sequence[PeerExcuse] = (),
    ) -> HeartbeatAnswer:
        """Send a heartbeat (with the node's per-rank step stats, and its excuses for ranks elsewhere that wait on
        its own); the answer carries pending actions and the other nodes' excuses.

        Raises:
            RpcError: refused (the status code says why).
            WireEnumError: the master sent an action this client does not know.
        """
        request = agent_pb2.HeartbeatRequest(
            node_id=self._own_id(node_id),
            rank_steps=[
                agent_pb2.RankStepStats(
                    rank=r.rank,
                    steps=r.steps,
                    samples=r.samples,
                    median_step_s=r.median_step_s,
                    since_step_s=r.since_step_s,
                    phase=r.phase,
                    median_sync_lead_s=r.median_sync_lead_s,
                    steps_per_mark=r.steps_per_mark,
                    sync_group=r.sync_group,
                )
                for r in rank_steps
            ],
            attempts=[
                agent_pb2.AttemptReport(
                    attempt=a.attempt,
                    rank=a.rank,
                    rendezvous_start=a.rendezvous_start or 0.0,
                    rendezvous_end=a.rendezvous_end or 0.0,
                    workers_start=a.workers_start or 0.0,
                    ready_time=a.ready_time or 0.0,
                    load_s=a.load_s,
                    marks=[
                        agent_pb2.StepMark(step=m.step, end_time=m.end_time, save_s=m.save_s, samples=m.samples)
                        for m in a.marks
                    ],
                )
                for a in attempts
            ],
        )
        if step is not None:
            request.progress.CopyFrom(agent_pb2.StepProgress(step=step, samples=samples))
        request.excuses.extend(excuse_to_proto(e) for e in excuses)
        if resources is not None:
            request.resources.CopyFrom(
                agent_pb2.ResourceSample(
                    cpu_percent=resources.cpu_percent,
                    memory_bytes=resources.memory_bytes,
                    gpu_percent=resources.gpu_percent,
                    gpu_memory_bytes=resources.gpu_memory_bytes,
                )
            )
        # Not retried: the master hands pending actions out once, so a retry after a lost reply
        # would drop them. A lost heartbeat is simply followed by the next one.
        response: agent_pb2.HeartbeatResponse = self._call(self._agent.Heartbeat, request, idempotent=False)
        actions = tuple(
            Action(a.action_id, from_proto(a.kind, agent_pb2.ActionKind, ActionKind), a.reason, a.planned_round)
            for a in response.actions
        )
        excuses = []
        for message in response.peer_excuses:
            try:
                excuses.append(excuse_from_proto(message))
            except ConfigError as exc:  # an excuse only postpones a verdict: without one, none is postponed
                _log.warning("a peer excuse from the master is not one (%s); ignored", exc)
        return HeartbeatAnswer(actions, _state(response.job_state, JobState, "the job state"), tuple(excuses))

    def report_failure(
        self,
        kind: FailureKind,
        evidence: str,
        *,
        exit_code: int = 0,
        node_id: int | None = None,
        agent_exits: bool = False,
    ) -> Decision:
        """Report a failure of this node; the answer is the master's decision (`agent_exits`: this
        agent exits after the report whatever the answer, so it restarts nothing).

        `kind` is what the reporter saw (`dlrover.diagnosis.reported_kind`); the decision's kind
        is the one the master decided on, its `outcome` the master's reason.

        Raises:
            RpcError: refused (the status code says why).
            WireEnumError: the answer names an action or kind this client does not know.
        """
        request = agent_pb2.ReportFailureRequest(
            node_id=self._own_id(node_id),
            kind=proto_name(kind, agent_pb2.FailureKind),
            evidence=evidence,
            exit_code=exit_code,
            agent_exits=agent_exits,
        )
        response: agent_pb2.ReportFailureResponse = self._call(self._agent.ReportFailure, request, idempotent=False)
        return Decision(
            from_proto(response.action, agent_pb2.ActionKind, ActionKind),
            from_proto(response.kind, agent_pb2.FailureKind, FailureKind),
            str(request.node_id),
            response.reason,
            avoid_host=response.avoid_host,
        )

    def report_success(self, *, node_id: int | None = None) -> JobState:
        """Report that this node's training processes succeeded; returns the job's state.

        Raises:
            RpcError: refused (the status code says why).
            WireEnumError: the master named a job state this client does not know.
        """
        request = agent_pb2.ReportSuccessRequest(node_id=self._own_id(node_id))
        response: agent_pb2.ReportSuccessResponse = self._call(self._agent.ReportSuccess, request, idempotent=False)
        return _state(response.job_state, JobState, "the job state")

    def report_checkpoint_steps(
        self, world_size: int, ranks: Mapping[int, Iterable[int]], *, node_id: int | None = None
    ) -> CheckpointStepsAnswer:
        """Report the steps the given ranks hold; the answer names the newest complete step.

        Raises:
            RpcError: refused (the status code says why).
        """
        request = checkpoint_pb2.ReportCheckpointStepsRequest(
            node_id=self._own_id(node_id),
            world_size=world_size,
            ranks=[checkpoint_pb2.RankSteps(rank=r, steps=list(s)) for r, s in ranks.items()],
        )
        response: checkpoint_pb2.ReportCheckpointStepsResponse = self._call(
            self._ckpt.ReportCheckpointSteps, request, idempotent=True
        )
        return CheckpointStepsAnswer(
            complete_step=response.complete_step if response.has_complete_step else None,
            committed_step=response.committed_step if response.has_committed_step else None,
        )

    def commit_checkpoint(self, step: int, path: str = "", *, node_id: int | None = None, world_size: int = 0) -> int:
        """Commit a step; returns the committed step.

        Without `world_size`, the step must have been reported held by every rank
        (`report_checkpoint_steps`). With it, the caller (a checkpoint saver) committed the step of
        `world_size` ranks itself and the master records it as it is.

        Raises:
            RpcError: refused (the status code says why).
        """
        request = checkpoint_pb2.CommitCheckpointRequest(
            node_id=self._own_id(node_id), step=step, path=path, world_size=world_size
        )
        response: checkpoint_pb2.CommitCheckpointResponse = self._call(
            self._ckpt.CommitCheckpoint, request, idempotent=True
        )
        return int(response.committed_step)

    def job_status(self) -> JobSummary:
        """The job's state and the current incarnation of every rank.

        Raises:
            RpcError: refused (the status code says why).
            WireEnumError: the master named a job or node state this client does not know.
        """
        response: job_pb2.GetJobStatusResponse = self._call(
            self._job.GetJobStatus, job_pb2.GetJobStatusRequest(), idempotent=True, identity=False
        )
        return JobSummary(
            job_name=response.job_name,
            state=_state(response.state, JobState, "the job state"),
            exit_reason=response.exit_reason,
            nodes=tuple(_node_summary(n) for n in response.nodes),
            min_nodes=response.min_nodes,
            max_nodes=response.max_nodes,
            job_failures=response.job_failures,
            step=response.step,
            committed_step=response.committed_step if response.has_committed_step else None,
            goodput=response.goodput,
            elapsed_s=response.elapsed_s,
            total_relaunches=response.total_relaunches,
            samples_per_second=response.samples_per_second,
            useful_s=response.useful_s,
            goodput_buckets=tuple((b.name, b.seconds) for b in response.goodput_buckets),
            committed_path=response.committed_path,
            committed_wall_time=response.committed_wall_time,
            target_nodes=response.target_nodes,
            wanted_nodes=response.wanted_nodes,
            capacity=response.capacity if response.HasField("capacity") else None,
            spares=tuple(_node_summary(n) for n in response.spares),
            spare_nodes=response.spare_nodes,
        )

    def list_events(self, after_seq: int = 0, limit: int = 100) -> tuple[JournaledEvent, ...]:
        """The job's events after `after_seq`, at most `limit` (1..1000), oldest first.

        Raises:
            RpcError: refused (the status code says why).
            DLRoverError: an event's data is not a JSON object.
        """
        request = job_pb2.ListEventsRequest(after_seq=after_seq, limit=limit)
        response: job_pb2.ListEventsResponse = self._call(
            self._job.ListEvents, request, idempotent=True, identity=False
        )
        return tuple(_event(e) for e in response.events)

    def stop_job(self, reason: str) -> StopAnswer:
        """Stop the job (every node is stopped); an ended job stays as it ended.

        Raises:
            RpcError: refused (the status code says why).
            WireEnumError: the master named a job state this client does not know.
        """
        request = job_pb2.StopJobRequest(reason=reason)
        response: job_pb2.StopJobResponse = self._call(self._job.StopJob, request, idempotent=True, identity=False)
        return StopAnswer(_state(response.state, JobState, "the job state"), response.exit_reason)

    def resize(self, target: int, reason: str = "") -> ResizeResult:
        """Grow or shrink the job to `target` nodes (`Master.resize`); a retry asks for the same
        count again, which changes nothing more.

        Raises:
            RpcError: refused (INVALID_ARGUMENT for a count outside the group's range, with the
                value and the range in the message) or the master is unreachable.
        """
        request = job_pb2.ResizeJobRequest(target=target, reason=reason)
        response: job_pb2.ResizeJobResponse = self._call(self._job.ResizeJob, request, idempotent=True, identity=False)
        return ResizeResult(
            wanted_nodes=response.wanted_nodes,
            target_nodes=response.target_nodes,
            placeable=response.placeable if response.HasField("placeable") else None,
            launched_ranks=tuple(response.launched_ranks),
            leaving_nodes=tuple(response.leaving_nodes),
            message=response.message,
        )

    def set_capacity(self, slots: int | None) -> int | None:
        """Set the backend's capacity in slots (None: unbounded); returns the free capacity
        afterwards (None: unbounded).

        Raises:
            RpcError: refused (INVALID_ARGUMENT for negative slots; FAILED_PRECONDITION for a
                backend whose capacity no person sets) or the master is unreachable.
        """
        request = job_pb2.SetCapacityRequest(slots=slots)
        response: job_pb2.SetCapacityResponse = self._call(
            self._job.SetCapacity, request, idempotent=True, identity=False
        )
        return response.capacity if response.HasField("capacity") else None

    @property
    def channel(self) -> grpc.Channel:
        """The underlying channel (for raw calls in tests and tools)."""
        return self._channel

    def close(self) -> None:
        """Close the channel."""
        self._channel.close()

    def __enter__(self) -> MasterClient:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


def _node_summary(n: job_pb2.NodeStatus) -> NodeSummary:
    return NodeSummary(
        node_id=n.node_id,
        rank=n.rank,
        state=_state(n.state, NodeState, "the node state"),
        name=n.name,
        host=n.host,
        relaunch_count=n.relaunch_count,
        process_restarts=n.process_restarts,
        step=n.step,
        seconds_since_heartbeat=n.seconds_since_heartbeat,
        last_failure=n.last_failure,
        last_reason=n.last_reason,
    )
