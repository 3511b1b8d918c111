"""A server interceptor that receives, bounds and parses every unary request itself.

Left alone, gRPC Python refuses a request larger than the limit inside its C core and one it
cannot deserialize with INTERNAL ("Exception deserializing request!"): neither reaches any code of
ours, so neither can be counted or logged, and the second looks like a server bug. This
interceptor turns each unary handler into one that reads the raw request itself (gRPC's own
limit is set to a backstop above `max_request_bytes`), so that

- a request larger than `max_request_bytes` gets RESOURCE_EXHAUSTED naming both sizes;
- one that does not parse gets INVALID_ARGUMENT naming the method;
- a call that ends before its request arrives (larger than the backstop, or the client left);
- and a servicer's own INVALID_ARGUMENT, UNAUTHENTICATED and PERMISSION_DENIED answers

are each reported as a `Refusal` with the caller's address. The servicer runs unchanged on the
parsed request.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, NoReturn

import grpc
from google.protobuf.message import DecodeError

from dlrover.common.refusals import (
    INVALID_ARGUMENT,
    MALFORMED,
    NO_REQUEST,
    PERMISSION_DENIED,
    TOO_LARGE,
    UNAUTHENTICATED,
    Refusal,
    RefusalObserver,
    report_refusal,
)

__all__ = ["SERVICER_REFUSALS", "RequestGuardInterceptor", "backstop_bytes"]

if TYPE_CHECKING:
    _ServerInterceptor = grpc.ServerInterceptor[Any, Any]
else:
    _ServerInterceptor = grpc.ServerInterceptor

SERVICER_REFUSALS = {
    grpc.StatusCode.INVALID_ARGUMENT: INVALID_ARGUMENT,
    grpc.StatusCode.UNAUTHENTICATED: UNAUTHENTICATED,
    grpc.StatusCode.PERMISSION_DENIED: PERMISSION_DENIED,
}
"""A servicer's answers that refuse the caller's request, and the reason each is counted under.

Other codes (FAILED_PRECONDITION, NOT_FOUND, UNAVAILABLE...) answer a well-formed request about
the state of the job; they are not refusals of bad input.
"""

_MAX_GRPC_LIMIT = 2**31 - 1


def backstop_bytes(max_request_bytes: int) -> int:
    """gRPC's own receive limit for a server that refuses above `max_request_bytes` itself.

    Twice the limit: a request up to that size reaches the guard, which refuses it with its size
    and the caller's address; a larger one is refused by gRPC's core before any code of ours
    sees it, and is reported as `no_request` without an address. Memory per call stays bounded.
    """
    return min(2 * max_request_bytes, _MAX_GRPC_LIMIT)


def _text(value: object) -> str:
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return "" if value is None else str(value)


class RequestGuardInterceptor(_ServerInterceptor):
    """Bounds and parses unary-unary requests itself and reports every refusal.

    Args:
        max_request_bytes: the largest request accepted.
        observers: told about every refused call.
    """

    def __init__(self, max_request_bytes: int, observers: Sequence[RefusalObserver] = ()) -> None:
        self._max = max_request_bytes
        self._observers = tuple(observers)

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler[Any, Any] | None],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        """Wrap unary-unary handlers so that receiving and parsing happen under our control."""
        handler = continuation(handler_call_details)
        if handler is None or handler.request_streaming or handler.response_streaming:
            return handler
        behavior = handler.unary_unary
        if behavior is None:
            return handler
        parse = handler.request_deserializer
        method = handler_call_details.method
        limit = self._max
        observers = self._observers

        def refuse(
            context: grpc.ServicerContext, peer: str, reason: str, code: grpc.StatusCode, detail: str
        ) -> NoReturn:
            report_refusal(observers, Refusal(reason, method, peer, detail))
            context.abort(code, detail)
            raise AssertionError("unreachable: context.abort raises")  # pragma: no cover

        def receive_then_call(requests: Iterator[bytes], context: grpc.ServicerContext) -> Any:
            # Read before the request: gRPC forgets the peer of a call it has ended itself.
            peer = context.peer() or ""
            try:
                raw = next(requests)
            except (StopIteration, grpc.RpcError):
                refuse(
                    context,
                    peer,
                    NO_REQUEST,
                    grpc.StatusCode.INVALID_ARGUMENT,
                    f"the call to {method} ended before its request arrived (larger than {backstop_bytes(limit)} "
                    "bytes, or the client went away)",
                )
            if len(raw) > limit:
                refuse(
                    context,
                    peer,
                    TOO_LARGE,
                    grpc.StatusCode.RESOURCE_EXHAUSTED,
                    f"the request to {method} has {len(raw)} bytes; this server accepts at most {limit}",
                )
            try:
                request = parse(raw) if parse is not None else raw
            except (DecodeError, ValueError, TypeError) as exc:
                refuse(
                    context, peer, MALFORMED, grpc.StatusCode.INVALID_ARGUMENT, f"malformed request to {method}: {exc}"
                )
            try:
                return behavior(request, context)
            finally:
                reason = SERVICER_REFUSALS.get(context.code())  # type: ignore[attr-defined]
                if reason is not None:
                    detail = _text(context.details())  # type: ignore[attr-defined]
                    report_refusal(observers, Refusal(reason, method, peer, detail))

        return grpc.stream_unary_rpc_method_handler(
            receive_then_call, request_deserializer=None, response_serializer=handler.response_serializer
        )
