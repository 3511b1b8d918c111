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


_SPIN = """
import os, sys, threading, time
from dlrover.diagnosis import install_stack_dump_handler

install_stack_dump_handler(sys.argv[1])
threading.Thread(target=time.sleep, args=(60,), daemon=True).start()


def first_half():
    print("ready", flush=True)  # from inside: a dump after it finds the main thread here, whatever the pace
    while not os.path.exists(sys.argv[2]):
        pass


def second_half():
    time.sleep(60)


first_half()
second_half()
"""


def test_main_thread_frames_tell_a_process_that_moved_from_one_that_stands_still(tmp_path: Path) -> None:
    from dlrover.diagnosis import main_thread_frames

    dump_file, release = tmp_path / "stacks.txt", tmp_path / "release"
    proc = subprocess.Popen(
        [sys.executable, "-c", _SPIN, str(dump_file), str(release)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"
        busy = request_stack_dump(proc.pid, dump_path=dump_file, use_py_spy=False, timeout_s=10)
        assert busy.ok, busy.reason
        frames = main_thread_frames(busy.text)
        assert frames is not None
        assert any("in first_half" in frame for frame in frames)
        release.touch()
        # Dump until it sleeps in the second half: its frames are then the same in every dump.
        for _ in range(1000):
            later = request_stack_dump(proc.pid, dump_path=dump_file, use_py_spy=False, timeout_s=10)
            late_frames = main_thread_frames(later.text)
            assert late_frames is not None
            if "second_half" in late_frames[0]:
                break
        assert late_frames != frames  # it moved from the first half to the second
        again = main_thread_frames(request_stack_dump(proc.pid, dump_path=dump_file, use_py_spy=False).text)
        assert again == late_frames  # asleep: it stands still
        assert "threading.py" not in " ".join(again)  # the sleeping thread's frames are not the main thread's
    finally:
        proc.kill()
        proc.wait()


def test_main_thread_frames_read_py_spy_dumps_and_refuse_dumps_without_a_main_thread() -> None:
    from dlrover.diagnosis import main_thread_frames

    py_spy = (
        "Process 4242: python train.py\nPython v3.11.7 (/usr/bin/python3.11)\n\n"
        'Thread 4250 (idle): "Thread-1"\n    wait (threading.py:320)\n\n'
        'Thread 4242 (active): "MainThread"\n    forward (model.py:46)\n    evaluate (train.py:210)\n'
        "    <module> (train.py:400)\n"
    )
    assert main_thread_frames(py_spy) == ("forward (model.py:46)", "evaluate (train.py:210)", "<module> (train.py:400)")
    assert main_thread_frames("") is None
    # faulthandler lists threads newest first, the main thread last, whichever one took the
    # signal ("Current thread"); Python 3.14 adds the thread's name.
    faulthandler_314 = (
        "Current thread 0x00007f0000000001 [pin_memory] (most recent call first):\n"
        '  File "threading.py", line 320 in wait\n\n'
        "Thread 0x00007f0000000002 [MainThread] (most recent call first):\n"
        '  File "train.py", line 210 in evaluate\n  File "train.py", line 400 in <module>\n'
    )
    assert main_thread_frames(faulthandler_314) == (
        'File "train.py", line 210 in evaluate',
        'File "train.py", line 400 in <module>',
    )
    assert main_thread_frames('Thread 4250 (idle): "Thread-1"\n    wait (threading.py:320)\n') is None
