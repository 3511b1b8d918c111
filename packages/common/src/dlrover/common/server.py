"""The one way DLRover builds a gRPC server: token-authenticated, size-bounded, optionally TLS."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from concurrent import futures
from typing import Any, TypeVar

import attrs
import grpc

from dlrover.common import validators
from dlrover.common.auth import TokenAuthServerInterceptor
from dlrover.common.clock import Clock, SystemClock
from dlrover.common.errors import ConfigError, DLRoverError
from dlrover.common.guard import RequestGuardInterceptor, backstop_bytes
from dlrover.common.refusals import RefusalLog, RefusalObserver
from dlrover.common.tls import TLSConfig

__all__ = ["DEFAULT_MAX_MESSAGE_BYTES", "GrpcServer", "ServerConfig", "format_host_port", "parse_host_port"]

_log = logging.getLogger(__name__)
_refusal_log = logging.getLogger("dlrover.common.refusals")

DEFAULT_MAX_MESSAGE_BYTES = 16 * 1024 * 1024
_S = TypeVar("_S")


def format_host_port(host: str, port: int) -> str:
    """`host:port`, with IPv6 literals bracketed (`[::1]:8000`)."""
    if ":" in host and not host.startswith("["):
        return f"[{host}]:{port}"
    return f"{host}:{port}"


def parse_host_port(address: str, default_port: int | None = None) -> tuple[str, int]:
    """Split `host:port` (`[v6]:port` for IPv6 literals) as `format_host_port` writes it.

    Args:
        address: the address.
        default_port: the port of an address that names none (None: one must be named).

    Raises:
        ValueError: no host, or a port that is missing, not a number, or out of range.
    """
    text = address.strip()
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        port_text = rest[1:] if rest.startswith(":") else rest
    elif text.count(":") == 1:
        host, _, port_text = text.partition(":")
    else:
        host, port_text = text, ""
    if not host:
        raise ValueError(f"{address!r} names no host")
    if not port_text:
        if default_port is None:
            raise ValueError(f"{address!r} names no port")
        return host, default_port
    try:
        port = int(port_text)
    except ValueError:
        raise ValueError(f"{address!r}: the port must be a number") from None
    if not 0 < port < 65536:
        raise ValueError(f"{address!r}: the port must be from 1 to 65535")
    return host, port


@attrs.frozen
class ServerConfig:
    """How a gRPC server listens.

    Attributes:
        bind_address: interface to listen on; loopback unless told otherwise.
        port: TCP port, 0 for any free port (read it back from `GrpcServer.port`).
        max_workers: threads serving calls.
        max_message_bytes: the largest request or response accepted, in bytes.
        tls: serve TLS with these files; plaintext when None.
        stop_grace_s: how long `stop()` lets in-flight calls finish.
        refusal_log_interval_s: refused calls are logged at most once per reason per this many
            seconds, with a count of those not logged (0 logs every one).
    """

    bind_address: str = "127.0.0.1"
    port: int = attrs.field(default=0, validator=validators.port)
    max_workers: int = attrs.field(default=16, validator=validators.positive)
    max_message_bytes: int = attrs.field(default=DEFAULT_MAX_MESSAGE_BYTES, validator=validators.positive)
    tls: TLSConfig | None = None
    stop_grace_s: float = attrs.field(default=2.0, validator=attrs.validators.ge(0.0))
    refusal_log_interval_s: float = attrs.field(default=30.0, validator=validators.non_negative_finite)


class GrpcServer:
    """A gRPC server that refuses every call without the job token, and says so.

    Every unary request is received, bounded and parsed by `RequestGuardInterceptor`: a request
    over `max_message_bytes` gets RESOURCE_EXHAUSTED, one that does not parse INVALID_ARGUMENT.
    Every refused call (see `dlrover.common.refusals`) is logged at WARNING on the
    `dlrover.common.refusals` logger, at most once per reason per `refusal_log_interval_s`, and
    reported to `refusal_observers`.

    Register servicers with `add`, then `start()`; use as a context manager to stop it on exit.

    Args:
        config: where and how to listen.
        token: the job token every call must carry.
        interceptors: extra server interceptors, run after authentication and the request guard.
        refusal_observers: also told about every refused call (a metric, say).
        clock: the time source of the refusal log's rate limit (the system clock by default).
    """

    def __init__(
        self,
        config: ServerConfig,
        token: str,
        interceptors: Sequence[grpc.ServerInterceptor[Any, Any]] = (),
        *,
        refusal_observers: Sequence[RefusalObserver] = (),
        clock: Clock | None = None,
    ) -> None:
        self._config = config
        self._refusal_log = RefusalLog(_refusal_log, clock or SystemClock(), config.refusal_log_interval_s)
        observers = (self._refusal_log, *refusal_observers)
        self._executor = futures.ThreadPoolExecutor(max_workers=config.max_workers, thread_name_prefix="dlrover-grpc")
        self._server = grpc.server(
            self._executor,
            interceptors=[
                TokenAuthServerInterceptor(token, observers),
                RequestGuardInterceptor(config.max_message_bytes, observers),
                *interceptors,
            ],
            options=[
                # A backstop: the guard refuses above max_message_bytes itself, where it can say so.
                ("grpc.max_receive_message_length", backstop_bytes(config.max_message_bytes)),
                ("grpc.max_send_message_length", config.max_message_bytes),
                ("grpc.so_reuseport", 0),
            ],
        )
        self._port: int | None = None
        self._stopped = False

    def add(self, register: Callable[[_S, grpc.Server], None], servicer: _S) -> None:
        """Register `servicer` with a generated `add_XServicer_to_server` function."""
        if self._port is not None:
            raise DLRoverError("servicers must be added before the server starts")
        register(servicer, self._server)

    def start(self) -> int:
        """Bind and start serving; returns the bound port.

        Raises:
            ConfigError: the address cannot be bound (in use, or not an address of this host).
        """
        if self._port is not None:
            return self._port
        address = format_host_port(self._config.bind_address, self._config.port)
        try:
            if self._config.tls is None:
                port = self._server.add_insecure_port(address)
            else:
                port = self._server.add_secure_port(address, self._config.tls.server_credentials())
        except RuntimeError as exc:
            raise ConfigError(f"cannot listen on {address}: {exc}") from exc
        if port == 0:
            raise ConfigError(f"cannot listen on {address}")
        self._server.start()
        self._port = port
        _log.debug("gRPC server listening on %s", format_host_port(self._config.bind_address, port))
        return port

    @property
    def port(self) -> int:
        """The bound port. Raises DLRoverError before `start()`."""
        if self._port is None:
            raise DLRoverError("the server has not started")
        return self._port

    @property
    def address(self) -> str:
        """`host:port` that clients on this host can dial."""
        return format_host_port(self._config.bind_address, self.port)

    def stop(self, grace_s: float | None = None) -> None:
        """Stop serving and release the port and threads; safe to call twice."""
        if self._stopped:
            return
        self._stopped = True
        grace = self._config.stop_grace_s if grace_s is None else grace_s
        self._server.stop(grace).wait()
        self._executor.shutdown(wait=True)
        self._refusal_log.flush()

    def wait(self, timeout_s: float | None = None) -> bool:
        """Block until the server stops or `timeout_s` passes; True if it stopped."""
        return bool(self._server.wait_for_termination(timeout_s))

    def __enter__(self) -> GrpcServer:
        self.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop()
