"""Per-node credentials: derived from the master's node secret, checked in constant time, bound to one node."""

from __future__ import annotations

from pathlib import Path

import pytest

from dlrover.common import generate_token
from dlrover.master.config import MasterConfig
from dlrover.master.factory import resolve_node_secret, resolve_token
from dlrover.master.identity import (
    NODE_CREDENTIAL_METADATA_KEY,
    NODE_ID_METADATA_KEY,
    NodeAuthenticator,
    NodeIdentityError,
    NodeImpersonationError,
    node_metadata,
)


def test_credentials_are_per_node_per_job_and_per_token() -> None:
    token = generate_token()
    auth = NodeAuthenticator(token, "job-a")
    assert auth.credential(1) != auth.credential(2)
    assert auth.credential(1) == NodeAuthenticator(token, "job-a").credential(1)  # survives a restart
    assert auth.credential(1) != NodeAuthenticator(token, "job-b").credential(1)
    assert auth.credential(1) != NodeAuthenticator(generate_token(), "job-a").credential(1)
    assert len(auth.credential(1)) == 64


def test_authenticate_and_authorize() -> None:
    auth = NodeAuthenticator(generate_token(), "job")
    md = node_metadata(7, auth.credential(7))
    assert auth.authenticate(md) == 7
    assert auth.authorize(md, 7) == 7
    with pytest.raises(NodeImpersonationError, match="node 7 cannot speak for node 8"):
        auth.authorize(md, 8)


@pytest.mark.parametrize(
    ("metadata", "message"),
    [
        ((), "missing node identity"),
        (((NODE_ID_METADATA_KEY, "7"),), "missing node identity"),
        (((NODE_ID_METADATA_KEY, "-1"), (NODE_CREDENTIAL_METADATA_KEY, "x")), "non-negative integer"),
        (((NODE_ID_METADATA_KEY, "9" * 30), (NODE_CREDENTIAL_METADATA_KEY, "x")), "non-negative integer"),
        (((NODE_ID_METADATA_KEY, "7"), (NODE_CREDENTIAL_METADATA_KEY, "0" * 64)), "wrong node credential for node 7"),
        (((NODE_ID_METADATA_KEY, "7"), (NODE_CREDENTIAL_METADATA_KEY, "ü")), "wrong node credential"),
    ],
)
def test_bad_identity_is_refused(metadata: tuple[tuple[str, str], ...], message: str) -> None:
    auth = NodeAuthenticator(generate_token(), "job")
    with pytest.raises(NodeIdentityError, match=message):
        auth.authenticate(metadata)


def test_another_nodes_credential_does_not_work() -> None:
    auth = NodeAuthenticator(generate_token(), "job")
    with pytest.raises(NodeIdentityError, match="wrong node credential for node 2"):
        auth.authenticate(node_metadata(2, auth.credential(1)))


def test_the_job_token_does_not_forge_credentials_issued_by_a_master(tmp_path: Path) -> None:
    """Workers hold the job token; the credentials come from a secret only the master holds."""
    config = MasterConfig(backend="external", state_dir=str(tmp_path))
    token, _ = resolve_token(config)
    secret = resolve_node_secret(config)
    assert secret != token
    assert resolve_node_secret(config) == secret  # a restarted master issues the same credentials
    assert (tmp_path / "node-secret").stat().st_mode & 0o777 == 0o600
    forged = NodeAuthenticator(token, config.job_name).credential(0)
    assert forged != NodeAuthenticator(secret, config.job_name).credential(0)
