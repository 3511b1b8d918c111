"""Optional TLS for servers and channels."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import attrs

from dlrover.common.errors import ConfigError

if TYPE_CHECKING:
    import grpc

__all__ = ["TLSConfig"]


def _read(path: str | None, what: str) -> bytes | None:
    if path is None:
        return None
    try:
        return Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read TLS {what} {path!r}: {exc.strerror or exc}") from exc


@attrs.frozen
class TLSConfig:
    """PEM files for TLS.

    On a server, `cert_file` and `key_file` are its identity and `ca_file`, when given, makes it
    require and verify client certificates (mutual TLS). On a client, `ca_file` verifies the
    server (the system roots when None), `cert_file`/`key_file` are its own identity for mutual
    TLS, and `server_name_override` names the host the server's certificate must be valid for.
    """

    cert_file: str | None = None
    key_file: str | None = None
    ca_file: str | None = None
    server_name_override: str | None = None

    def __attrs_post_init__(self) -> None:
        if (self.cert_file is None) != (self.key_file is None):
            raise ConfigError("TLS cert_file and key_file must be given together")

    def server_credentials(self) -> grpc.ServerCredentials:
        """Credentials for `grpc.Server.add_secure_port`.

        Raises:
            ConfigError: no certificate and key were given, or a file cannot be read.
        """
        cert = _read(self.cert_file, "certificate")
        key = _read(self.key_file, "private key")
        if cert is None or key is None:
            raise ConfigError("a TLS server needs cert_file and key_file")
        ca = _read(self.ca_file, "CA bundle")
        import grpc  # here: a process that only reads TLS settings (dlrover-run's flags) skips gRPC's import

        return grpc.ssl_server_credentials([(key, cert)], root_certificates=ca, require_client_auth=ca is not None)

    def channel_credentials(self) -> grpc.ChannelCredentials:
        """Credentials for `grpc.secure_channel`."""
        import grpc

        return grpc.ssl_channel_credentials(
            root_certificates=_read(self.ca_file, "CA bundle"),
            private_key=_read(self.key_file, "private key"),
            certificate_chain=_read(self.cert_file, "certificate"),
        )
