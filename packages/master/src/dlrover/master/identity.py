"""Per-node identity: one node cannot speak for another.

The job token lets a caller into the job; it does not say which node the caller is. On
registration the master hands each node a credential, `HMAC-SHA256(node secret, job name + node
id)`, hex-encoded. Every later agent call carries the node id and that credential in metadata;
the master recomputes the HMAC and compares in constant time, then checks that the request's
`node_id` is the authenticated one.

The node secret is the master's alone (never the job token, which every agent and training
process holds, so any of them could otherwise compute any node's credential). It lives in a 0600
file in the state directory, so a restarted master recognises every node's credential without
journaling credentials; a node's credential is worthless for any other node id or job.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable

from dlrover.common import AuthError, ConfigError, validate_token

__all__ = [
    "NODE_CREDENTIAL_METADATA_KEY",
    "NODE_ID_METADATA_KEY",
    "NodeAuthenticator",
    "NodeIdentityError",
    "NodeImpersonationError",
    "REGISTRATION_KEY_CHARS",
    "check_registration_key",
    "node_metadata",
    "registration_digest",
]

NODE_ID_METADATA_KEY = "x-dlrover-node-id"
NODE_CREDENTIAL_METADATA_KEY = "x-dlrover-node-credential"
_DOMAIN = b"dlrover-node-credential/v1\x00"
_MAX_ID_CHARS = 20

REGISTRATION_KEY_CHARS = (16, 128)
"""The shortest and longest registration key an agent may send (`registration_digest`)."""


class NodeIdentityError(AuthError):
    """A call did not prove which node it comes from, or claimed another node."""


class NodeImpersonationError(NodeIdentityError):
    """An authenticated node tried to speak for another node."""


def node_metadata(node_id: int, credential: str) -> tuple[tuple[str, str], ...]:
    """The metadata an agent attaches to every call after registering."""
    return ((NODE_ID_METADATA_KEY, str(node_id)), (NODE_CREDENTIAL_METADATA_KEY, credential))


def check_registration_key(key: str) -> str:
    """`key`, if it is a usable registration key or "" (none).

    Raises:
        ConfigError: a key shorter or longer than `REGISTRATION_KEY_CHARS` allows, or not
            printable ASCII (the message gives its length, never the key).
    """
    shortest, longest = REGISTRATION_KEY_CHARS
    if key and not (shortest <= len(key) <= longest and key.isascii() and key.isprintable()):
        raise ConfigError(
            f"registration_key must be {shortest} to {longest} printable ASCII characters, got {len(key)} characters"
        )
    return key


def registration_digest(key: str) -> str:
    """The SHA-256 (hex) of an agent's registration key, "" for none.

    The key makes a registration repeatable (`JobLifecycle.register`): whoever presents it with
    the job token gets the node it registered, and so its credential. Only the digest is kept
    (it is journaled), so the journal cannot hand out credentials.

    Raises:
        ConfigError: a malformed key (`check_registration_key`).
    """
    return hashlib.sha256(key.encode("ascii")).hexdigest() if check_registration_key(key) else ""


class NodeAuthenticator:
    """Issues and checks node credentials for one job.

    Args:
        secret: the master's node secret (the HMAC key); never the job token.
        job_name: binds credentials to this job.
    """

    def __init__(self, secret: str, job_name: str) -> None:
        self._key = validate_token(secret).encode("ascii")
        self._job = job_name.encode("utf-8")

    def credential(self, node_id: int) -> str:
        """The credential of `node_id`."""
        message = _DOMAIN + self._job + b"\x00" + str(int(node_id)).encode("ascii")
        return hmac.new(self._key, message, hashlib.sha256).hexdigest()

    def authenticate(self, metadata: Iterable[tuple[str, str | bytes]] | None) -> int:
        """The node id proven by `metadata`.

        Raises:
            NodeIdentityError: the id or credential is missing, malformed or wrong.
        """
        node_text: str | None = None
        presented: str | None = None
        for key, value in metadata or ():
            if not isinstance(value, str):
                continue
            if key == NODE_ID_METADATA_KEY:
                node_text = value
            elif key == NODE_CREDENTIAL_METADATA_KEY:
                presented = value
        if node_text is None or presented is None:
            raise NodeIdentityError(
                f"missing node identity: send {NODE_ID_METADATA_KEY} and {NODE_CREDENTIAL_METADATA_KEY} metadata"
            )
        if not (0 < len(node_text) <= _MAX_ID_CHARS and node_text.isdigit() and node_text.isascii()):
            raise NodeIdentityError(f"{NODE_ID_METADATA_KEY} must be a non-negative integer, got {node_text[:40]!r}")
        node_id = int(node_text)
        expected = self.credential(node_id).encode("ascii")
        if not hmac.compare_digest(presented.encode("utf-8", "replace"), expected):
            raise NodeIdentityError(f"wrong node credential for node {node_id}")
        return node_id

    def authorize(self, metadata: Iterable[tuple[str, str | bytes]] | None, claimed_node_id: int) -> int:
        """Authenticate, then require that the request speaks for the authenticated node.

        Raises:
            NodeIdentityError: not authenticated, or `claimed_node_id` is another node.
        """
        node_id = self.authenticate(metadata)
        if claimed_node_id != node_id:
            raise NodeImpersonationError(f"node {node_id} cannot speak for node {claimed_node_id}")
        return node_id
