"""dlrover.common: what every DLRover service and client shares.

gRPC servers and channels with per-job token authentication and optional TLS, a deadline and
retry policy for client calls, an injectable clock, logging set-up and the base error class;
process identities read from /proc and private temp dirs that are removed even after a SIGKILL.

Names are imported lazily (see `dlrover.common.lazy`): ``from dlrover.common import Clock`` loads
the clock alone, not gRPC and protobuf, so a training process that uses only the clock and the
validators starts quickly.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dlrover.common.lazy import lazy_exports

if TYPE_CHECKING:
    from dlrover.common.auth import (
        AUTH_METADATA_KEY,
        TOKEN_ENV_VAR,
        TOKEN_FILE_ENV_VAR,
        TokenAuthServerInterceptor,
        TokenClientInterceptor,
        find_token,
        generate_token,
        load_token,
        validate_token,
        write_token_file,
    )
    from dlrover.common.cgroup_membership import (
        PROC_SELF_CGROUP,
        CgroupMembership,
        own_memberships,
        parse_memberships,
    )
    from dlrover.common.channel import ChannelConfig, create_channel
    from dlrover.common.cli_help import DefaultsHelpFormatter, default_text
    from dlrover.common.clock import Clock, ManualClock, SystemClock
    from dlrover.common.errors import AuthError, ConfigError, DLRoverError
    from dlrover.common.guard import SERVICER_REFUSALS, RequestGuardInterceptor, backstop_bytes
    from dlrover.common.lazy import lazy_export_problems, modules_loaded_by
    from dlrover.common.log import JsonLinesFormatter, configure_logging
    from dlrover.common.master_tls import (
        MASTER_TLS_CA_ENV_VAR,
        MASTER_TLS_CERT_ENV_VAR,
        MASTER_TLS_ENV_VARS,
        MASTER_TLS_KEY_ENV_VAR,
        MASTER_TLS_SERVER_NAME_ENV_VAR,
        master_channel_config,
        master_tls_env,
        master_tls_from_env,
        master_tls_from_settings,
    )
    from dlrover.common.ping import PingServicer, add_ping_service
    from dlrover.common.process import (
        ProcessIdentity,
        exiting_status,
        pid_namespace,
        pid_scope,
        proc_stat_fields,
        process_start_ticks,
        processes_mentioning,
    )
    from dlrover.common.refusals import (
        REFUSAL_REASONS,
        LogRateLimiter,
        Refusal,
        RefusalLog,
        RefusalObserver,
        report_refusal,
    )
    from dlrover.common.retry import (
        MASTER_LOST_TIMEOUT_ENV_VAR,
        RETRYABLE_CODES,
        RetryPolicy,
        RpcError,
        call_unary,
        master_retry_policy,
    )
    from dlrover.common.server import (
        DEFAULT_MAX_MESSAGE_BYTES,
        GrpcServer,
        ServerConfig,
        format_host_port,
        parse_host_port,
    )
    from dlrover.common.tempdirs import owned_temp_dir, remove_dead_owners
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

_EXPORTS: dict[str, str] = {
    "AUTH_METADATA_KEY": "dlrover.common.auth",
    "TOKEN_ENV_VAR": "dlrover.common.auth",
    "TOKEN_FILE_ENV_VAR": "dlrover.common.auth",
    "TokenAuthServerInterceptor": "dlrover.common.auth",
    "TokenClientInterceptor": "dlrover.common.auth",
    "generate_token": "dlrover.common.auth",
    "find_token": "dlrover.common.auth",
    "load_token": "dlrover.common.auth",
    "validate_token": "dlrover.common.auth",
    "write_token_file": "dlrover.common.auth",
    "SERVICER_REFUSALS": "dlrover.common.guard",
    "RequestGuardInterceptor": "dlrover.common.guard",
    "backstop_bytes": "dlrover.common.guard",
    "REFUSAL_REASONS": "dlrover.common.refusals",
    "LogRateLimiter": "dlrover.common.refusals",
    "Refusal": "dlrover.common.refusals",
    "RefusalLog": "dlrover.common.refusals",
    "RefusalObserver": "dlrover.common.refusals",
    "report_refusal": "dlrover.common.refusals",
    "ChannelConfig": "dlrover.common.channel",
    "create_channel": "dlrover.common.channel",
    "DefaultsHelpFormatter": "dlrover.common.cli_help",
    "default_text": "dlrover.common.cli_help",
    "Clock": "dlrover.common.clock",
    "ManualClock": "dlrover.common.clock",
    "SystemClock": "dlrover.common.clock",
    "PROC_SELF_CGROUP": "dlrover.common.cgroup_membership",
    "CgroupMembership": "dlrover.common.cgroup_membership",
    "own_memberships": "dlrover.common.cgroup_membership",
    "parse_memberships": "dlrover.common.cgroup_membership",
    "AuthError": "dlrover.common.errors",
    "ConfigError": "dlrover.common.errors",
    "DLRoverError": "dlrover.common.errors",
    "lazy_export_problems": "dlrover.common.lazy",
    "lazy_exports": "dlrover.common.lazy",
    "modules_loaded_by": "dlrover.common.lazy",
    "JsonLinesFormatter": "dlrover.common.log",
    "configure_logging": "dlrover.common.log",
    "MASTER_TLS_CA_ENV_VAR": "dlrover.common.master_tls",
    "MASTER_TLS_CERT_ENV_VAR": "dlrover.common.master_tls",
    "MASTER_TLS_ENV_VARS": "dlrover.common.master_tls",
    "MASTER_TLS_KEY_ENV_VAR": "dlrover.common.master_tls",
    "MASTER_TLS_SERVER_NAME_ENV_VAR": "dlrover.common.master_tls",
    "master_channel_config": "dlrover.common.master_tls",
    "master_tls_env": "dlrover.common.master_tls",
    "master_tls_from_env": "dlrover.common.master_tls",
    "master_tls_from_settings": "dlrover.common.master_tls",
    "PingServicer": "dlrover.common.ping",
    "add_ping_service": "dlrover.common.ping",
    "ProcessIdentity": "dlrover.common.process",
    "exiting_status": "dlrover.common.process",
    "pid_namespace": "dlrover.common.process",
    "pid_scope": "dlrover.common.process",
    "proc_stat_fields": "dlrover.common.process",
    "process_start_ticks": "dlrover.common.process",
    "processes_mentioning": "dlrover.common.process",
    "MASTER_LOST_TIMEOUT_ENV_VAR": "dlrover.common.retry",
    "master_retry_policy": "dlrover.common.retry",
    "RETRYABLE_CODES": "dlrover.common.retry",
    "RetryPolicy": "dlrover.common.retry",
    "RpcError": "dlrover.common.retry",
    "call_unary": "dlrover.common.retry",
    "DEFAULT_MAX_MESSAGE_BYTES": "dlrover.common.server",
    "GrpcServer": "dlrover.common.server",
    "ServerConfig": "dlrover.common.server",
    "format_host_port": "dlrover.common.server",
    "parse_host_port": "dlrover.common.server",
    "owned_temp_dir": "dlrover.common.tempdirs",
    "remove_dead_owners": "dlrover.common.tempdirs",
    "TLSConfig": "dlrover.common.tls",
    "non_negative": "dlrover.common.validators",
    "non_negative_finite": "dlrover.common.validators",
    "non_negative_int": "dlrover.common.validators",
    "port": "dlrover.common.validators",
    "positive": "dlrover.common.validators",
    "positive_finite": "dlrover.common.validators",
    "positive_int": "dlrover.common.validators",
}

__all__ = [
    "AUTH_METADATA_KEY",
    "DEFAULT_MAX_MESSAGE_BYTES",
    "MASTER_LOST_TIMEOUT_ENV_VAR",
    "RETRYABLE_CODES",
    "TOKEN_ENV_VAR",
    "TOKEN_FILE_ENV_VAR",
    "AuthError",
    "ChannelConfig",
    "Clock",
    "ConfigError",
    "DLRoverError",
    "DefaultsHelpFormatter",
    "GrpcServer",
    "JsonLinesFormatter",
    "ManualClock",
    "PingServicer",
    "ProcessIdentity",
    "RetryPolicy",
    "RpcError",
    "ServerConfig",
    "SystemClock",
    "TLSConfig",
    "TokenAuthServerInterceptor",
    "TokenClientInterceptor",
    "add_ping_service",
    "call_unary",
    "master_retry_policy",
    "configure_logging",
    "create_channel",
    "default_text",
    "exiting_status",
    "format_host_port",
    "parse_host_port",
    "generate_token",
    "lazy_export_problems",
    "lazy_exports",
    "modules_loaded_by",
    "find_token",
    "load_token",
    "non_negative",
    "non_negative_finite",
    "non_negative_int",
    "owned_temp_dir",
    "pid_namespace",
    "pid_scope",
    "port",
    "positive",
    "positive_finite",
    "positive_int",
    "proc_stat_fields",
    "process_start_ticks",
    "processes_mentioning",
    "remove_dead_owners",
    "validate_token",
    "write_token_file",
    "SERVICER_REFUSALS",
    "RequestGuardInterceptor",
    "backstop_bytes",
    "REFUSAL_REASONS",
    "LogRateLimiter",
    "Refusal",
    "RefusalLog",
    "RefusalObserver",
    "report_refusal",
    "MASTER_TLS_CA_ENV_VAR",
    "MASTER_TLS_CERT_ENV_VAR",
    "MASTER_TLS_ENV_VARS",
    "MASTER_TLS_KEY_ENV_VAR",
    "MASTER_TLS_SERVER_NAME_ENV_VAR",
    "master_channel_config",
    "master_tls_env",
    "master_tls_from_env",
    "master_tls_from_settings",
    "PROC_SELF_CGROUP",
    "CgroupMembership",
    "own_memberships",
    "parse_memberships",
]

if not TYPE_CHECKING:  # so mypy checks every imported name against the imports above
    __getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
