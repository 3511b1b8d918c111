"""The no-op `PingService`: liveness checks and the baseline for RPC benchmarks."""

from __future__ import annotations

import grpc

from dlrover.common.server import GrpcServer
from dlrover.common.v1 import ping_pb2, ping_pb2_grpc

__all__ = ["PingServicer", "add_ping_service"]


class PingServicer(ping_pb2_grpc.PingServiceServicer):
    """Answers every ping with its own payload."""

    def Ping(self, request: ping_pb2.PingRequest, context: grpc.ServicerContext) -> ping_pb2.PingResponse:
        return ping_pb2.PingResponse(payload=request.payload)


def add_ping_service(server: GrpcServer) -> None:
    """Register a `PingServicer` on `server` (before it starts)."""
    server.add(ping_pb2_grpc.add_PingServiceServicer_to_server, PingServicer())
