"""ShardService over gRPC: a thin servicer around a `ShardRegistry`.

Each method converts the request to domain values, makes one registry call under the servicer's
lock (the core is not thread-safe), and converts the result back. Domain errors become gRPC
status codes with the error's message; a rejected request changed nothing.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import NoReturn, TypeVar

import grpc

from dlrover.common import ConfigError, GrpcServer
from dlrover.shard.convert import fill_shard_proto, spec_from_proto, status_to_proto
from dlrover.shard.errors import (
    InvalidShardRequestError,
    ShardStateError,
    UnknownDatasetError,
    UnknownShardError,
)
from dlrover.shard.registry import ShardRegistry
from dlrover.shard.results import FetchResult
from dlrover.shard.v1 import shard_pb2 as pb
from dlrover.shard.v1 import shard_pb2_grpc

__all__ = ["ShardServicer", "add_shard_service", "status_code_of"]

_T = TypeVar("_T")


def status_code_of(exc: Exception) -> grpc.StatusCode | None:
    """The gRPC status a domain error maps to, or None for an unexpected error."""
    if isinstance(exc, InvalidShardRequestError | ConfigError):
        return grpc.StatusCode.INVALID_ARGUMENT
    if isinstance(exc, UnknownDatasetError | UnknownShardError):
        return grpc.StatusCode.NOT_FOUND
    if isinstance(exc, ShardStateError):
        return grpc.StatusCode.FAILED_PRECONDITION
    return None


class ShardServicer(shard_pb2_grpc.ShardServiceServicer):
    """Serves one `ShardRegistry`.

    Args:
        registry: the datasets served; the servicer serializes every call to it.
    """

    def __init__(self, registry: ShardRegistry) -> None:
        self._registry = registry
        self._lock = threading.Lock()

    @contextmanager
    def locked(self) -> Iterator[ShardRegistry]:
        """The registry, under the lock the RPCs use (for hosts that also drive it, e.g. a stream poller)."""
        with self._lock:
            yield self._registry

    def _call(self, context: grpc.ServicerContext, fn: Callable[[ShardRegistry], _T]) -> _T:
        try:
            with self._lock:
                return fn(self._registry)
        except Exception as exc:
            code = status_code_of(exc)
            if code is None:
                raise
            _abort(context, code, str(exc))

    def RegisterDataset(
        self, request: pb.RegisterDatasetRequest, context: grpc.ServicerContext
    ) -> pb.RegisterDatasetResponse:
        """Register a dataset (a no-op for an identical spec)."""
        res = self._call(context, lambda r: r.register(spec_from_proto(request.spec)))
        return pb.RegisterDatasetResponse(created=res.created, reason=res.reason)

    def _read_checkpoint(self, registry: ShardRegistry, dataset: str) -> str:
        """A dataset's progress checkpoint, read under the lock for a reply (a subclass may note it)."""
        return registry.checkpoint(dataset)

    def FetchShards(self, request: pb.FetchShardsRequest, context: grpc.ServicerContext) -> pb.FetchShardsResponse:
        """Lease up to `count` shards, after applying the acknowledgements sent with the request and
        reading the progress checkpoint when asked."""
        acknowledged = [(a.shard_id, a.consumed, a.done) for a in request.acknowledged]

        def fetch(registry: ShardRegistry) -> tuple[str, FetchResult, int | None]:
            # A sync (acknowledgements, or a read) may lease nothing; a plain fetch asks for 1 or more.
            lowest = 0 if acknowledged or request.with_checkpoint else 1
            if not lowest <= request.count <= registry.config.max_fetch_count:  # refused before anything changes
                raise InvalidShardRequestError(
                    f"count must be in {lowest}..{registry.config.max_fetch_count}, got {request.count}"
                )
            if acknowledged:
                registry.acknowledge(request.dataset, request.worker, acknowledged, request.request_id)
            # Read before the lease: the document is what GetCheckpoint would have answered just before.
            document = self._read_checkpoint(registry, request.dataset) if request.with_checkpoint else ""
            if request.count == 0:
                registry.manager(request.dataset)  # an unknown dataset is refused as by a fetch
                res = FetchResult((), False, "nothing asked for")
            else:
                res = registry.fetch(request.dataset, request.worker, request.count, request.request_id)
            return document, res, registry.manager(request.dataset).shards_to_hand_out

        document, res, todo = self._call(context, fetch)
        response = pb.FetchShardsResponse(
            finished=res.finished,
            reason=res.reason,
            checkpoint=document,
            acknowledged=len(acknowledged),
            todo=-1 if todo is None else todo,
        )
        for shard in res.shards:
            fill_shard_proto(response.shards.add(), shard)
        return response

    def ReportProgress(
        self, request: pb.ReportProgressRequest, context: grpc.ServicerContext
    ) -> pb.ReportProgressResponse:
        """Record progress and renew the lease."""
        res = self._call(
            context,
            lambda r: r.report_progress(
                request.dataset,
                request.worker,
                request.shard_id,
                request.consumed,
                request.request_id,
                attempt=request.attempt if request.HasField("attempt") else None,
            ),
        )
        return pb.ReportProgressResponse(changed=res.changed, reason=res.reason)

    def ReportDone(self, request: pb.ReportDoneRequest, context: grpc.ServicerContext) -> pb.ReportDoneResponse:
        """Record a finished shard."""
        res = self._call(
            context,
            lambda r: r.report_done(request.dataset, request.worker, request.shard_id, request.request_id),
        )
        return pb.ReportDoneResponse(changed=res.changed, reason=res.reason)

    def ReportFailure(
        self, request: pb.ReportFailureRequest, context: grpc.ServicerContext
    ) -> pb.ReportFailureResponse:
        """Record a failed shard."""
        consumed = request.consumed if request.HasField("consumed") else None
        res = self._call(
            context,
            lambda r: r.report_failure(
                request.dataset,
                request.worker,
                request.shard_id,
                request.reason,
                consumed=consumed,
                request_id=request.request_id,
            ),
        )
        return pb.ReportFailureResponse(changed=res.changed, reason=res.reason)

    def RemoveWorker(self, request: pb.RemoveWorkerRequest, context: grpc.ServicerContext) -> pb.RemoveWorkerResponse:
        """Take back every shard a worker holds."""
        released = self._call(context, lambda r: r.remove_worker(request.worker, request.reason or "worker removed"))
        return pb.RemoveWorkerResponse(
            released=[pb.ReleasedShards(dataset=d, shard_ids=ids) for d, ids in released.items() if ids]
        )

    def GetCheckpoint(
        self, request: pb.GetCheckpointRequest, context: grpc.ServicerContext
    ) -> pb.GetCheckpointResponse:
        """The progress checkpoint of a dataset."""
        document = self._call(context, lambda r: self._read_checkpoint(r, request.dataset))
        return pb.GetCheckpointResponse(document=document)

    def RestoreCheckpoint(
        self, request: pb.RestoreCheckpointRequest, context: grpc.ServicerContext
    ) -> pb.RestoreCheckpointResponse:
        """Restore a progress checkpoint."""
        res = self._call(context, lambda r: r.restore(request.document, request.dataset, request.request_id))
        return pb.RestoreCheckpointResponse(
            dataset=res.dataset, returned_to_queue=res.returned_to_queue, reason=res.reason
        )

    def GetStatus(self, request: pb.GetStatusRequest, context: grpc.ServicerContext) -> pb.GetStatusResponse:
        """Counts and throughput of a dataset."""
        return status_to_proto(self._call(context, lambda r: r.manager(request.dataset).status()))


def _abort(context: grpc.ServicerContext, code: grpc.StatusCode, message: str) -> NoReturn:
    context.abort(code, message)
    raise AssertionError("context.abort returned")  # pragma: no cover (abort always raises)


def add_shard_service(server: GrpcServer, registry: ShardRegistry) -> ShardServicer:
    """Register a `ShardServicer` for `registry` on `server` (before it starts), e.g. in the master.

    Returns:
        The servicer, whose `locked()` gives safe access to the registry while serving.
    """
    servicer = ShardServicer(registry)
    server.add(shard_pb2_grpc.add_ShardServiceServicer_to_server, servicer)
    return servicer
