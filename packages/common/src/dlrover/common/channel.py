"""The one way DLRover dials a gRPC server: token attached, size-bounded, optionally TLS."""

from __future__ import annotations

import attrs
import grpc

from dlrover.common.auth import TokenClientInterceptor
from dlrover.common.errors import ConfigError
from dlrover.common.server import DEFAULT_MAX_MESSAGE_BYTES
from dlrover.common.tls import TLSConfig
from dlrover.common.validators import positive

__all__ = ["ChannelConfig", "create_channel"]


@attrs.frozen
class ChannelConfig:
    """How a client dials.

    Attributes:
        max_message_bytes: the largest request or response accepted, in bytes.
        tls: dial with TLS; plaintext when None.
        keepalive_s: interval of HTTP/2 keepalive pings, so a dead peer is noticed on idle
            connections; 0 turns them off.
        max_reconnect_backoff_s: the longest wait between two attempts to reconnect a lost
            connection. gRPC's own default grows to 120 s, so a client that saw its server down
            for a while would stay away that long after a restarted server is back.
    """

    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES
    tls: TLSConfig | None = None
    keepalive_s: float = attrs.field(default=30.0, validator=attrs.validators.ge(0.0))
    max_reconnect_backoff_s: float = attrs.field(default=2.0, validator=positive)

    def __attrs_post_init__(self) -> None:
        if self.max_message_bytes <= 0:
            raise ConfigError(f"max_message_bytes must be positive, got {self.max_message_bytes!r}")


def create_channel(target: str, token: str, config: ChannelConfig | None = None) -> grpc.Channel:
    """A channel to `target` (`host:port`) that sends `token` on every call.

    Close it with `channel.close()` (or use it as a context manager).

    Raises:
        ConfigError: `target` is empty.
        AuthError: `token` is unusable.
    """
    if not target:
        raise ConfigError("a channel target must be host:port, got an empty string")
    cfg = config or ChannelConfig()
    options: list[tuple[str, int | str]] = [
        ("grpc.max_receive_message_length", cfg.max_message_bytes),
        ("grpc.max_send_message_length", cfg.max_message_bytes),
        ("grpc.enable_retries", 0),
        ("grpc.max_reconnect_backoff_ms", max(int(cfg.max_reconnect_backoff_s * 1000), 100)),
        ("grpc.initial_reconnect_backoff_ms", max(min(1000, int(cfg.max_reconnect_backoff_s * 1000)), 100)),
    ]
    if cfg.keepalive_s > 0:
        options.append(("grpc.keepalive_time_ms", int(cfg.keepalive_s * 1000)))
    if cfg.tls is None:
        channel = grpc.insecure_channel(target, options=options)
    else:
        if cfg.tls.server_name_override:
            options.append(("grpc.ssl_target_name_override", cfg.tls.server_name_override))
        channel = grpc.secure_channel(target, cfg.tls.channel_credentials(), options=options)
    return grpc.intercept_channel(channel, TokenClientInterceptor(token))
