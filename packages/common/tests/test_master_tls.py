"""The DLROVER_MASTER_TLS_* contract: parsing, refusals naming the variable, and real handshakes."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
from dlrover_testsupport.tls import mutual_tls_files, self_signed

from dlrover.common import (
    MASTER_TLS_CA_ENV_VAR,
    MASTER_TLS_CERT_ENV_VAR,
    MASTER_TLS_ENV_VARS,
    MASTER_TLS_KEY_ENV_VAR,
    MASTER_TLS_SERVER_NAME_ENV_VAR,
    ChannelConfig,
    ConfigError,
    GrpcServer,
    ServerConfig,
    TLSConfig,
    add_ping_service,
    create_channel,
    master_channel_config,
    master_tls_env,
    master_tls_from_env,
    master_tls_from_settings,
)
from dlrover.common.v1 import ping_pb2, ping_pb2_grpc


def test_unset_and_empty_mean_plaintext() -> None:
    assert master_tls_from_env({}) is None
    assert master_tls_from_env(dict.fromkeys(MASTER_TLS_ENV_VARS, "")) is None
    assert master_channel_config({}) == ChannelConfig()


def test_the_ca_turns_tls_on_with_absolute_paths(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pair = self_signed(tmp_path)
    monkeypatch.chdir(tmp_path)
    env = {MASTER_TLS_CA_ENV_VAR: Path(pair.cert).name, MASTER_TLS_SERVER_NAME_ENV_VAR: "localhost"}
    assert master_tls_from_env(env) == TLSConfig(ca_file=pair.cert, server_name_override="localhost")
    assert master_channel_config(env).tls == TLSConfig(ca_file=pair.cert, server_name_override="localhost")


def test_os_environ_is_the_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pair = self_signed(tmp_path)
    monkeypatch.setenv(MASTER_TLS_CA_ENV_VAR, pair.cert)
    assert master_channel_config().tls == TLSConfig(ca_file=pair.cert)


def test_client_certificate_and_key(tmp_path: Path) -> None:
    files = mutual_tls_files(tmp_path)
    env = {
        MASTER_TLS_CA_ENV_VAR: files.ca,
        MASTER_TLS_CERT_ENV_VAR: files.client.cert,
        MASTER_TLS_KEY_ENV_VAR: files.client.key,
    }
    expected = TLSConfig(ca_file=files.ca, cert_file=files.client.cert, key_file=files.client.key)
    assert master_tls_from_env(env) == expected


@pytest.mark.parametrize("given", [MASTER_TLS_CERT_ENV_VAR, MASTER_TLS_KEY_ENV_VAR])
def test_a_certificate_without_its_key_names_both(tmp_path: Path, given: str) -> None:
    files = mutual_tls_files(tmp_path)
    value = files.client.cert if given == MASTER_TLS_CERT_ENV_VAR else files.client.key
    missing = MASTER_TLS_KEY_ENV_VAR if given == MASTER_TLS_CERT_ENV_VAR else MASTER_TLS_CERT_ENV_VAR
    with pytest.raises(ConfigError, match=f"{given} is given but {missing} is not"):
        master_tls_from_env({MASTER_TLS_CA_ENV_VAR: files.ca, given: value})


@pytest.mark.parametrize("stray", [MASTER_TLS_SERVER_NAME_ENV_VAR, MASTER_TLS_CERT_ENV_VAR, MASTER_TLS_KEY_ENV_VAR])
def test_a_setting_without_the_ca_is_refused(stray: str) -> None:
    with pytest.raises(ConfigError, match=f"{stray} given without {MASTER_TLS_CA_ENV_VAR}"):
        master_tls_from_env({stray: "x"})


def test_an_unreadable_file_names_the_variable(tmp_path: Path) -> None:
    missing = tmp_path / "missing.pem"
    with pytest.raises(ConfigError, match=f"{MASTER_TLS_CA_ENV_VAR}=.*missing.pem.*cannot read"):
        master_tls_from_env({MASTER_TLS_CA_ENV_VAR: str(missing)})


def test_a_file_of_the_wrong_kind_names_the_variable(tmp_path: Path) -> None:
    files = mutual_tls_files(tmp_path)
    not_pem = tmp_path / "notes.txt"
    not_pem.write_text("hello")
    with pytest.raises(ConfigError, match=f"{MASTER_TLS_CA_ENV_VAR}=.*holds no PEM certificate"):
        master_tls_from_env({MASTER_TLS_CA_ENV_VAR: str(not_pem)})
    # The certificate where the key belongs.
    env = {
        MASTER_TLS_CA_ENV_VAR: files.ca,
        MASTER_TLS_CERT_ENV_VAR: files.client.cert,
        MASTER_TLS_KEY_ENV_VAR: files.client.cert,
    }
    with pytest.raises(ConfigError, match=f"{MASTER_TLS_KEY_ENV_VAR}=.*private key"):
        master_tls_from_env(env)


def test_origins_name_the_flag_that_gave_a_value(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="--master-tls-ca="):
        master_tls_from_settings(
            {MASTER_TLS_CA_ENV_VAR: str(tmp_path / "nope.pem")}, {MASTER_TLS_CA_ENV_VAR: "--master-tls-ca"}
        )


def test_env_of_a_config_reads_back_as_that_config(tmp_path: Path) -> None:
    files = mutual_tls_files(tmp_path)
    tls = TLSConfig(
        ca_file=files.ca, cert_file=files.client.cert, key_file=files.client.key, server_name_override="localhost"
    )
    env = master_tls_env(tls)
    assert set(env) == set(MASTER_TLS_ENV_VARS)
    assert master_tls_from_env(env) == tls
    # Plaintext sets every variable empty: it overrides what a child would inherit.
    assert master_tls_env(None) == dict.fromkeys(MASTER_TLS_ENV_VARS, "")
    assert master_tls_from_env({**env, **master_tls_env(None)}) is None


def test_env_needs_a_ca() -> None:
    with pytest.raises(ConfigError, match=MASTER_TLS_CA_ENV_VAR):
        master_tls_env(TLSConfig(server_name_override="localhost"))


def _ping(address: str, token: str, config: ChannelConfig) -> grpc.StatusCode:
    with create_channel(address, token, config) as channel:
        try:
            ping_pb2_grpc.PingServiceStub(channel).Ping(ping_pb2.PingRequest(payload=b"x"), timeout=10)
        except grpc.RpcError as exc:
            return exc.code()  # type: ignore[no-any-return]
    return grpc.StatusCode.OK


@pytest.mark.integration
def test_a_client_configured_by_the_environment_dials_a_tls_server(tmp_path: Path, token: str) -> None:
    pair = self_signed(tmp_path)
    server = GrpcServer(ServerConfig(tls=TLSConfig(cert_file=pair.cert, key_file=pair.key)), token)
    add_ping_service(server)
    with server:
        assert _ping(server.address, token, master_channel_config({MASTER_TLS_CA_ENV_VAR: pair.cert})) is (
            grpc.StatusCode.OK
        )
        assert _ping(server.address, token, master_channel_config({})) is grpc.StatusCode.UNAVAILABLE


@pytest.mark.integration
def test_mutual_tls_needs_the_client_certificate_from_the_environment(tmp_path: Path, token: str) -> None:
    files = mutual_tls_files(tmp_path)
    served = TLSConfig(cert_file=files.server.cert, key_file=files.server.key, ca_file=files.ca)
    server = GrpcServer(ServerConfig(tls=served), token)
    add_ping_service(server)
    with server:
        full = {
            MASTER_TLS_CA_ENV_VAR: files.ca,
            MASTER_TLS_CERT_ENV_VAR: files.client.cert,
            MASTER_TLS_KEY_ENV_VAR: files.client.key,
        }
        assert _ping(server.address, token, master_channel_config(full)) is grpc.StatusCode.OK
        no_identity = master_channel_config({MASTER_TLS_CA_ENV_VAR: files.ca})
        assert _ping(server.address, token, no_identity) is grpc.StatusCode.UNAVAILABLE


def test_the_variables_are_named_once() -> None:
    assert MASTER_TLS_ENV_VARS == (
        "DLROVER_MASTER_TLS_CA",
        "DLROVER_MASTER_TLS_SERVER_NAME",
        "DLROVER_MASTER_TLS_CERT",
        "DLROVER_MASTER_TLS_KEY",
    )
