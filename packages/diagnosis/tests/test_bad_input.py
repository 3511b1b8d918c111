"""Bad input never crashes the diagnosis: huge, binary, empty or missing logs give `unknown` with a reason."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dlrover.diagnosis import Evidence, ExitInfo, FailureKind, RuleRegistry, TailConfig, classify, read_log_tail


@pytest.fixture(scope="module")
def registry() -> RuleRegistry:
    # Built once (a third of a second): the property tests below classify hundreds of inputs.
    return RuleRegistry.with_builtin_rules()


def test_200_mb_log_is_read_bounded_and_classified(tmp_path: Path, registry: RuleRegistry) -> None:
    path = tmp_path / "big.log"
    size = 200 * 1024 * 1024
    line = b"2026-11-21 03:00:00,000 INFO step 100 loss 2.0 tokens/s 400000\n"
    with path.open("wb") as f:
        f.write(line * 1000)
        f.truncate(size)  # sparse zeros, then ordinary lines at the end
        f.seek(size)
        f.write(line * 2000)
    cfg = TailConfig(max_bytes=128 * 1024)
    tail = read_log_tail(path, cfg)
    assert os.path.getsize(path) > size
    assert tail.bytes_read == cfg.max_bytes
    assert tail.truncated
    diagnosis = classify(Evidence(exit=ExitInfo(1), log=tail), registry)
    assert diagnosis.kind is FailureKind.UNKNOWN
    assert "no rule matched" in diagnosis.reason
    assert "exit status 1" in diagnosis.reason


def test_binary_garbage_gives_unknown_with_reason(tmp_path: Path, registry: RuleRegistry) -> None:
    path = tmp_path / "garbage.log"
    path.write_bytes(bytes((i * 7919) % 256 for i in range(300_000)))
    diagnosis = classify(Evidence(exit=ExitInfo(1), log=read_log_tail(path)), registry)
    assert diagnosis.kind is FailureKind.UNKNOWN
    assert "mostly binary" in diagnosis.reason


def test_empty_log(tmp_path: Path, registry: RuleRegistry) -> None:
    path = tmp_path / "empty.log"
    path.write_bytes(b"")
    diagnosis = classify(Evidence(exit=ExitInfo(1), log=read_log_tail(path)), registry)
    assert diagnosis.kind is FailureKind.UNKNOWN
    assert "an empty log" in diagnosis.reason


def test_exit_code_without_log(registry: RuleRegistry) -> None:
    diagnosis = classify(Evidence(exit=ExitInfo(3)), registry)
    assert diagnosis.kind is FailureKind.UNKNOWN
    assert diagnosis.reason == "no rule matched the evidence (exit status 3, no log)"
    assert classify(Evidence(), registry).kind is FailureKind.UNKNOWN


def test_missing_log_file_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        read_log_tail(tmp_path / "nope.log")


@given(data=st.binary(max_size=4096), code=st.one_of(st.none(), st.integers(-64, 255)))
def test_any_bytes_and_exit_status_classify_without_crashing(
    registry: RuleRegistry, data: bytes, code: int | None
) -> None:
    diagnosis = classify(Evidence.from_text(data, returncode=code), registry)
    assert diagnosis.reason
    assert 0.0 <= diagnosis.confidence <= 1.0


@given(text=st.text(max_size=2000))
def test_any_text_classifies_without_crashing(registry: RuleRegistry, text: str) -> None:
    diagnosis = classify(Evidence.from_text(text), registry)
    assert diagnosis.reason
