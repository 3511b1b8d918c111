"""The gRPC edge of the rendezvous: a thin servicer over `RendezvousManager` and `KeyValueStore`.

Each method converts the request to domain values, makes one core call under the service's lock,
and converts the answer back. Bad input is refused with a status that names the bad value
(INVALID_ARGUMENT, FAILED_PRECONDITION, NOT_FOUND, RESOURCE_EXHAUSTED) and changes nothing.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import NoReturn, TypeVar

import grpc

from dlrover.common import Clock, GrpcServer, SystemClock
from dlrover.rendezvous.errors import InvalidRequestError, StoreFullError, UnknownNodeError, UnknownRoundError
from dlrover.rendezvous.kv import KeyValueStore
from dlrover.rendezvous.manager import RendezvousManager
from dlrover.rendezvous.results import NodeParams, PollState
from dlrover.rendezvous.v1 import rendezvous_pb2 as pb
from dlrover.rendezvous.v1 import rendezvous_pb2_grpc as pb_grpc

__all__ = ["POLL_STATES", "RendezvousServicer", "add_rendezvous_service"]

_T = TypeVar("_T")

POLL_STATES: dict[PollState, pb.PollState] = {
    PollState.WAITING: pb.POLL_STATE_WAITING,
    PollState.ASSIGNED: pb.POLL_STATE_ASSIGNED,
    PollState.NOT_WAITING: pb.POLL_STATE_NOT_WAITING,
    PollState.TIMED_OUT: pb.POLL_STATE_TIMED_OUT,
    PollState.CLOSED: pb.POLL_STATE_CLOSED,
}

# Most specific first: UnknownNodeError and UnknownRoundError are LookupErrors, InvalidRequestError a ValueError.
_STATUS: tuple[tuple[type[Exception], grpc.StatusCode], ...] = (
    (UnknownNodeError, grpc.StatusCode.FAILED_PRECONDITION),
    (UnknownRoundError, grpc.StatusCode.NOT_FOUND),
    (StoreFullError, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (InvalidRequestError, grpc.StatusCode.INVALID_ARGUMENT),
)


def _abort(context: grpc.ServicerContext, exc: Exception) -> NoReturn:
    for kind, code in _STATUS:
        if isinstance(exc, kind):
            context.abort(code, str(exc))
    raise exc


def _params(request: pb.JoinRequest) -> NodeParams | None:
    if request.min_nodes == 0 and request.max_nodes == 0:
        return None
    return NodeParams(min_nodes=request.min_nodes, max_nodes=request.max_nodes)


class RendezvousServicer(pb_grpc.RendezvousServiceServicer):
    """Serves one rendezvous and its key-value store.

    Args:
        manager: the rendezvous state machine.
        kv: the key-value store behind the Kv* calls.
        clock: the time source passed to the manager as `now`.
    """

    def __init__(self, manager: RendezvousManager, kv: KeyValueStore | None = None, clock: Clock | None = None) -> None:
        self._manager = manager
        self._kv = kv or KeyValueStore()
        self._clock = clock or SystemClock()
        # gRPC serves calls on many threads; the cores are plain single-threaded objects.
        self._lock = threading.Lock()

    @property
    def manager(self) -> RendezvousManager:
        """The manager served (hold `lock` to read it while the server runs)."""
        return self._manager

    @property
    def lock(self) -> threading.Lock:
        """The lock every call holds while it touches the cores."""
        return self._lock

    def _run(self, context: grpc.ServicerContext, call: Callable[[], _T]) -> _T:
        try:
            with self._lock:
                return call()
        except (InvalidRequestError, UnknownNodeError, UnknownRoundError, StoreFullError) as exc:
            _abort(context, exc)

    def Join(self, request: pb.JoinRequest, context: grpc.ServicerContext) -> pb.JoinResponse:
        def call() -> pb.JoinResponse:
            params = _params(request)
            r = self._manager.join(
                request.node_id,
                self._clock.now(),
                params=params,
                topology_key=request.topology_key,
                local_world_size=request.local_world_size,
            )
            return pb.JoinResponse(accepted=r.accepted, round=r.round, reason=r.reason)

        return self._run(context, call)

    def Poll(self, request: pb.PollRequest, context: grpc.ServicerContext) -> pb.PollResponse:
        def call() -> pb.PollResponse:
            r = self._manager.poll(request.node_id, self._clock.now())
            return pb.PollResponse(
                state=POLL_STATES[r.state],
                round=r.round,
                rank=r.rank,
                world_size=r.world_size,
                reason=r.reason,
                first_worker_rank=r.first_worker_rank,
                worker_world_size=r.worker_world_size,
                spare=r.spare,
                retry_after_s=r.retry_after_s,
            )

        return self._run(context, call)

    def Heartbeat(self, request: pb.HeartbeatRequest, context: grpc.ServicerContext) -> pb.HeartbeatResponse:
        def call() -> pb.HeartbeatResponse:
            r = self._manager.heartbeat(request.node_id, self._clock.now())
            return pb.HeartbeatResponse(known=r.known, reason=r.reason)

        return self._run(context, call)

    def NumNodesWaiting(
        self, request: pb.NumNodesWaitingRequest, context: grpc.ServicerContext
    ) -> pb.NumNodesWaitingResponse:
        def call() -> pb.NumNodesWaitingResponse:
            r = self._manager.waiting_check(self._clock.now(), request.node_id or None)
            return pb.NumNodesWaitingResponse(
                num_nodes_waiting=r.num_nodes_waiting, retry_after_s=r.retry_after_s, rounds_formed=r.rounds_formed
            )

        return self._run(context, call)

    def Leave(self, request: pb.LeaveRequest, context: grpc.ServicerContext) -> pb.LeaveResponse:
        return self._run(
            context, lambda: pb.LeaveResponse(reason=self._manager.leave(request.node_id, self._clock.now()))
        )

    def AnnounceRestart(
        self, request: pb.AnnounceRestartRequest, context: grpc.ServicerContext
    ) -> pb.AnnounceRestartResponse:
        def call() -> pb.AnnounceRestartResponse:
            waiting = request.nodes_waiting
            if waiting < 1:
                raise InvalidRequestError(
                    f"nodes_waiting must be at least 1 (the nodes the restart is for), got {waiting}"
                )
            why = f"its workers stop for a new round: {waiting} node(s) wait to join"
            recorded = self._manager.processes_restarting(request.node_id, why, round_number=request.round)
            return pb.AnnounceRestartResponse(recorded=recorded)

        return self._run(context, call)

    def GetWorld(self, request: pb.GetWorldRequest, context: grpc.ServicerContext) -> pb.GetWorldResponse:
        def call() -> pb.GetWorldResponse:
            r = self._manager.world(request.round)
            return pb.GetWorldResponse(round=r.number, members=list(r.members), reason=r.reason)

        return self._run(context, call)

    def GetStatus(self, request: pb.GetStatusRequest, context: grpc.ServicerContext) -> pb.GetStatusResponse:
        def call() -> pb.GetStatusResponse:
            m = self._manager
            decision = m.status(self._clock.now())
            return pb.GetStatusResponse(
                closed=m.closed,
                round=m.round_number,
                num_nodes_waiting=len(m.waiting) - len(m.waiting_spares),
                min_nodes=m.config.min_nodes,
                max_nodes=m.config.max_nodes,
                reason=decision.reason,
            )

        return self._run(context, call)

    def Close(self, request: pb.CloseRequest, context: grpc.ServicerContext) -> pb.CloseResponse:
        def call() -> pb.CloseResponse:
            self._manager.close(self._clock.now())
            return pb.CloseResponse()

        return self._run(context, call)

    def KvSet(self, request: pb.KvSetRequest, context: grpc.ServicerContext) -> pb.KvSetResponse:
        def call() -> pb.KvSetResponse:
            self._kv.multi_set(list(request.keys), list(request.values))
            return pb.KvSetResponse()

        return self._run(context, call)

    def KvGet(self, request: pb.KvGetRequest, context: grpc.ServicerContext) -> pb.KvGetResponse:
        def call() -> pb.KvGetResponse:
            values = self._kv.multi_get(list(request.keys))
            return pb.KvGetResponse(found=[v is not None for v in values], values=[v or b"" for v in values])

        return self._run(context, call)

    def KvAdd(self, request: pb.KvAddRequest, context: grpc.ServicerContext) -> pb.KvAddResponse:
        return self._run(context, lambda: pb.KvAddResponse(value=self._kv.add(request.key, request.amount)))

    def KvCompareSet(self, request: pb.KvCompareSetRequest, context: grpc.ServicerContext) -> pb.KvCompareSetResponse:
        return self._run(
            context,
            lambda: pb.KvCompareSetResponse(value=self._kv.compare_set(request.key, request.expected, request.desired)),
        )

    def KvCheck(self, request: pb.KvCheckRequest, context: grpc.ServicerContext) -> pb.KvCheckResponse:
        return self._run(context, lambda: pb.KvCheckResponse(all_set=self._kv.check(list(request.keys))))

    def KvDelete(self, request: pb.KvDeleteRequest, context: grpc.ServicerContext) -> pb.KvDeleteResponse:
        return self._run(context, lambda: pb.KvDeleteResponse(deleted=self._kv.delete_key(request.key)))

    def KvNumKeys(self, request: pb.KvNumKeysRequest, context: grpc.ServicerContext) -> pb.KvNumKeysResponse:
        return self._run(context, lambda: pb.KvNumKeysResponse(num_keys=self._kv.num_keys()))


def add_rendezvous_service(
    server: GrpcServer,
    manager: RendezvousManager,
    *,
    kv: KeyValueStore | None = None,
    clock: Clock | None = None,
) -> RendezvousServicer:
    """Register a `RendezvousServicer` on `server` (before it starts), so a master can host it.

    Returns:
        The servicer, for status pages and tests.
    """
    servicer = RendezvousServicer(manager, kv, clock)
    server.add(pb_grpc.add_RendezvousServiceServicer_to_server, servicer)
    return servicer
