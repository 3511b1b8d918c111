"""The signal that ended a process, read from what launchers and shells print."""

from __future__ import annotations

import pytest

from dlrover.diagnosis import Evidence, signal_in_log


@pytest.mark.parametrize(
    ("log", "signal"),
    [
        ("Killed", 9),
        ("Segmentation fault (core dumped)", 11),
        ("./run.sh: line 4: 1234 Killed   python train.py", 9),
        ("  exitcode  : -11 (pid: 5)", 11),
        ("failed (exitcode: -9) local_rank: 1 (pid: 14447) of binary: /usr/bin/python", 9),
        ("[launch.py:325:sigkill_handler] ['python', 't.py'] exits with return code = -6", 6),
        ("subprocess.CalledProcessError: Command 'x' returned non-zero exit status -7.", 7),
        ("subprocess.CalledProcessError: Command 'x' died with <Signals.SIGSEGV: 11>.", 11),
        ("torch.multiprocessing.spawn.ProcessExitedException: process 0 terminated with signal SIGKILL", 9),
        ("RuntimeError: DataLoader worker (pid 4321) is killed by signal: Segmentation fault.", 11),
        ("      Exit Code:    137", 9),
        ("srun: error: node1: task 0: Killed", 9),
        ("Floating point exception (core dumped)", 8),
        ("zsh: killed     python main.py", 9),
        ("[1]    12345 segmentation fault  python train.py", 11),
        ("Process finished with exit code 137 (interrupted by signal 9: SIGKILL)", 9),
    ],
)
def test_each_wording_names_its_signal(log: str, signal: int) -> None:
    found = signal_in_log(Evidence.from_text(f"step 10 loss 2.3\n{log}\nmore output\n"))
    assert found is not None
    assert found.signal == signal
    assert found.line == log.rstrip()
    assert found.line_index == 1


@pytest.mark.parametrize(
    "log",
    ["Killed 3 zombie processes", "the job was terminated by the user", "Exit Code: 1", "exitcode  : 1 (pid: 5)", ""],
)
def test_sentences_and_plain_exit_statuses_name_no_signal(log: str) -> None:
    assert signal_in_log(Evidence.from_text(log)) is None


def test_torchruns_root_cause_wins_over_the_ranks_it_stopped() -> None:
    log = (
        "Failures:\n[1]:\n  exitcode  : -15 (pid: 2001)\n  traceback : Signal 15 (SIGTERM) received by PID 2001\n"
        "Root Cause (first observed failure):\n[0]:\n  exitcode  : -11 (pid: 2000)\n"
    )
    found = signal_in_log(Evidence.from_text(log))
    assert found is not None
    assert found.signal == 11


def test_without_a_root_cause_block_the_first_mention_wins() -> None:
    found = signal_in_log(Evidence.from_text("Segmentation fault\nTerminated\n"))
    assert found is not None
    assert found.signal == 11
