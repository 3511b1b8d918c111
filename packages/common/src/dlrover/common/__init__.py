"""dlrover.common: what every DLRover service and client shares.

gRPC servers and channels with per-job token authentication and optional TLS, a deadline and
retry policy for client calls, an injectable clock, logging set-up and the base error class.
"""

from dlrover.common.auth import (
    AUTH_METADATA_KEY,
    TOKEN_ENV_VAR,
    TOKEN_FILE_ENV_VAR,
    TokenAuthServerInterceptor,
    TokenClientInterceptor,
    generate_token,
    load_token,
    validate_token,
    write_token_file,
)
from dlrover.common.channel import ChannelConfig, create_channel
from dlrover.common.clock import Clock, ManualClock, SystemClock
from dlrover.common.errors import AuthError, ConfigError, DLRoverError
from dlrover.common.log import JsonLinesFormatter, configure_logging
from dlrover.common.ping import PingServicer, add_ping_service
from dlrover.common.retry import RETRYABLE_CODES, RetryPolicy, RpcError, call_unary
from dlrover.common.server import DEFAULT_MAX_MESSAGE_BYTES, GrpcServer, ServerConfig, format_host_port
from dlrover.common.tls import TLSConfig
from dlrover.common.validators import (
    non_negative,
    non_negative_finite,
    non_negative_int,
    port,
    positive,
    positive_finite,
    positive_int,
)

__all__ = [
    "AUTH_METADATA_KEY",
    "DEFAULT_MAX_MESSAGE_BYTES",
    "RETRYABLE_CODES",
    "TOKEN_ENV_VAR",
    "TOKEN_FILE_ENV_VAR",
    "AuthError",
    "ChannelConfig",
    "Clock",
    "ConfigError",
    "DLRoverError",
    "GrpcServer",
    "JsonLinesFormatter",
    "ManualClock",
    "PingServicer",
    "RetryPolicy",
    "RpcError",
    "ServerConfig",
    "SystemClock",
    "TLSConfig",
    "TokenAuthServerInterceptor",
    "TokenClientInterceptor",
    "add_ping_service",
    "call_unary",
    "configure_logging",
    "create_channel",
    "format_host_port",
    "generate_token",
    "load_token",
    "non_negative",
    "non_negative_finite",
    "non_negative_int",
    "port",
    "positive",
    "positive_finite",
    "positive_int",
    "validate_token",
    "write_token_file",
]
