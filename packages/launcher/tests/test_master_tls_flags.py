"""`dlrover-run --master-tls-*`: defaults from DLROVER_MASTER_TLS_*, flags first, errors name their source,
and a master this dlrover-run starts itself (plaintext) ignores them, saying so."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from dlrover_testsupport.tls import mutual_tls_files, self_signed

from dlrover.common import ConfigError, TLSConfig
from dlrover.launcher.args import parse_args
from dlrover.launcher.cli import _JobMaster, _master_tls


def test_no_flag_and_no_variable_is_plaintext() -> None:
    assert parse_args(["--master=h:1", "t.py"], env={}).master_tls is None


def test_the_variables_are_the_defaults(tmp_path: Path) -> None:
    files = mutual_tls_files(tmp_path)
    env = {
        "DLROVER_MASTER_TLS_CA": files.ca,
        "DLROVER_MASTER_TLS_SERVER_NAME": "master.example",
        "DLROVER_MASTER_TLS_CERT": files.client.cert,
        "DLROVER_MASTER_TLS_KEY": files.client.key,
    }
    assert parse_args(["--master=h:1", "t.py"], env=env).master_tls == TLSConfig(
        ca_file=files.ca,
        cert_file=files.client.cert,
        key_file=files.client.key,
        server_name_override="master.example",
    )


def test_flags_win_over_the_variables(tmp_path: Path) -> None:
    files = mutual_tls_files(tmp_path)
    other = self_signed(tmp_path, "other")
    env = {"DLROVER_MASTER_TLS_CA": other.cert, "DLROVER_MASTER_TLS_SERVER_NAME": "from-env"}
    argv = ["--master=h:1", f"--master-tls-ca={files.ca}", "--master_tls_server_name=from-flag", "t.py"]
    assert parse_args(argv, env=env).master_tls == TLSConfig(ca_file=files.ca, server_name_override="from-flag")


def test_errors_name_the_flag_or_the_variable_that_gave_the_value(tmp_path: Path) -> None:
    files = mutual_tls_files(tmp_path)
    with pytest.raises(ConfigError, match=r"--master-tls-ca=.*missing\.pem"):
        parse_args(["--master=h:1", f"--master-tls-ca={tmp_path / 'missing.pem'}", "t.py"], env={})
    with pytest.raises(ConfigError, match=r"DLROVER_MASTER_TLS_CA=.*missing\.pem"):
        parse_args(["--master=h:1", "t.py"], env={"DLROVER_MASTER_TLS_CA": str(tmp_path / "missing.pem")})
    argv = ["--master=h:1", f"--master-tls-ca={files.ca}", f"--master-tls-cert={files.client.cert}", "t.py"]
    with pytest.raises(ConfigError, match="--master-tls-cert is given but DLROVER_MASTER_TLS_KEY is not"):
        parse_args(argv, env={})
    with pytest.raises(ConfigError, match="--master-tls-server-name given without DLROVER_MASTER_TLS_CA"):
        parse_args(["--master=h:1", "--master-tls-server-name=x", "t.py"], env={})


def test_a_master_this_dlrover_run_starts_ignores_them_and_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    pair = self_signed(tmp_path)
    standalone = parse_args(["--standalone", f"--master-tls-ca={pair.cert}", "t.py"], env={})
    with caplog.at_level(logging.WARNING, logger="dlrover.launcher"):
        assert _master_tls(standalone, _JobMaster("127.0.0.1:1", "t", None)) is None
    assert "--master-tls-* / DLROVER_MASTER_TLS_* ignored" in caplog.text
    caplog.clear()
    # A node of a torchrun-style job whose master another node serves for its peers: plaintext too.
    argv = ["--nnodes=2", "--rdzv-backend=c10d", "--rdzv-endpoint=127.0.0.1:29400", f"--master-tls-ca={pair.cert}"]
    peer = parse_args([*argv, "t.py"], env={})
    with caplog.at_level(logging.WARNING, logger="dlrover.launcher"):
        assert _master_tls(peer, _JobMaster("127.0.0.1:29400", "t", None)) is None
    assert "serves plaintext" in caplog.text
    joining = parse_args(["--master=127.0.0.1:1", f"--master-tls-ca={pair.cert}", "t.py"], env={})
    assert _master_tls(joining, _JobMaster("127.0.0.1:1", "t", None)) == TLSConfig(ca_file=pair.cert)
