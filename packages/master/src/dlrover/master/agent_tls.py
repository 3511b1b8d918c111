"""How the agents a master starts on its own host dial it when it serves TLS.

The local backend runs every agent on the master's host, so the master's file paths are theirs,
and it hands them the ``DLROVER_MASTER_TLS_*`` variables (`dlrover.common.master_tls`) in their
environment; `dlrover-run` passes them on to its workers. What the agents are told:

- CA bundle: `MasterConfig.agent_tls.ca_file` (``--agent-tls-ca``) when given; else the master's
  ``--tls-ca`` when it serves mutual TLS (one CA usually signs both sides); else the master's own
  certificate (``--tls-cert``), which verifies itself when it is self-signed. A certificate
  signed by a CA needs ``--agent-tls-ca``.
- Server name: ``--agent-tls-server-name`` when given; else none, so the certificate must be
  valid for the address the agents dial (``--bind-address``, e.g. an IP address entry for
  127.0.0.1).
- Client certificate: for a master that requires one (``--tls-ca``), ``--agent-tls-cert`` and
  ``--agent-tls-key``; without them the master refuses to start, rather than launch agents that
  could never register. The master's own key is never handed out.

A master that serves plaintext tells its agents so explicitly (every variable empty), so an agent
never dials with TLS settings it inherited from the master's own environment.
"""

from __future__ import annotations

from dlrover.common import ConfigError, TLSConfig, master_tls_env

__all__ = ["agent_tls", "agent_tls_env"]


def agent_tls(served: TLSConfig | None, given: TLSConfig | None) -> TLSConfig | None:
    """The TLS the agents a master starts dial it with (the rule is in the module's docstring).

    Args:
        served: the TLS the master serves (`MasterConfig.tls`); None: plaintext.
        given: what the master was told to hand its agents (`MasterConfig.agent_tls`); a field
            left None takes the rule's default.

    Returns:
        None when the master serves plaintext.

    Raises:
        ConfigError: agent TLS is given for a plaintext master, or a master that requires client
            certificates has none to give its agents.
    """
    if served is None:
        if given is not None:
            raise ConfigError(
                "--agent-tls-* tell the agents how to dial a master that serves TLS, but this master serves "
                "plaintext (give --tls-cert and --tls-key, or drop them)"
            )
        return None
    mutual = served.ca_file is not None
    ca_file = (given.ca_file if given is not None else None) or (served.ca_file if mutual else served.cert_file)
    cert_file = given.cert_file if given is not None else None
    key_file = given.key_file if given is not None else None
    if mutual and cert_file is None:
        raise ConfigError(
            "this master requires client certificates (--tls-ca) and starts its agents itself: give them one "
            "with --agent-tls-cert and --agent-tls-key (signed by the --tls-ca CA)"
        )
    return TLSConfig(
        ca_file=ca_file,
        cert_file=cert_file,
        key_file=key_file,
        server_name_override=given.server_name_override if given is not None else None,
    )


def agent_tls_env(served: TLSConfig | None, given: TLSConfig | None) -> dict[str, str]:
    """The ``DLROVER_MASTER_TLS_*`` variables of the agents a master starts on its own host:
    `master_tls_env` of `agent_tls` (every variable empty for a plaintext master).

    Raises:
        ConfigError: as `agent_tls`.
    """
    return master_tls_env(agent_tls(served, given))
