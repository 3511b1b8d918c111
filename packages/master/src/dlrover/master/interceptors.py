"""A server interceptor that answers an unparseable request with INVALID_ARGUMENT.

Left alone, gRPC Python answers a request it cannot deserialize with INTERNAL ("Exception
deserializing request!") and logs a traceback: it looks like a server bug and tells the caller
nothing. This interceptor parses the request itself and names the message type that failed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import grpc
from google.protobuf.message import DecodeError

__all__ = ["MalformedRequestInterceptor"]

if TYPE_CHECKING:
    _ServerInterceptor = grpc.ServerInterceptor[Any, Any]
else:
    _ServerInterceptor = grpc.ServerInterceptor


class MalformedRequestInterceptor(_ServerInterceptor):
    """Parses unary-unary requests itself; a parse failure becomes INVALID_ARGUMENT."""

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler[Any, Any] | None],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        """Wrap unary-unary handlers so that parsing happens inside the call, under our control."""
        handler = continuation(handler_call_details)
        if handler is None or handler.request_streaming or handler.response_streaming:
            return handler
        parse = handler.request_deserializer
        behavior = handler.unary_unary
        if parse is None or behavior is None:
            return handler
        method = handler_call_details.method

        def parse_then_call(raw: bytes, context: grpc.ServicerContext) -> Any:
            try:
                request = parse(raw)
            except (DecodeError, ValueError, TypeError) as exc:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"malformed request to {method}: {exc}")
            return behavior(request, context)

        return grpc.unary_unary_rpc_method_handler(
            parse_then_call, request_deserializer=None, response_serializer=handler.response_serializer
        )
