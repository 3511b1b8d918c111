"""What a master tells the agents it starts about TLS (`dlrover.master.agent_tls`), from its flags to
the agents' environment, and that master clients take TLS from the environment unless told otherwise."""

from __future__ import annotations

from pathlib import Path

import pytest
from dlrover_testsupport.tls import self_signed

from dlrover.common import (
    ChannelConfig,
    ConfigError,
    ManualClock,
    RetryPolicy,
    RpcError,
    TLSConfig,
    master_tls_env,
)
from dlrover.master.agent_tls import agent_tls, agent_tls_env
from dlrover.master.cli import _run_parser, build_config
from dlrover.master.client import MasterClient
from dlrover.master.config import LifecycleConfig, MasterConfig, NodeRange
from dlrover.master.factory import create_master
from dlrover.master.scheduler.external import ExternalScheduler
from dlrover.rendezvous import RendezvousClient
from dlrover.shard import DatasetSpec, IndexSource, ShardClient, ShardClientConfig

SERVED = TLSConfig(cert_file="/tls/server.crt", key_file="/tls/server.key")
MUTUAL = TLSConfig(cert_file="/tls/server.crt", key_file="/tls/server.key", ca_file="/tls/ca.crt")


def test_a_plaintext_master_tells_its_agents_plaintext_explicitly() -> None:
    assert agent_tls(None, None) is None
    assert agent_tls_env(None, None) == master_tls_env(None)
    assert set(agent_tls_env(None, None).values()) == {""}


def test_a_self_signed_certificate_is_its_own_ca() -> None:
    assert agent_tls(SERVED, None) == TLSConfig(ca_file="/tls/server.crt")


def test_a_mutual_tls_master_gives_its_ca_and_needs_a_client_certificate() -> None:
    with pytest.raises(ConfigError, match="--agent-tls-cert and --agent-tls-key"):
        agent_tls(MUTUAL, None)
    given = TLSConfig(cert_file="/tls/agent.crt", key_file="/tls/agent.key")
    assert agent_tls(MUTUAL, given) == TLSConfig(
        ca_file="/tls/ca.crt", cert_file="/tls/agent.crt", key_file="/tls/agent.key"
    )


def test_given_settings_win() -> None:
    given = TLSConfig(ca_file="/tls/root.crt", server_name_override="master.example")
    assert agent_tls(SERVED, given) == TLSConfig(ca_file="/tls/root.crt", server_name_override="master.example")


def test_agent_tls_for_a_plaintext_master_is_refused() -> None:
    with pytest.raises(ConfigError, match="serves plaintext"):
        agent_tls(None, TLSConfig(ca_file="/tls/root.crt"))


def test_flags_reach_the_config() -> None:
    args = _run_parser().parse_args(
        ["--tls-cert=c", "--tls-key=k", "--agent-tls-ca=a", "--agent-tls-server-name=n", "--agent-command=x"]
    )
    assert build_config(args).agent_tls == TLSConfig(ca_file="a", server_name_override="n")
    assert build_config(_run_parser().parse_args(["--agent-command=x"])).agent_tls is None
    with pytest.raises(ConfigError, match="--agent-tls-cert and --agent-tls-key must be given together"):
        build_config(_run_parser().parse_args(["--agent-tls-cert=c", "--agent-command=x"]))


def test_agent_tls_is_refused_for_a_backend_that_does_not_start_local_agents() -> None:
    config = MasterConfig(backend="external", tls=SERVED, agent_tls=TLSConfig(ca_file="/tls/root.crt"))
    with pytest.raises(ConfigError, match="local backend"):
        create_master(config, scheduler=ExternalScheduler(), clock=ManualClock())


@pytest.mark.integration
def test_clients_take_tls_from_the_environment_unless_given_a_channel_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pair = self_signed(tmp_path)
    config = MasterConfig(
        lifecycle=LifecycleConfig(nodes=NodeRange(1, 1), node_start_timeout_s=None),
        backend="external",
        tls=TLSConfig(cert_file=pair.cert, key_file=pair.key),
    )
    monkeypatch.setenv("DLROVER_MASTER_TLS_CA", pair.cert)
    once = RetryPolicy(max_attempts=1, call_timeout_s=10, total_timeout_s=10)
    with create_master(config, scheduler=ExternalScheduler(), clock=ManualClock()) as runtime:
        address, token = runtime.address, runtime.token
        with MasterClient(address, token, policy=once) as client:
            assert client.job_status().job_name == config.job_name
        with RendezvousClient(address, token, policy=once) as rdzv:
            assert rdzv.kv_get(["nothing"]) is not None
        shard_config = ShardClientConfig(retry=once, prefetch_shards=0, queue_reports=False)
        with ShardClient(address, token, "data", "w0", config=shard_config) as shard:
            assert shard.register(DatasetSpec(name="data", source=IndexSource(8), batch_size=4)).created
            assert shard.fetch().shards
        # An explicit configuration is never overridden by the environment.
        plain = MasterClient(address, token, policy=once, channel_config=ChannelConfig())
        with plain, pytest.raises(RpcError, match="UNAVAILABLE"):
            plain.job_status()
