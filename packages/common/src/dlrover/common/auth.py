"""Per-job token authentication for every RPC.

A job has one secret token. Servers reject any call that does not carry it with
`UNAUTHENTICATED`; clients attach it to every call. The token travels in the `authorization`
metadata entry as `Bearer <token>` and is compared in constant time.
"""

from __future__ import annotations

import hmac
import os
import secrets
import stat
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import grpc

from dlrover.common.errors import AuthError
from dlrover.common.refusals import BAD_TOKEN, MISSING_TOKEN, Refusal, RefusalObserver, report_refusal

__all__ = [
    "AUTH_METADATA_KEY",
    "TOKEN_ENV_VAR",
    "TOKEN_FILE_ENV_VAR",
    "TokenAuthServerInterceptor",
    "TokenClientInterceptor",
    "generate_token",
    "find_token",
    "load_token",
    "validate_token",
    "write_token_file",
]

AUTH_METADATA_KEY = "authorization"
TOKEN_ENV_VAR = "DLROVER_JOB_TOKEN"  # noqa: S105 (the variable's name, not a secret)
TOKEN_FILE_ENV_VAR = "DLROVER_JOB_TOKEN_FILE"  # noqa: S105
_MIN_TOKEN_CHARS = 16
_MAX_TOKEN_CHARS = 512
_BEARER = "Bearer "

# grpc-stubs makes the interceptor bases generic; at run time they are plain classes.
if TYPE_CHECKING:
    _ServerInterceptor = grpc.ServerInterceptor[Any, Any]
    _UnaryUnary = grpc.UnaryUnaryClientInterceptor[Any, Any]
    _UnaryStream = grpc.UnaryStreamClientInterceptor[Any, Any]
    _StreamUnary = grpc.StreamUnaryClientInterceptor[Any, Any]
    _StreamStream = grpc.StreamStreamClientInterceptor[Any, Any]
else:
    _ServerInterceptor = grpc.ServerInterceptor
    _UnaryUnary = grpc.UnaryUnaryClientInterceptor
    _UnaryStream = grpc.UnaryStreamClientInterceptor
    _StreamUnary = grpc.StreamUnaryClientInterceptor
    _StreamStream = grpc.StreamStreamClientInterceptor


def generate_token() -> str:
    """A fresh random token (256 bits, URL-safe base64)."""
    return secrets.token_urlsafe(32)


def validate_token(token: str) -> str:
    """Return `token` if it can be used, else raise.

    Raises:
        AuthError: the token is shorter than 16 or longer than 512 characters, or holds
            characters that gRPC metadata cannot carry (only printable ASCII is allowed).
    """
    if not isinstance(token, str):
        raise AuthError(f"a token must be a string, got {type(token).__name__}")
    if not _MIN_TOKEN_CHARS <= len(token) <= _MAX_TOKEN_CHARS:
        raise AuthError(f"a token must have {_MIN_TOKEN_CHARS} to {_MAX_TOKEN_CHARS} characters, got {len(token)}")
    if not all(33 <= ord(ch) <= 126 for ch in token):
        raise AuthError("a token may hold only printable ASCII characters without spaces")
    return token


def write_token_file(path: str | os.PathLike[str], token: str) -> Path:
    """Write `token` to `path`, readable and writable by the owner only (mode 0600).

    The file is created with mode 0600 from the start, so the token is never readable by
    others, not even briefly.

    Returns:
        The path written.
    """
    validate_token(token)
    target = Path(path)
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, token.encode("ascii"))
        os.fsync(fd)
    finally:
        os.close(fd)
    return target


def _read_token_file(path: Path) -> str:
    try:
        info = path.stat()
    except FileNotFoundError:
        raise AuthError(f"token file {str(path)!r} does not exist") from None
    if not stat.S_ISREG(info.st_mode):
        raise AuthError(f"token file {str(path)!r} is not a regular file")
    if info.st_mode & 0o077:
        raise AuthError(
            f"token file {str(path)!r} has mode {stat.S_IMODE(info.st_mode):04o}; "
            "it must not be readable by group or others (chmod 600)"
        )
    if info.st_uid != os.getuid():
        raise AuthError(f"token file {str(path)!r} is not owned by the current user")
    return validate_token(path.read_text(encoding="ascii").strip())


def find_token(
    token: str | None = None,
    *,
    token_file: str | os.PathLike[str] | None = None,
    environ: Mapping[str, str] | None = None,
) -> tuple[str, Path | None] | None:
    """The job token, where `load_token` looks for it, and the file it was read from.

    Returns:
        (token, file; None when it was not read from a file), or None when no token is given
        anywhere.

    Raises:
        AuthError: the token found is unusable.
    """
    env = os.environ if environ is None else environ
    if token is not None:
        return validate_token(token), None
    path = token_file if token_file is not None else env.get(TOKEN_FILE_ENV_VAR) or None
    if path is not None:
        return _read_token_file(Path(path)), Path(path)
    if env.get(TOKEN_ENV_VAR):
        return validate_token(env[TOKEN_ENV_VAR]), None
    return None


def load_token(
    token: str | None = None,
    *,
    token_file: str | os.PathLike[str] | None = None,
    environ: Mapping[str, str] | None = None,
) -> str:
    """Find the job token: from the argument, else a file, else the environment.

    Order: `token`; `token_file`; the file named by `DLROVER_JOB_TOKEN_FILE`; the value of
    `DLROVER_JOB_TOKEN`. A token file must be a regular file owned by the current user with no
    permissions for group or others.

    Raises:
        AuthError: no token was found, or the one found is unusable.
    """
    found = find_token(token, token_file=token_file, environ=environ)
    if found is None:
        raise AuthError(f"no job token: pass one, or set {TOKEN_FILE_ENV_VAR} to a 0600 file, or set {TOKEN_ENV_VAR}")
    return found[0]


def _tokens_equal(presented: str, expected: bytes) -> bool:
    return hmac.compare_digest(presented.encode("utf-8", "replace"), expected)


def _deny(
    handler: grpc.RpcMethodHandler[Any, Any],
    method: str,
    reason: str,
    message: str,
    observers: tuple[RefusalObserver, ...],
) -> grpc.RpcMethodHandler[Any, Any]:
    """A handler that reports the refusal and aborts with UNAUTHENTICATED, without reading the request.

    It takes the request as a stream it never reads, whatever the method's kind (the wire is the
    same), so an unauthenticated caller's payload is neither waited for nor parsed, and the
    caller's address is still known when the refusal is reported.
    """

    def abort(_requests: Any, context: grpc.ServicerContext) -> Any:
        report_refusal(observers, Refusal(reason, method, context.peer() or "", message))
        context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    if handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(abort)
    return grpc.stream_unary_rpc_method_handler(abort)


class TokenAuthServerInterceptor(_ServerInterceptor):
    """Rejects every call whose `authorization` metadata is not `Bearer <job token>`.

    Args:
        token: the job token.
        observers: told about every refused call (`missing_token` or `bad_token`).
    """

    def __init__(self, token: str, observers: Sequence[RefusalObserver] = ()) -> None:
        self._expected = validate_token(token).encode("ascii")
        self._observers = tuple(observers)

    def _refusal(self, metadata: Any) -> tuple[str, str] | None:
        """None when the call carries the job token, else (reason, what the caller is told)."""
        for key, value in metadata or ():
            if key != AUTH_METADATA_KEY:
                continue
            if (
                isinstance(value, str)
                and value.startswith(_BEARER)
                and _tokens_equal(value[len(_BEARER) :], self._expected)
            ):
                return None
            return BAD_TOKEN, "wrong job token"
        return MISSING_TOKEN, f"missing job token ({AUTH_METADATA_KEY}: Bearer <token> metadata)"

    def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], grpc.RpcMethodHandler[Any, Any] | None],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        handler = continuation(handler_call_details)
        if handler is None:
            return handler
        refusal = self._refusal(handler_call_details.invocation_metadata)
        if refusal is None:
            return handler
        reason, message = refusal
        return _deny(handler, handler_call_details.method, reason, message, self._observers)


class TokenClientInterceptor(_UnaryUnary, _UnaryStream, _StreamUnary, _StreamStream):
    """Adds `authorization: Bearer <token>` to every outgoing call.

    Args:
        token: the job token.
    """

    def __init__(self, token: str) -> None:
        self._entry = (AUTH_METADATA_KEY, _BEARER + validate_token(token))

    def _with_token(self, details: grpc.ClientCallDetails) -> grpc.ClientCallDetails:
        metadata = [m for m in (details.metadata or ()) if m[0] != AUTH_METADATA_KEY]
        metadata.append(self._entry)
        return _CallDetails(
            method=details.method,
            timeout=details.timeout,
            metadata=tuple(metadata),
            credentials=details.credentials,
            wait_for_ready=getattr(details, "wait_for_ready", None),
            compression=getattr(details, "compression", None),
        )

    def intercept_unary_unary(self, continuation: Any, client_call_details: Any, request: Any) -> Any:
        return continuation(self._with_token(client_call_details), request)

    def intercept_unary_stream(self, continuation: Any, client_call_details: Any, request: Any) -> Any:
        return continuation(self._with_token(client_call_details), request)

    def intercept_stream_unary(self, continuation: Any, client_call_details: Any, request_iterator: Any) -> Any:
        return continuation(self._with_token(client_call_details), request_iterator)

    def intercept_stream_stream(self, continuation: Any, client_call_details: Any, request_iterator: Any) -> Any:
        return continuation(self._with_token(client_call_details), request_iterator)


class _CallDetails(grpc.ClientCallDetails):
    def __init__(
        self,
        *,
        method: str,
        timeout: float | None,
        metadata: tuple[tuple[str, str | bytes], ...],
        credentials: grpc.CallCredentials | None,
        wait_for_ready: bool | None,
        compression: grpc.Compression | None,
    ) -> None:
        self.method = method
        self.timeout = timeout
        self.metadata = metadata
        self.credentials = credentials
        self.wait_for_ready = wait_for_ready
        self.compression = compression
