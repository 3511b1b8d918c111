"""The signal that ended a process, as launchers and shells write it into a log.

An agent knows how its own worker ended, but the log of a failure often only says it in words: a
shell prints ``Killed`` or ``Segmentation fault (core dumped)``, torchrun's failure summary prints
``exitcode  : -11`` and ``Signal 11 (SIGSEGV) received by PID``, DeepSpeed's launcher
``exits with return code = -9``, ``subprocess`` ``died with <Signals.SIGSEGV: 11>``, a DataLoader
``worker (pid 7) is killed by signal: Killed``, Kubernetes ``Exit Code: 137``, Slurm
``task 0: Segmentation fault``. `signal_in_log` reads them all the same way, so the rules decide
from the signal, not from one launcher's wording.

Which mention counts: torchrun lists the ranks it stopped itself (SIGTERM) before its
``Root Cause (first observed failure)``; when that block is there, its signal is the one.
Otherwise the first mention is: a crash is reported before the launcher's teardown of the others.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import attrs

from dlrover.diagnosis.evidence import Evidence
from dlrover.diagnosis.scan import Scanner, matching_lines

__all__ = ["LogSignal", "signal_in_log", "signals_in_log"]

_NAMES = {
    "SIGHUP": 1,
    "SIGILL": 4,
    "SIGABRT": 6,
    "SIGBUS": 7,
    "SIGFPE": 8,
    "SIGKILL": 9,
    "SIGSEGV": 11,
    "SIGTERM": 15,
}
# The words a shell (bash's strsignal), Slurm's srun and the DataLoader use for a signal.
_WORDS = {
    "hangup": 1,
    "illegal instruction": 4,
    "aborted": 6,
    "bus error": 7,
    "floating point exception": 8,
    "killed": 9,
    "segmentation fault": 11,
    "terminated": 15,
    "abort": 6,
    "abort trap": 6,
}
_WORD = "|".join(sorted((re.escape(w) for w in _WORDS), key=len, reverse=True))
_NAME = r"SIG(?:HUP|ILL|ABRT|BUS|FPE|KILL|SEGV|TERM)"

# Each pattern's group "num" is a negative or 128+N status, "name" a SIG name, "word" a word,
# "mac" macOS's description and number.
_PATTERNS = (
    # torchrun's summary and its agent's log line; DeepSpeed's launcher; subprocess; mp.spawn.
    re.compile(r"exitcode\s*:\s*(?P<num>-\d+)\b"),
    re.compile(r"\bSignal \d+ \((?P<name>" + _NAME + r")\) received by PID"),
    re.compile(r"return code = (?P<num>-\d+)\b"),
    re.compile(r"returned non-zero exit status (?P<num>-\d+|1[2-5]\d\b)"),
    re.compile(r"died with <Signals\.(?P<name>" + _NAME + r")"),
    # joblib's loky ("The exit codes of the workers are {SIGKILL(-9)}"), a negative status in words.
    re.compile(r"exit codes of the workers are \{(?P<name>" + _NAME + r")\("),
    re.compile(r"(?:exited|terminated|died|failed) with (?:exit ?)?(?:code|status) (?P<num>-\d+)\b", re.I),
    re.compile(r"terminated with signal (?P<name>" + _NAME + r")"),
    re.compile(r"is killed by signal: (?P<word>" + _WORD + r")", re.IGNORECASE),
    # Kubernetes (kubectl describe, kubelet), Docker.
    re.compile(r"\bExit ?Code:\s*(?P<num>1[2-5]\d)\b", re.IGNORECASE),
    re.compile(r"(?:exited|terminated|completed|failed) with (?:exit )?(?:code|status) (?P<num>1[2-5]\d)\b", re.I),
    # Go's and make's reports of a child ("exit status 137"); Slurm's "ExitCode=0:9" (status:signal).
    re.compile(r"\bexit status (?P<num>1[2-5]\d)\b", re.IGNORECASE),
    re.compile(r"\bExitCode=\d+:(?P<signum>[1-9]\d?)\b"),
    # Slurm: "srun: error: node1: task 0: Killed".
    re.compile(r"\btask \d+: (?P<word>" + _WORD + r")\s*$", re.IGNORECASE),
    # A shell reporting its child: a line of its own ("Killed", "Segmentation fault (core
    # dumped)"), or bash's "./run.sh: line 4: 1234 Killed  python train.py".
    re.compile(r"^[\s>`*_]*(?P<word>" + _WORD + r")(?:\s+\(core dumped\))?[\s`*_]*$", re.IGNORECASE),
    # A timestamp or bracketed prefix may come before it, nothing else.
    re.compile(r"^(?:[\d\-:,./ T\[\]]*\s)?\S+: line \d+:\s+\d+ (?P<word>" + _WORD + r")\b", re.IGNORECASE),
    # MPICH's Hydra: "BAD TERMINATION OF ONE OF YOUR APPLICATION PROCESSES ... EXIT CODE: 9",
    # the signal's number for a process killed by it (128+N where the process exited with it).
    re.compile(r"^=\s+EXIT CODE: (?P<signum>9)\s*$"),
    re.compile(r"^=\s+EXIT CODE: (?P<num>1[2-5]\d)\s*$"),
    # zsh ("zsh: killed     python train.py", "[1]    12345 killed     python train.py") and IDEs
    # ("Process finished with exit code 137 (interrupted by signal 9: SIGKILL)").
    re.compile(r"^(?:zsh|bash|sh|fish): (?P<word>" + _WORD + r")\s", re.IGNORECASE),
    re.compile(r"^\[\d+\]\s+\+?\s*\d+ (?P<word>" + _WORD + r")\s", re.IGNORECASE),
    # bash's job control ("[1]+  Killed                  python train.py").
    re.compile(r"^\[\d+\][+-]?\s+(?P<word>" + _WORD + r")\s", re.IGNORECASE),
    re.compile(r"interrupted by signal (?P<signum>\d+)\b"),
    # Open MPI's signal handler ("[node1:01234] Signal: Aborted (6)"), in mpirun and Horovod jobs.
    re.compile(r"\bSignal: (?P<word>" + _WORD + r") \(\d+\)", re.IGNORECASE),
    # macOS's shells print the signal's description with its number there ("Killed: 9", "Abort
    # trap: 6"), capitalised, on a line of their own; the word decides (SIGBUS is 10 on macOS).
    re.compile(
        r"^[\s>`*_]*(?P<mac>Hangup: 1|Illegal instruction: 4|Abort trap: 6|Floating point exception: 8|"
        r"Killed: 9|Bus error: 10|Segmentation fault: 11|Terminated: 15)[\s`*_]*$"
    ),
)
_SCANNERS = tuple(Scanner.of(p) for p in _PATTERNS)
_ROOT_CAUSE = "Root Cause (first observed failure)"


@attrs.frozen
class LogSignal:
    """A signal the log says ended a process.

    Attributes:
        signal: the signal number.
        line_index: the log line that says so.
        line: that line.
    """

    signal: int
    line_index: int
    line: str


def _signal_of(match: re.Match[str]) -> int | None:
    groups = match.groupdict()
    if groups.get("num"):
        status = int(groups["num"])
        return -status if status < 0 else status - 128
    if groups.get("name"):
        return _NAMES[groups["name"]]
    if groups.get("word"):
        return _WORDS[groups["word"].lower()]
    if groups.get("mac"):
        return _WORDS[groups["mac"].rsplit(":", 1)[0].lower()]
    if groups.get("signum"):
        return int(groups["signum"])
    return None


def signals_in_log(evidence: Evidence) -> list[LogSignal]:
    """Every signal the log says ended a process, in log order."""
    lines = evidence.lines()
    found: list[LogSignal] = []
    for index in matching_lines(evidence, _SCANNERS):
        line = lines[index]
        for pattern in _PATTERNS:
            match = pattern.search(line)
            signum = None if match is None else _signal_of(match)
            if signum is not None and signum > 0:
                found.append(LogSignal(signum, index, line))
                break
    return found


def signal_in_log(evidence: Evidence) -> LogSignal | None:
    """The signal that the log says ended the failed process: the one in torchrun's root cause
    block when there is one, else the first mention; None when the log names none. Computed once
    per evidence."""
    return evidence.derived("dlrover.signal_in_log", _signal_in_log)


def _signal_in_log(evidence: Evidence) -> LogSignal | None:
    found = signals_in_log(evidence)
    if not found:
        return None
    lines: Sequence[str] = evidence.lines()
    root = next((i for i, line in enumerate(lines) if _ROOT_CAUSE in line), None)
    if root is not None:
        after = [s for s in found if s.line_index > root]
        if after:
            return after[0]
    return found[0]
