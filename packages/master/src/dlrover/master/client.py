"""`MasterClient`: what an agent (or a tool) uses to talk to the master.

After `register`, every agent call carries the node identity metadata automatically.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import grpc

from dlrover.common import ChannelConfig, Clock, RetryPolicy, call_unary, create_channel
from dlrover.master.identity import node_metadata
from dlrover.master.states import FailureKind
from dlrover.master.v1 import agent_pb2, agent_pb2_grpc, checkpoint_pb2, checkpoint_pb2_grpc, job_pb2, job_pb2_grpc

__all__ = ["FAILURE_KIND_TO_PROTO", "MasterClient"]

FAILURE_KIND_TO_PROTO = {
    FailureKind.PROCESS_CRASH: agent_pb2.FAILURE_KIND_PROCESS_CRASH,
    FailureKind.USER_CODE_ERROR: agent_pb2.FAILURE_KIND_USER_CODE_ERROR,
    FailureKind.OOM: agent_pb2.FAILURE_KIND_OOM,
    FailureKind.HARDWARE: agent_pb2.FAILURE_KIND_HARDWARE,
    FailureKind.NETWORK: agent_pb2.FAILURE_KIND_NETWORK,
    FailureKind.HANG: agent_pb2.FAILURE_KIND_HANG,
    FailureKind.UNKNOWN: agent_pb2.FAILURE_KIND_UNKNOWN,
}


class MasterClient:
    """A client of the master's AgentService, CheckpointService and JobService.

    Args:
        target: the master's `host:port`.
        token: the job token.
        channel_config: size limits and TLS.
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
        self._channel = create_channel(target, token, channel_config)
        # The generated stubs are untyped; the typed surface is this class's methods.
        self._agent: Any = agent_pb2_grpc.AgentServiceStub(self._channel)  # type: ignore[no-untyped-call]
        self._ckpt: Any = checkpoint_pb2_grpc.CheckpointServiceStub(self._channel)  # type: ignore[no-untyped-call]
        self._job: Any = job_pb2_grpc.JobServiceStub(self._channel)  # type: ignore[no-untyped-call]
        self._policy = policy or RetryPolicy()
        self._clock = clock
        self.node_id: int | None = None
        self.credential: str | None = None

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
    ) -> agent_pb2.RegisterNodeResponse:
        """Register and remember the node's identity for later calls.

        `max_restarts`: the worker restarts this agent allows (its ``--max-restarts``), the
        node's process-restart budget at the master; None leaves the master's own.

        Raises:
            RpcError: refused (the status code says why).
        """
        request = agent_pb2.RegisterNodeRequest(node_name=node_name, host=host, local_world_size=local_world_size)
        if node_id is not None:
            request.node_id = node_id
        if max_restarts is not None:
            request.max_restarts = max_restarts
        response: agent_pb2.RegisterNodeResponse = self._call(self._agent.RegisterNode, request, idempotent=False)
        self.set_identity(response.node_id, response.node_credential)
        return response

    def heartbeat(
        self,
        *,
        step: int | None = None,
        samples: int = 0,
        resources: agent_pb2.ResourceSample | None = None,
        node_id: int | None = None,
        rank_steps: Sequence[agent_pb2.RankStepStats] = (),
    ) -> agent_pb2.HeartbeatResponse:
        """Send a heartbeat (with the node's per-rank step stats); the answer carries pending actions."""
        request = agent_pb2.HeartbeatRequest(node_id=self._own_id(node_id), rank_steps=list(rank_steps))
        if step is not None:
            request.progress.CopyFrom(agent_pb2.StepProgress(step=step, samples=samples))
        if resources is not None:
            request.resources.CopyFrom(resources)
        # Not retried: the master hands pending actions out once, so a retry after a lost reply
        # would drop them. A lost heartbeat is simply followed by the next one.
        response: agent_pb2.HeartbeatResponse = self._call(self._agent.Heartbeat, request, idempotent=False)
        return response

    def report_failure(
        self,
        kind: FailureKind,
        evidence: str,
        *,
        exit_code: int = 0,
        node_id: int | None = None,
        agent_exits: bool = False,
    ) -> agent_pb2.ReportFailureResponse:
        """Report a failure of this node; the answer is the master's decision (`agent_exits`: this
        agent exits after the report whatever the answer, so it restarts nothing)."""
        request = agent_pb2.ReportFailureRequest(
            node_id=self._own_id(node_id),
            kind=FAILURE_KIND_TO_PROTO[kind],
            evidence=evidence,
            exit_code=exit_code,
            agent_exits=agent_exits,
        )
        response: agent_pb2.ReportFailureResponse = self._call(self._agent.ReportFailure, request, idempotent=False)
        return response

    def report_success(self, *, node_id: int | None = None) -> agent_pb2.ReportSuccessResponse:
        """Report that this node's training processes succeeded."""
        request = agent_pb2.ReportSuccessRequest(node_id=self._own_id(node_id))
        response: agent_pb2.ReportSuccessResponse = self._call(self._agent.ReportSuccess, request, idempotent=False)
        return response

    def report_checkpoint_steps(
        self, world_size: int, ranks: Mapping[int, Iterable[int]], *, node_id: int | None = None
    ) -> checkpoint_pb2.ReportCheckpointStepsResponse:
        """Report the steps the given ranks hold; the answer names the newest complete step."""
        request = checkpoint_pb2.ReportCheckpointStepsRequest(
            node_id=self._own_id(node_id),
            world_size=world_size,
            ranks=[checkpoint_pb2.RankSteps(rank=r, steps=list(s)) for r, s in ranks.items()],
        )
        response: checkpoint_pb2.ReportCheckpointStepsResponse = self._call(
            self._ckpt.ReportCheckpointSteps, request, idempotent=True
        )
        return response

    def commit_checkpoint(self, step: int, path: str = "", *, node_id: int | None = None) -> int:
        """Commit a step held by every rank; returns the committed step."""
        request = checkpoint_pb2.CommitCheckpointRequest(node_id=self._own_id(node_id), step=step, path=path)
        response: checkpoint_pb2.CommitCheckpointResponse = self._call(
            self._ckpt.CommitCheckpoint, request, idempotent=True
        )
        return int(response.committed_step)

    def job_status(self) -> job_pb2.GetJobStatusResponse:
        """The job's status."""
        response: job_pb2.GetJobStatusResponse = self._call(
            self._job.GetJobStatus, job_pb2.GetJobStatusRequest(), idempotent=True, identity=False
        )
        return response

    def list_events(self, after_seq: int = 0, limit: int = 100) -> list[job_pb2.JobEvent]:
        """Events after `after_seq`."""
        request = job_pb2.ListEventsRequest(after_seq=after_seq, limit=limit)
        response: job_pb2.ListEventsResponse = self._call(
            self._job.ListEvents, request, idempotent=True, identity=False
        )
        return list(response.events)

    def stop_job(self, reason: str) -> job_pb2.StopJobResponse:
        """Stop the job."""
        request = job_pb2.StopJobRequest(reason=reason)
        response: job_pb2.StopJobResponse = self._call(self._job.StopJob, request, idempotent=True, identity=False)
        return response

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
