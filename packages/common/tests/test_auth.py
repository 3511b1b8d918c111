from __future__ import annotations

import os
from pathlib import Path

import grpc
import pytest

from dlrover.common import (
    TOKEN_ENV_VAR,
    TOKEN_FILE_ENV_VAR,
    AuthError,
    GrpcServer,
    create_channel,
    find_token,
    generate_token,
    load_token,
    validate_token,
    write_token_file,
)
from dlrover.common.v1 import ping_pb2, ping_pb2_grpc


def test_generated_tokens_are_valid_and_distinct() -> None:
    tokens = {generate_token() for _ in range(50)}
    assert len(tokens) == 50
    for t in tokens:
        assert validate_token(t) == t


@pytest.mark.parametrize("bad", ["", "short", "x" * 513, "has space in the token!!", "non-ascii-token-é-é-é"])
def test_unusable_tokens_are_refused(bad: str) -> None:
    with pytest.raises(AuthError):
        validate_token(bad)


def test_token_file_is_private(tmp_path: Path, token: str) -> None:
    path = write_token_file(tmp_path / "token", token)
    assert (path.stat().st_mode & 0o777) == 0o600
    assert load_token(token_file=path) == token


def test_token_file_readable_by_others_is_refused(tmp_path: Path, token: str) -> None:
    path = write_token_file(tmp_path / "token", token)
    os.chmod(path, 0o644)
    with pytest.raises(AuthError, match="0644"):
        load_token(token_file=path)


def test_missing_token_file_names_the_path(tmp_path: Path) -> None:
    with pytest.raises(AuthError, match="nope"):
        load_token(token_file=tmp_path / "nope")


def test_token_precedence(tmp_path: Path) -> None:
    arg, from_file, from_env = generate_token(), generate_token(), generate_token()
    path = write_token_file(tmp_path / "t", from_file)
    env = {TOKEN_ENV_VAR: from_env, TOKEN_FILE_ENV_VAR: str(path)}
    assert load_token(arg, environ=env) == arg
    assert load_token(environ=env) == from_file
    assert load_token(environ={TOKEN_ENV_VAR: from_env}) == from_env
    with pytest.raises(AuthError, match=TOKEN_ENV_VAR):
        load_token(environ={})


def test_find_token_says_which_file_the_token_came_from(tmp_path: Path) -> None:
    arg, from_file, flag_file, from_env = (generate_token() for _ in range(4))
    path = write_token_file(tmp_path / "t", from_file)
    flag_path = write_token_file(tmp_path / "f", flag_file)
    env = {TOKEN_ENV_VAR: from_env, TOKEN_FILE_ENV_VAR: str(path)}
    assert find_token(arg, token_file=flag_path, environ=env) == (arg, None)
    assert find_token(token_file=flag_path, environ=env) == (flag_file, flag_path)
    assert find_token(environ=env) == (from_file, path)
    assert find_token(environ={TOKEN_ENV_VAR: from_env, TOKEN_FILE_ENV_VAR: ""}) == (from_env, None)
    assert find_token(environ={}) is None
    with pytest.raises(AuthError):
        find_token("not a token", environ={})


def _ping(server: GrpcServer, token: str) -> bytes:
    with create_channel(server.address, token) as channel:
        stub = ping_pb2_grpc.PingServiceStub(channel)
        return bytes(stub.Ping(ping_pb2.PingRequest(payload=b"hi"), timeout=10).payload)


@pytest.mark.integration
def test_server_accepts_the_right_token(ping_server: GrpcServer, token: str) -> None:
    assert _ping(ping_server, token) == b"hi"


@pytest.mark.integration
def test_server_refuses_a_wrong_token(ping_server: GrpcServer) -> None:
    with pytest.raises(grpc.RpcError) as info:
        _ping(ping_server, generate_token())
    assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED


@pytest.mark.integration
def test_server_refuses_a_call_without_token(ping_server: GrpcServer) -> None:
    with grpc.insecure_channel(ping_server.address) as channel:
        stub = ping_pb2_grpc.PingServiceStub(channel)
        with pytest.raises(grpc.RpcError) as info:
            stub.Ping(ping_pb2.PingRequest(), timeout=10)
    assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED


@pytest.mark.integration
def test_server_refuses_a_token_without_bearer_prefix(ping_server: GrpcServer, token: str) -> None:
    with grpc.insecure_channel(ping_server.address) as channel:
        stub = ping_pb2_grpc.PingServiceStub(channel)
        with pytest.raises(grpc.RpcError) as info:
            stub.Ping(ping_pb2.PingRequest(), timeout=10, metadata=[("authorization", token)])
    assert info.value.code() == grpc.StatusCode.UNAUTHENTICATED
