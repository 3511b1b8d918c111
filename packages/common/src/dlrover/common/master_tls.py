"""How every client of a job's master learns to dial it with TLS: four environment variables.

A master that serves TLS can only be dialed by clients that verify its certificate, and, when it
requires client certificates (mutual TLS), that present one. Those clients live in several
processes: the per-node agent (`dlrover-run`), the training processes it starts (shard client,
the rendezvous handler of stock torchrun) and the `dlrover-master` client commands. They all
read the same variables, through `master_channel_config`, whenever they are not handed an
explicit `ChannelConfig`:

- ``DLROVER_MASTER_TLS_CA``: a PEM file of the certificates that verify the master's. Setting it
  turns TLS on; unset or empty means plaintext.
- ``DLROVER_MASTER_TLS_SERVER_NAME``: the name the master's certificate is valid for, when it is
  not the host of the address dialed (a certificate for ``localhost`` dialed at 127.0.0.1).
- ``DLROVER_MASTER_TLS_CERT`` and ``DLROVER_MASTER_TLS_KEY``: this client's certificate and key
  for a master that requires client certificates; both or neither.

An empty value counts as unset, so a launcher can turn TLS off for its children explicitly
(`master_tls_env(None)`) whatever they would otherwise inherit. Bad values (a file that cannot be
read or holds no PEM block, a certificate without its key, a setting without the CA that turns TLS
on) are refused with a `ConfigError` that names the variable.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from dlrover.common.errors import ConfigError
from dlrover.common.tls import TLSConfig

if TYPE_CHECKING:
    from dlrover.common.channel import ChannelConfig

__all__ = [
    "MASTER_TLS_CA_ENV_VAR",
    "MASTER_TLS_CERT_ENV_VAR",
    "MASTER_TLS_ENV_VARS",
    "MASTER_TLS_KEY_ENV_VAR",
    "MASTER_TLS_SERVER_NAME_ENV_VAR",
    "master_channel_config",
    "master_tls_env",
    "master_tls_from_env",
    "master_tls_from_settings",
]

MASTER_TLS_CA_ENV_VAR = "DLROVER_MASTER_TLS_CA"
MASTER_TLS_SERVER_NAME_ENV_VAR = "DLROVER_MASTER_TLS_SERVER_NAME"
MASTER_TLS_CERT_ENV_VAR = "DLROVER_MASTER_TLS_CERT"
MASTER_TLS_KEY_ENV_VAR = "DLROVER_MASTER_TLS_KEY"
MASTER_TLS_ENV_VARS = (
    MASTER_TLS_CA_ENV_VAR,
    MASTER_TLS_SERVER_NAME_ENV_VAR,
    MASTER_TLS_CERT_ENV_VAR,
    MASTER_TLS_KEY_ENV_VAR,
)
"""Every variable of the contract, in the order of the module's docstring."""

# What each file must hold: gRPC reports a wrong file only when the handshake fails, as a
# connection error that names no file, so the content is checked where the name is known.
_PEM_MARKERS = {
    MASTER_TLS_CA_ENV_VAR: ("-----BEGIN CERTIFICATE-----", "PEM certificate"),
    MASTER_TLS_CERT_ENV_VAR: ("-----BEGIN CERTIFICATE-----", "PEM certificate"),
    MASTER_TLS_KEY_ENV_VAR: ("PRIVATE KEY-----", "PEM private key"),
}


def _pem_file(name: str, path: str, origin: str) -> str:
    try:
        text = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"{origin}={path!r}: cannot read it: {exc.strerror or exc}") from None
    marker, what = _PEM_MARKERS[name]
    if marker.encode() not in text:
        raise ConfigError(f"{origin}={path!r}: the file holds no {what}")
    # Absolute, for processes that may start in another directory, but not resolved: a mounted Secret's
    # file is a symlink into a versioned directory that a rotation replaces.
    return os.path.abspath(path)


def master_tls_from_settings(
    settings: Mapping[str, str | None], origins: Mapping[str, str] | None = None
) -> TLSConfig | None:
    """The TLS a client of the master dials with, from values keyed by the variables' names.

    Args:
        settings: values by variable name (`MASTER_TLS_ENV_VARS`); a missing, None or empty value
            is unset. Other keys are ignored, so an environment can be passed as it is.
        origins: what to call each setting in an error (a command-line flag that gave it);
            by default the variable's name.

    Returns:
        None when ``DLROVER_MASTER_TLS_CA`` is unset (plaintext), else the checked `TLSConfig`
        with absolute file paths.

    Raises:
        ConfigError: a file cannot be read or holds no PEM block of its kind, a certificate is
            given without its key or a key without its certificate, or a setting is given
            without the CA; the message names the setting.
    """

    def label(name: str) -> str:
        return (origins or {}).get(name, name)

    values = {name: (settings.get(name) or "").strip() for name in MASTER_TLS_ENV_VARS}
    ca, server_name = values[MASTER_TLS_CA_ENV_VAR], values[MASTER_TLS_SERVER_NAME_ENV_VAR]
    cert, key = values[MASTER_TLS_CERT_ENV_VAR], values[MASTER_TLS_KEY_ENV_VAR]
    if not ca:
        stray = [label(name) for name in MASTER_TLS_ENV_VARS if values[name]]
        if stray:
            raise ConfigError(
                f"{', '.join(stray)} given without {label(MASTER_TLS_CA_ENV_VAR)}, the CA bundle that verifies the "
                "master and turns TLS on"
            )
        return None
    if bool(cert) != bool(key):
        pair = (MASTER_TLS_CERT_ENV_VAR, MASTER_TLS_KEY_ENV_VAR)
        given, missing = pair if cert else pair[::-1]
        raise ConfigError(
            f"{label(given)} is given but {label(missing)} is not: a client certificate needs its private key "
            "and the other way round"
        )
    return TLSConfig(
        ca_file=_pem_file(MASTER_TLS_CA_ENV_VAR, ca, label(MASTER_TLS_CA_ENV_VAR)),
        cert_file=_pem_file(MASTER_TLS_CERT_ENV_VAR, cert, label(MASTER_TLS_CERT_ENV_VAR)) if cert else None,
        key_file=_pem_file(MASTER_TLS_KEY_ENV_VAR, key, label(MASTER_TLS_KEY_ENV_VAR)) if key else None,
        server_name_override=server_name or None,
    )


def master_tls_from_env(environ: Mapping[str, str] | None = None) -> TLSConfig | None:
    """`master_tls_from_settings` of the environment (default `os.environ`).

    Raises:
        ConfigError: a variable's value is unusable; the message names the variable.
    """
    return master_tls_from_settings(os.environ if environ is None else environ)


def master_channel_config(environ: Mapping[str, str] | None = None) -> ChannelConfig:
    """How a client dials the job's master when it was given no `ChannelConfig`: TLS as the
    environment says (see the module's docstring), plaintext when it says nothing.

    Raises:
        ConfigError: a variable's value is unusable; the message names the variable.
    """
    from dlrover.common.channel import ChannelConfig  # gRPC's import, only for a process that dials

    return ChannelConfig(tls=master_tls_from_env(environ))


def master_tls_env(tls: TLSConfig | None) -> dict[str, str]:
    """The variables that make a child process's clients dial the master with `tls`.

    Every variable of the contract is set: those `tls` does not use are empty, so a child never
    mixes these settings with ones it would inherit, and None sets all of them empty (plaintext).
    File paths are made absolute.

    Raises:
        ConfigError: `tls` has a certificate, key or server name but no CA (the variables could
            not express it: the CA is what turns TLS on).
    """
    if tls is None:
        return dict.fromkeys(MASTER_TLS_ENV_VARS, "")
    if not tls.ca_file:
        raise ConfigError(
            f"a master's clients are told to dial TLS by {MASTER_TLS_CA_ENV_VAR}, a CA bundle file: this TLS "
            "setting names none"
        )

    def absolute(path: str | None) -> str:
        return os.path.abspath(path) if path else ""

    return {
        MASTER_TLS_CA_ENV_VAR: absolute(tls.ca_file),
        MASTER_TLS_SERVER_NAME_ENV_VAR: tls.server_name_override or "",
        MASTER_TLS_CERT_ENV_VAR: absolute(tls.cert_file),
        MASTER_TLS_KEY_ENV_VAR: absolute(tls.key_file),
    }
