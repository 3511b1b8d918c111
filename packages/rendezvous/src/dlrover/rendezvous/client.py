"""The client of `RendezvousService`: deadlines, bounded retries of idempotent calls, domain types."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs

from dlrover.common import (
    ChannelConfig,
    Clock,
    RetryPolicy,
    SystemClock,
    call_unary,
    create_channel,
    master_channel_config,
)
from dlrover.rendezvous.errors import RendezvousTimeoutError
from dlrover.rendezvous.results import HeartbeatResult, JoinResult, NodeParams, PollResult, PollState, WaitingCount
from dlrover.rendezvous.service import POLL_STATES
from dlrover.rendezvous.v1 import rendezvous_pb2 as pb
from dlrover.rendezvous.v1 import rendezvous_pb2_grpc as pb_grpc

__all__ = ["RendezvousClient", "RendezvousStatus"]

_FROM_PB = {v: k for k, v in POLL_STATES.items()}


@attrs.frozen
class RendezvousStatus:
    """A snapshot of the rendezvous, for agents and people.

    Attributes:
        closed: whether the rendezvous is closed.
        round: the latest completed round (0 before the first).
        num_nodes_waiting: nodes waiting for the next round; spares, which no round takes, are
            not counted.
        min_nodes: the configured minimum.
        max_nodes: the configured maximum.
        reason: what happens next to the waiting nodes, and why.
    """

    closed: bool
    round: int
    num_nodes_waiting: int
    min_nodes: int
    max_nodes: int
    reason: str


class RendezvousClient:
    """Calls a `RendezvousService`.

    Only calls that are harmless to repeat are retried (poll, heartbeat, queries, KV set/get/check);
    a join, leave, add or compare-and-set runs once and its failure is the caller's to handle.

    Args:
        target: `host:port` of the service.
        token: the job token.
        channel_config: how to dial; None: `master_channel_config()` (the service is the job
            master's: TLS as the ``DLROVER_MASTER_TLS_*`` variables say, else plaintext).
        policy: deadlines and retry bounds of each call.
        clock: time source for retries and `wait_assigned`.

    Use as a context manager, or call `close()`, to release the channel.
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
        # The generated stub is untyped; each call below converts its answer to domain types.
        self._stub: Any = pb_grpc.RendezvousServiceStub(self._channel)  # type: ignore[no-untyped-call]
        self._policy = policy or RetryPolicy()
        self._clock = clock or SystemClock()
        self.target = target

    def _call(self, method: Any, request: Any, *, idempotent: bool) -> Any:
        return call_unary(method, request, idempotent=idempotent, policy=self._policy, clock=self._clock)

    # -- rendezvous ----------------------------------------------------------------------------

    def join(
        self, node_id: str, *, params: NodeParams | None = None, topology_key: str = "", local_world_size: int = 0
    ) -> JoinResult:
        """Join the waiting list (see `RendezvousManager.join`).

        Raises:
            RpcError: the call failed (INVALID_ARGUMENT for a malformed request).
        """
        request = pb.JoinRequest(node_id=node_id, topology_key=topology_key, local_world_size=local_world_size)
        if params is not None:
            request.min_nodes, request.max_nodes = params.min_nodes, params.max_nodes
        r = self._call(self._stub.Join, request, idempotent=False)
        return JoinResult(accepted=r.accepted, round=r.round, reason=r.reason)

    def poll(self, node_id: str) -> PollResult:
        """Where the node stands (see `RendezvousManager.poll`)."""
        r = self._call(self._stub.Poll, pb.PollRequest(node_id=node_id), idempotent=True)
        return PollResult(
            _FROM_PB[r.state],
            r.round,
            r.rank,
            r.world_size,
            r.reason,
            first_worker_rank=r.first_worker_rank,
            worker_world_size=r.worker_world_size,
            spare=r.spare,
            retry_after_s=r.retry_after_s,
        )

    def wait_assigned(
        self,
        node_id: str,
        *,
        timeout_s: float,
        poll_interval_s: float = 0.05,
        max_poll_interval_s: float = 1.0,
    ) -> PollResult:
        """Poll until the node is assigned a rank or can no longer be (closed, timed out, dropped).

        A spare (`PollResult.spare`) waits with no time limit: `timeout_s` counts from the poll
        after it was given a rank.

        The interval between polls is what each answer asks for (`PollResult.retry_after_s`: the
        service paces the waiting nodes so that together they poll at a bounded rate); from a
        service that does not pace, it starts at `poll_interval_s` and doubles up to
        `max_poll_interval_s`, so a thousand waiting agents do not flood the master.

        Returns:
            The last answer: ASSIGNED, or a terminal state whose reason says why.

        Raises:
            RendezvousTimeoutError: `timeout_s` passed while the node was still waiting; the
                message carries the last reason.
        """
        give_up_at = self._clock.now() + timeout_s
        interval = poll_interval_s
        while True:
            result = self.poll(node_id)
            if result.state is not PollState.WAITING:
                return result
            if result.spare:
                # A spare waits for a rank as long as the master holds it in reserve.
                give_up_at = self._clock.now() + timeout_s
            if self._clock.now() >= give_up_at:
                raise RendezvousTimeoutError(f"node {node_id!r} not admitted within {timeout_s} s: {result.reason}")
            wait = result.retry_after_s if result.retry_after_s > 0 else interval
            self._clock.sleep(min(wait, max(give_up_at - self._clock.now(), 0.0)))
            interval = min(interval * 2, max_poll_interval_s)

    def heartbeat(self, node_id: str) -> HeartbeatResult:
        """Tell the rendezvous the node is alive."""
        r = self._call(self._stub.Heartbeat, pb.HeartbeatRequest(node_id=node_id), idempotent=True)
        return HeartbeatResult(known=r.known, reason=r.reason)

    def num_nodes_waiting(self, node_id: str = "") -> int:
        """Nodes waiting for the next round (at least 1 when `node_id`'s round was dissolved)."""
        return self.waiting_check(node_id).num_nodes_waiting

    def waiting_check(self, node_id: str = "") -> WaitingCount:
        """`num_nodes_waiting`, and when the rendezvous asks this node to ask again."""
        r = self._call(self._stub.NumNodesWaiting, pb.NumNodesWaitingRequest(node_id=node_id), idempotent=True)
        return WaitingCount(int(r.num_nodes_waiting), max(float(r.retry_after_s), 0.0), max(int(r.rounds_formed), 0))

    def announce_restart(self, node_id: str, nodes_waiting: int, round_number: int = 0) -> bool:
        """Say that `node_id`'s workers in round `round_number` (0: the round in force) stop now for a
        new round, because `nodes_waiting` nodes wait to join: its peers' collective errors until it
        joins again are that restart's consequence (see `RendezvousManager.left_behind`). Returns
        whether it was recorded (False: the node is not in the round in force, or that round is over)."""
        request = pb.AnnounceRestartRequest(node_id=node_id, nodes_waiting=nodes_waiting, round=round_number)
        return bool(self._call(self._stub.AnnounceRestart, request, idempotent=True).recorded)

    def leave(self, node_id: str) -> str:
        """Take the node out of the rendezvous; returns what happened."""
        return str(self._call(self._stub.Leave, pb.LeaveRequest(node_id=node_id), idempotent=False).reason)

    def world(self, round_number: int) -> tuple[str, ...]:
        """Node ids by rank of the current round, which must be `round_number`."""
        r = self._call(self._stub.GetWorld, pb.GetWorldRequest(round=round_number), idempotent=True)
        return tuple(r.members)

    def status(self) -> RendezvousStatus:
        """A snapshot of the rendezvous."""
        r = self._call(self._stub.GetStatus, pb.GetStatusRequest(), idempotent=True)
        return RendezvousStatus(r.closed, r.round, r.num_nodes_waiting, r.min_nodes, r.max_nodes, r.reason)

    def close_rendezvous(self) -> None:
        """Close the rendezvous for every node: no more rounds form."""
        self._call(self._stub.Close, pb.CloseRequest(), idempotent=True)

    # -- key-value store -----------------------------------------------------------------------

    def kv_set(self, keys: Sequence[str], values: Sequence[bytes]) -> None:
        """Set each key to its value, all or none."""
        self._call(self._stub.KvSet, pb.KvSetRequest(keys=list(keys), values=list(values)), idempotent=True)

    def kv_get(self, keys: Sequence[str]) -> list[bytes | None]:
        """The value of each key, None for each that is not set."""
        r = self._call(self._stub.KvGet, pb.KvGetRequest(keys=list(keys)), idempotent=True)
        return [v if found else None for found, v in zip(r.found, r.values, strict=True)]

    def kv_add(self, key: str, amount: int) -> int:
        """Add to a counter; returns its new value."""
        return int(self._call(self._stub.KvAdd, pb.KvAddRequest(key=key, amount=amount), idempotent=False).value)

    def kv_compare_set(self, key: str, expected: bytes, desired: bytes) -> bytes:
        """Compare-and-set; returns the value the key holds afterwards."""
        request = pb.KvCompareSetRequest(key=key, expected=expected, desired=desired)
        return bytes(self._call(self._stub.KvCompareSet, request, idempotent=False).value)

    def kv_check(self, keys: Sequence[str]) -> bool:
        """Whether every key is set."""
        return bool(self._call(self._stub.KvCheck, pb.KvCheckRequest(keys=list(keys)), idempotent=True).all_set)

    def kv_delete(self, key: str) -> bool:
        """Delete a key; whether it existed."""
        return bool(self._call(self._stub.KvDelete, pb.KvDeleteRequest(key=key), idempotent=False).deleted)

    def kv_num_keys(self) -> int:
        """How many keys are set."""
        return int(self._call(self._stub.KvNumKeys, pb.KvNumKeysRequest(), idempotent=True).num_keys)

    # -- lifetime ------------------------------------------------------------------------------

    def close(self) -> None:
        """Release the channel."""
        self._channel.close()

    def __enter__(self) -> RendezvousClient:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()
