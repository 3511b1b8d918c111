from __future__ import annotations

import io
import json
import logging

import pytest

from dlrover.common import ConfigError, configure_logging


@pytest.fixture
def logger_name(request: pytest.FixtureRequest) -> str:
    return f"dlrover.test.{request.node.name}"


def test_json_lines_carry_message_and_extras(logger_name: str) -> None:
    stream = io.StringIO()
    configure_logging("DEBUG", json_lines=True, stream=stream, logger_name=logger_name)
    logging.getLogger(logger_name).info("node %s failed", "n1", extra={"node_id": "n1", "exit_code": 137})
    entry = json.loads(stream.getvalue().strip())
    assert entry["msg"] == "node n1 failed"
    assert entry["level"] == "INFO"
    assert entry["node_id"] == "n1"
    assert entry["exit_code"] == 137


def test_text_is_the_default_and_reconfiguring_replaces_the_handler(
    logger_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("DLROVER_LOG_FORMAT", raising=False)
    first, second = io.StringIO(), io.StringIO()
    configure_logging("INFO", stream=first, logger_name=logger_name)
    configure_logging("INFO", stream=second, logger_name=logger_name)
    logging.getLogger(logger_name).warning("hello")
    assert first.getvalue() == ""
    assert "WARNING" in second.getvalue()
    assert "hello" in second.getvalue()


def test_environment_selects_json(logger_name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DLROVER_LOG_FORMAT", "json")
    stream = io.StringIO()
    configure_logging("INFO", stream=stream, logger_name=logger_name)
    logging.getLogger(logger_name).error("boom")
    assert json.loads(stream.getvalue())["msg"] == "boom"


def test_bad_settings_are_named(logger_name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match="LOUD"):
        configure_logging("LOUD", logger_name=logger_name)
    monkeypatch.setenv("DLROVER_LOG_FORMAT", "xml")
    with pytest.raises(ConfigError, match="xml"):
        configure_logging("INFO", logger_name=logger_name)
