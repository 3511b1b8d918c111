"""Stack-dump helper edge cases that need no target process (the real dumps are in test_processes.py)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dlrover.common import ConfigError, ManualClock
from dlrover.diagnosis import install_stack_dump_handler, request_stack_dump


def test_timeout_must_be_positive() -> None:
    with pytest.raises(ConfigError, match="timeout_s"):
        request_stack_dump(1, timeout_s=0)


@pytest.mark.skipif(shutil.which("py-spy") is not None, reason="py-spy is installed here")
def test_without_py_spy_or_dump_file_says_why() -> None:
    result = request_stack_dump(1, use_py_spy=True)
    assert not result.ok
    assert "py-spy is not installed" in result.reason
    assert "no faulthandler dump file" in result.reason


def test_gone_process_is_reported(tmp_path: Path) -> None:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    dump = tmp_path / "d.txt"
    dump.write_text("")
    result = request_stack_dump(proc.pid, dump_path=dump, use_py_spy=False, clock=ManualClock())
    assert not result.ok
    assert f"process {proc.pid} does not exist" in result.reason


def test_handler_registers_and_closes_idempotently(tmp_path: Path) -> None:
    path = tmp_path / "stacks.txt"
    with install_stack_dump_handler(path) as handler:
        assert path.exists()
    handler.close()
