"""Start, watch and stop the training processes of one node.

Each worker leads its own process group, so stopping it also stops whatever it started, and
carries a parent-death signal (see `dlrover.common.orphan_guard`), so it dies with the agent. It stays in the
agent's session (on Python 3.10, which cannot ask for a bare process group, it gets its own):
Linux's autogroup scheduler shares the CPU fairly between sessions first, so a worker in a
session of its own would compete as an equal with the agent's whole session, and the low
priority the agent gives its background checkpoint persist would not rank it below the workers. Its stdout and stderr go
through the agent, which writes them to the log directory, echoes them to the console as asked
(`--redirects`, `--tee`, `--local-ranks-filter`), and keeps the tail of stderr as evidence for
diagnosis.
"""

from __future__ import annotations

import collections
import contextlib
import fcntl
import json
import logging
import os
import select
import selectors
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

import attrs

from dlrover.common import DLRoverError
from dlrover.common.orphan_guard import guarded_argv
from dlrover.common.process import exiting_status
from dlrover.launcher.error_file import ERROR_FILE_ENV_VAR, read_error_file

__all__ = ["CappedLogFile", "StandbyPool", "WorkerExit", "WorkerGroup", "WorkerSpec"]

STDOUT, STDERR = 1, 2

_log = logging.getLogger(__name__)

# Linux's F_SETPIPE_SZ: a standby's go message (the worker's whole environment) must fit in its
# pipe, so handing it over never blocks the agent.
_F_SETPIPE_SZ = 1031
_GO_PIPE_BYTES = 1 << 20

# Python 3.10 cannot start a child in a new process group of the same session without a
# preexec_fn (unsafe with the agent's threads), so there it gets a session of its own.
_OWN_PROCESS_GROUP: dict[str, Any] = (
    {"process_group": 0} if sys.version_info >= (3, 11) else {"start_new_session": True}
)


@attrs.frozen
class WorkerSpec:
    """How to start one worker.

    Attributes:
        local_rank: its rank on this node.
        argv: the program and its arguments.
        env: its full environment.
        log_dir: folder for `stdout.log` and `stderr.log`; None keeps no files.
        redirect: bit mask (1 stdout, 2 stderr) of streams that go only to files.
        tee: bit mask of streams that go to files and to the console, prefixed with the rank.
        show: whether its console output is shown at all (`--local-ranks-filter`).
        error_file: where the worker's ``@record`` writes why it failed
            (``TORCHELASTIC_ERROR_FILE``, see `dlrover.launcher.error_file`); None sets none.
            An earlier file there is removed when the worker starts.
        duplicate_filters: for stdout and stderr, substrings whose lines, in a stream that is
            tee'd and logged, are also appended, prefixed, to ``filtered_stdout.log`` or
            ``filtered_stderr.log`` beside `log_dir` (torchrun's ``--duplicate-*-filters``).
        log_max_bytes: cap on each of `stdout.log` and `stderr.log` (0: none). A file that
            would pass it is renamed to ``<name>.1`` (replacing an older one) and a new file
            started, so each stream keeps its newest output, at most twice the cap on disk (see
            `CappedLogFile`). The filtered files are not capped.
    """

    local_rank: int
    argv: tuple[str, ...]
    env: Mapping[str, str]
    log_dir: Path | None = None
    redirect: int = 0
    tee: int = 0
    show: bool = True
    prefix: str = ""
    error_file: Path | None = None
    duplicate_filters: tuple[tuple[str, ...], tuple[str, ...]] = ((), ())
    log_max_bytes: int = attrs.field(default=0, validator=attrs.validators.ge(0))


@attrs.frozen
class WorkerExit:
    """How a worker ended.

    Attributes:
        local_rank: which worker.
        pid: its process id.
        exit_code: its exit status; for a signal, 128 + the signal number (as a shell reports it).
        signal_name: the signal that killed it, e.g. "SIGKILL", or None.
        stderr_tail: the last lines it wrote to stderr.
        error: what it wrote to its error file (`WorkerSpec.error_file`); "" for none.
        log_dir: the folder of its `stdout.log` and `stderr.log` (`WorkerSpec.log_dir`); None
            when it kept none.
    """

    local_rank: int
    pid: int
    exit_code: int
    signal_name: str | None
    stderr_tail: str
    error: str = ""
    log_dir: Path | None = None

    @property
    def succeeded(self) -> bool:
        return self.exit_code == 0


class CappedLogFile:
    """An append-only log file that never grows past a cap: at the cap it rotates.

    When a line would take the file past `max_bytes`, the file is renamed to ``<name>.1``
    (replacing the one before, whose output is dropped) and a new file is started with a first line
    that says so. The file and its ``.1`` hold the newest output, at most about twice the cap: the
    end of a worker's output, where its traceback is, is always kept. A single line longer than the
    cap is written whole. The first rotation is logged (a warning naming the file).

    Args:
        path: the log file (created, or appended to).
        max_bytes: the cap; 0 for none.
    """

    def __init__(self, path: Path, max_bytes: int = 0) -> None:
        self._path = path
        self._max_bytes = max_bytes
        self._file = open(path, "ab")  # noqa: SIM115 (closed by close())
        self._size = self._file.tell()
        self.rotations = 0

    def write(self, data: bytes) -> None:
        """Append `data` (whole lines), rotating first if it would pass the cap."""
        if self._max_bytes and self._size and self._size + len(data) > self._max_bytes:
            self._rotate()
        self._file.write(data)
        self._file.flush()
        self._size += len(data)

    def _rotate(self) -> None:
        self._file.close()
        older = self._path.with_name(self._path.name + ".1")
        os.replace(self._path, older)
        self._file = open(self._path, "ab")  # noqa: SIM115 (closed by close())
        self.rotations += 1
        note = (
            f"[dlrover-run: this file reached its cap of {self._max_bytes} bytes (--log-max-mb); the output "
            f"before this line is in {older.name}, older output was dropped ({self.rotations} rotation(s))]\n"
        ).encode()
        self._file.write(note)
        self._size = len(note)
        if self.rotations == 1:
            _log.warning(
                "%s reached its cap of %.1f MB (--log-max-mb): its earlier output moved to %s, and from now on "
                "only the newest output of this stream is kept",
                self._path,
                self._max_bytes / 1e6,
                older.name,
            )

    def close(self) -> None:
        self._file.close()


# A pipe is read a line at a time, but never more than this at once: output that never ends a line
# (a progress bar redrawn with carriage returns) must not grow the agent's memory without bound.
_MAX_READ_BYTES = 64 * 1024


class _StreamPump:
    """Copies one pipe to a log file and/or the console, keeping a bounded tail."""

    def __init__(
        self,
        source: IO[bytes],
        log_path: Path | None,
        console: IO[bytes] | None,
        prefix: bytes,
        tail_bytes: int,
        *,
        duplicate: tuple[Path, tuple[str, ...]] | None = None,
        duplicate_prefix: bytes = b"",
        log_max_bytes: int = 0,
    ) -> None:
        self._source = source
        self._log = CappedLogFile(log_path, log_max_bytes) if log_path is not None else None
        # Every worker's pump appends to the one filtered file: whole lines, one write each.
        self._filtered = open(duplicate[0], "ab") if duplicate is not None else None  # noqa: SIM115 (as _log)
        self._filters = tuple(f.encode() for f in duplicate[1]) if duplicate is not None else ()
        self._filtered_prefix = duplicate_prefix
        self._console = console
        self._prefix = prefix
        self._tail: collections.deque[bytes] = collections.deque()
        self._tail_size = 0
        self._tail_limit = tail_bytes
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="dlrover-worker-log", daemon=True)
        self._thread.start()

    def _keep(self, line: bytes) -> None:
        with self._lock:
            self._tail.append(line)
            self._tail_size += len(line)
            while self._tail_size > self._tail_limit and len(self._tail) > 1:
                self._tail_size -= len(self._tail.popleft())

    def _run(self) -> None:
        try:
            for line in iter(lambda: self._source.readline(_MAX_READ_BYTES), b""):
                self._keep(line)
                if self._log is not None:
                    self._write_log(line)
                if self._console is not None:
                    self._console.write(self._prefix + line)
                    self._console.flush()
                if self._filtered is not None and any(f in line for f in self._filters):
                    self._filtered.write(self._filtered_prefix + line)
                    self._filtered.flush()
        except (OSError, ValueError):
            pass  # the console went away; the worker's exit status still tells what happened
        finally:
            if self._log is not None:
                self._log.close()
            if self._filtered is not None:
                self._filtered.close()
            self._source.close()

    def _write_log(self, line: bytes) -> None:
        assert self._log is not None
        try:
            self._log.write(line)
        except OSError as exc:
            # A full disk ends the file, not the console copy or the tail kept for diagnosis.
            _log.warning("stopped writing a worker's log file: %s", exc)
            with contextlib.suppress(OSError):
                self._log.close()
            self._log = None

    def join(self, timeout_s: float) -> None:
        self._thread.join(timeout_s)

    def tail(self) -> str:
        with self._lock:
            return b"".join(self._tail).decode("utf-8", "replace")


def _console_for(spec: WorkerSpec, stream: int) -> tuple[IO[bytes] | None, bytes]:
    if not spec.show:
        return None, b""
    target = sys.stdout.buffer if stream == STDOUT else sys.stderr.buffer
    if spec.tee & stream:
        return target, spec.prefix.encode()
    if spec.redirect & stream:
        return None, b""
    return target, b""


class StandbyPool:
    """Interpreters that have already imported `modules`, waiting to become the next workers.

    See `dlrover.launcher._standby`. The pool keeps `size` of them; `WorkerGroup` takes one per
    worker it starts (falling back to a fresh process when none is ready) and the agent refills
    the pool once the group runs, so the next restart finds them warm. Call `fill` from the
    agent's long-lived main thread: the parent-death signal fires when the spawning thread exits.

    Args:
        program: the worker command every standby will run (must be `_standby.runnable`).
        modules: modules to import ahead of time, e.g. ``("torch",)``.
        env: the environment standbys import under (the agent's worker environment); each
            worker's own environment replaces it when the standby is taken.
        size: standbys kept ready (normally the workers per node).
    """

    def __init__(self, program: Sequence[str], modules: Sequence[str], env: Mapping[str, str], size: int) -> None:
        from dlrover.launcher._standby import runnable

        if not runnable(program):
            raise DLRoverError(
                f"a standby cannot run {list(program)!r}: only `python -u SCRIPT` or `python -u -m MODULE`"
            )
        if size < 1:
            raise DLRoverError(f"a standby pool needs a size of at least 1, got {size}")
        self.program = tuple(program)
        self._modules = ",".join(modules)
        self._env = dict(env)
        self._size = size
        self._ready: list[subprocess.Popen[bytes]] = []
        # The read ends of the standbys still importing: each writes a line (or dies) when done.
        self._importing: dict[int, int] = {}
        self._warned = False
        self.taken = 0

    def set_env(self, env: Mapping[str, str]) -> None:
        """The environment the standbys started from now on import under (those started before keep
        theirs: each is handed its worker's own when taken)."""
        self._env = dict(env)

    def fill(self) -> None:
        """Start standbys until `size` are alive (dead ones, e.g. a failed import, are reaped)."""
        alive = []
        for proc in self._ready:
            if proc.poll() is None:
                alive.append(proc)
                continue
            if not self._warned:  # a typo in --prewarm would otherwise respawn silently every round
                self._warned = True
                tail = proc.stderr.read()[-2000:].decode("utf-8", "replace") if proc.stderr is not None else ""
                _log.warning(
                    "a standby worker importing %s exited before it was used (exit code %s); workers start "
                    "fresh when none is ready:\n%s",
                    self._modules,
                    proc.returncode,
                    tail,
                )
            _close_pipes(proc)
            self._stop_listening(proc.pid)
        self._ready = alive
        while len(self._ready) < self._size:
            signal_read, signal_write = os.pipe()
            command = [
                *(sys.executable, "-u", "-m", "dlrover.launcher._standby"),
                *(str(os.getpid()), self._modules, str(signal_write), "--"),
            ]
            try:
                proc = _spawn([*command, *self.program], self._env, stdin=subprocess.PIPE, pass_fds=(signal_write,))
            except BaseException:
                os.close(signal_read)
                raise
            finally:
                os.close(signal_write)
            self._importing[proc.pid] = signal_read
            assert proc.stdin is not None
            with contextlib.suppress(OSError):  # the default 64 KiB pipe is the fallback
                fcntl.fcntl(proc.stdin.fileno(), _F_SETPIPE_SZ, _GO_PIPE_BYTES)
            os.set_blocking(proc.stdin.fileno(), False)
            self._ready.append(proc)

    def wait_warm(self, timeout_s: float, stop: Callable[[], bool] | None = None) -> bool:
        """Wait until every standby has finished its imports (or died: `fill` replaces it later).

        Args:
            timeout_s: the longest wait.
            stop: polled about every 0.1 s; True ends the wait early.

        Returns:
            Whether none is still importing.
        """
        deadline = time.monotonic() + timeout_s
        while self._importing:
            if stop is not None and stop():
                return False
            with selectors.DefaultSelector() as selector:  # any descriptor number, unlike select()
                for pid, fd in self._importing.items():
                    selector.register(fd, selectors.EVENT_READ, pid)
                # Looked at once even with no time left: what is already written counts.
                ready = selector.select(min(max(deadline - time.monotonic(), 0.0), 0.1))
            for key, _events in ready:
                # A line (warm) or end of file (it died, or exec'd a fresh interpreter): done either way.
                self._stop_listening(key.data)
            if self._importing and time.monotonic() >= deadline:
                return False
        return True

    def _stop_listening(self, pid: int) -> None:
        fd = self._importing.pop(pid, None)
        if fd is not None:
            os.close(fd)

    def take(self, env: Mapping[str, str]) -> subprocess.Popen[bytes] | None:
        """Hand a live standby the worker environment `env` and return it, or None when none is ready."""
        message = json.dumps({"env": dict(env)}).encode() + b"\n"
        while self._ready:
            proc = self._ready.pop(0)
            self._stop_listening(proc.pid)
            assert proc.stdin is not None
            try:
                # Never blocks: the pipe is empty and non-blocking, so the whole message goes in
                # at once or the standby is not used.
                written = os.write(proc.stdin.fileno(), message)
            except BlockingIOError:
                written = 0
            except OSError:  # it died (its import failed, or it was killed): the next one, or fresh
                _discard(proc)
                continue
            if written < len(message):
                _log.warning(
                    "a worker environment of %d bytes does not fit a standby's pipe; starting workers fresh",
                    len(message),
                )
                _discard(proc)
                return None
            with contextlib.suppress(OSError):
                proc.stdin.close()
            self.taken += 1
            return proc
        return None

    def close(self, grace_s: float = 5.0) -> None:
        """End every standby not taken: one still importing is SIGKILLed at once (it reads its
        input only once its imports are done, and has run nothing of the program); end of input
        asks the warm ones to exit, SIGKILL after `grace_s`."""
        self.wait_warm(0.0)  # reads the ready lines already written: those are warm
        warm = []
        for proc in self._ready:
            if proc.pid in self._importing:
                _discard(proc)
                self._stop_listening(proc.pid)
            else:
                warm.append(proc)
        self._ready = warm
        for proc in self._ready:
            with contextlib.suppress(OSError):
                assert proc.stdin is not None
                proc.stdin.close()
        deadline = time.monotonic() + grace_s
        for proc in self._ready:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(deadline - time.monotonic(), 0.0))
            _discard(proc)
        self._ready = []
        for pid in list(self._importing):
            self._stop_listening(pid)


def _close_pipes(proc: subprocess.Popen[bytes]) -> None:
    for pipe in (proc.stdin, proc.stdout, proc.stderr):
        if pipe is not None:
            with contextlib.suppress(OSError):
                pipe.close()


def _discard(proc: subprocess.Popen[bytes]) -> None:
    _signal_group(proc.pid, signal.SIGKILL)
    proc.wait()
    _close_pipes(proc)


class WorkerGroup:
    """The workers of one node for one attempt.

    Args:
        specs: one per local rank.
        stderr_tail_bytes: how much of each worker's stderr is kept as evidence.
        standby: warm interpreters to start the workers from (see `StandbyPool`); workers whose
            command differs from the pool's, or for which none is ready, start fresh.
        read_exiting_status: how a worker that has begun to exit, but is not reaped yet, is
            recognised (`dlrover.common.exiting_status`); tests replace it.
        reap_timeout_s: a worker seen exiting with a failure that is still not reaped this long
            after is reported as exited, with the status it was seen exiting with.
    """

    def __init__(
        self,
        specs: Sequence[WorkerSpec],
        *,
        stderr_tail_bytes: int = 64 * 1024,
        standby: StandbyPool | None = None,
        read_exiting_status: Callable[[int], int | None] = exiting_status,
        reap_timeout_s: float = 30.0,
    ) -> None:
        if not specs:
            raise DLRoverError("a worker group needs at least one worker")
        self._specs = list(specs)
        self._specs_by_rank = {spec.local_rank: spec for spec in self._specs}
        self._tail_bytes = stderr_tail_bytes
        self._standby = standby
        self._read_exiting_status = read_exiting_status
        self._reap_timeout_s = reap_timeout_s
        self._procs: dict[int, subprocess.Popen[bytes]] = {}
        self._pumps: dict[int, list[_StreamPump]] = {}
        self._exits: dict[int, WorkerExit] = {}
        # Local ranks that failed or are exiting with a failure status, in the order first seen,
        # and when each was first seen exiting (before it could be reaped).
        self._failing: list[int] = []
        self._exiting_since: dict[int, tuple[float, int]] = {}
        self._terminated = False
        # One pidfd per worker whose exit is not recorded yet: `wait` wakes when one exits.
        self._pidfds: dict[int, int] = {}

    def rank_of(self, local_rank: int) -> str:
        """The global rank given to the worker of `local_rank` (its ``RANK``); "?" if none."""
        spec = self._specs_by_rank.get(local_rank)
        return spec.env.get("RANK", "?") if spec is not None else "?"

    @property
    def pids(self) -> dict[int, int]:
        """local rank -> pid of every started worker."""
        return {rank: proc.pid for rank, proc in self._procs.items()}

    def start(self) -> None:
        """Start every worker. Call from the agent's long-lived main thread (see `dlrover.common.orphan_guard`)."""
        if self._procs:
            raise DLRoverError("this worker group has already started")
        try:
            for spec in self._specs:
                self._start_one(spec)
        except BaseException:
            self.stop(grace_s=0.0)
            raise

    def _start_one(self, spec: WorkerSpec) -> None:
        if spec.log_dir is not None:
            spec.log_dir.mkdir(parents=True, exist_ok=True)
        env = spec.env
        if spec.error_file is not None:
            spec.error_file.parent.mkdir(parents=True, exist_ok=True)
            spec.error_file.unlink(missing_ok=True)  # an earlier run's, never this worker's
            env = {**spec.env, ERROR_FILE_ENV_VAR: str(spec.error_file)}
        proc = None
        if self._standby is not None and tuple(spec.argv) == self._standby.program:
            proc = self._standby.take(env)
        if proc is None:
            guard = guarded_argv(os.getpid(), list(spec.argv))
            proc = _spawn(guard, env, stdin=subprocess.DEVNULL)
        self._procs[spec.local_rank] = proc
        pumps = []
        for stream, pipe, name in ((STDOUT, proc.stdout, "stdout.log"), (STDERR, proc.stderr, "stderr.log")):
            assert pipe is not None
            console, prefix = _console_for(spec, stream)
            log_path = spec.log_dir / name if spec.log_dir is not None else None
            filters = spec.duplicate_filters[0 if stream == STDOUT else 1]
            duplicate = None
            if filters and spec.log_dir is not None and spec.tee & stream:
                duplicate = (spec.log_dir.parent / f"filtered_{name}", filters)
            pumps.append(
                _StreamPump(
                    pipe,
                    log_path,
                    console,
                    prefix,
                    self._tail_bytes,
                    duplicate=duplicate,
                    duplicate_prefix=spec.prefix.encode(),
                    log_max_bytes=spec.log_max_bytes,
                )
            )
        self._pumps[spec.local_rank] = pumps
        pidfd = _open_pidfd(proc.pid)
        if pidfd is not None:
            self._pidfds[spec.local_rank] = pidfd

    def poll(self) -> dict[int, WorkerExit]:
        """Exits seen so far, by local rank; workers still running are absent.

        It also notes workers that have begun to exit with a failure but are not reaped yet
        (see `failing`): the kernel releases a dying process's memory before it can be reaped,
        which takes seconds for a worker holding tens of GB.
        """
        now = time.monotonic()
        for rank, proc in self._procs.items():
            if rank in self._exits:
                continue
            if proc.poll() is not None:
                self._exits[rank] = self._exit_of(rank, proc, proc.returncode)
                self._close_pidfd(rank)
                if not self._exits[rank].succeeded and rank not in self._failing:
                    self._failing.append(rank)
                elif self._exits[rank].succeeded and rank in self._failing:
                    # Its main thread left with a failure status, yet the process ended cleanly
                    # (a program whose other threads outlived the main one): no failure after all.
                    self._failing.remove(rank)
                continue
            status = self._read_exiting_status(proc.pid)
            if not status:  # running, or exiting cleanly: only a failure is acted on early
                continue
            seen = self._exiting_since.setdefault(rank, (now, status))
            if rank not in self._failing:
                self._failing.append(rank)
            if now - seen[0] >= self._reap_timeout_s:
                _log.warning(
                    "local rank %d (pid %d) began to exit %.0f s ago and is still not reaped; reported as exited",
                    rank,
                    proc.pid,
                    now - seen[0],
                )
                # Its pipes may stay open as long as it is stuck: the tail read so far will do.
                self._exits[rank] = self._exit_of(rank, proc, os.waitstatus_to_exitcode(seen[1]), join_s=0.1)
                self._close_pidfd(rank)
        return dict(self._exits)

    def wait(self, timeout_s: float, wake_fd: int | None = None) -> None:
        """Sleep up to `timeout_s`; return early when a worker exits or `wake_fd` turns readable.

        A worker's exit is seen the moment the kernel has torn it down (through a pidfd, on Linux
        5.3 and later), not at the next tick of the caller's polling interval; elsewhere this
        sleeps the whole timeout (or until `wake_fd`). It records nothing: `poll` does.

        Args:
            timeout_s: the longest sleep, in seconds.
            wake_fd: a readable-when-woken descriptor (e.g. a pipe another thread writes to).
        """
        fds = list(self._pidfds.values())
        if wake_fd is not None:
            fds.append(wake_fd)
        if not fds:
            time.sleep(max(timeout_s, 0.0))
            return
        poller = select.poll()  # not select(): an agent's descriptors may be numbered past 1024
        for fd in fds:
            poller.register(fd, select.POLLIN)
        poller.poll(max(timeout_s, 0.0) * 1000.0)

    def _close_pidfd(self, rank: int) -> None:
        fd = self._pidfds.pop(rank, None)
        if fd is not None:
            os.close(fd)

    @property
    def failing(self) -> tuple[int, ...]:
        """Local ranks that failed, or have begun to exit with a failure status, in the order seen.

        Up to date as of the last `poll`. The first is the failure to report: the others are
        usually its consequence (a peer's collective broke, or `terminate` stopped them).
        """
        return tuple(self._failing)

    def _exit_of(self, rank: int, proc: subprocess.Popen[bytes], returncode: int, join_s: float = 2.0) -> WorkerExit:
        pumps = self._pumps.get(rank, [])  # none when starting it failed part-way
        for pump in pumps:
            pump.join(timeout_s=join_s)
        code = returncode
        signal_name = None
        if code < 0:
            try:
                signal_name = signal.Signals(-code).name
            except ValueError:
                signal_name = f"signal {-code}"
            code = 128 - code
        error_file = self._specs_by_rank[rank].error_file
        error = read_error_file(error_file) if error_file is not None and code != 0 else ""
        spec = self._specs_by_rank[rank]
        tail = pumps[1].tail() if pumps else ""
        return WorkerExit(rank, proc.pid, code, signal_name, tail, error, spec.log_dir)

    def running(self) -> bool:
        """Whether any worker is still running."""
        return len(self.poll()) < len(self._procs)

    @property
    def terminated(self) -> bool:
        """Whether `terminate` (or `stop`) has been called."""
        return self._terminated

    def terminate(self, sig: signal.Signals = signal.SIGTERM) -> None:
        """Send `sig` (SIGTERM) to every running worker's process group and return at once
        (`stop` waits)."""
        self._terminated = True
        for proc in self._procs.values():
            if proc.poll() is None:
                _signal_group(proc.pid, sig)
                # A stopped (SIGSTOP) worker acts on SIGTERM only once it runs again.
                _signal_group(proc.pid, signal.SIGCONT)

    def stop(self, grace_s: float, sig: signal.Signals = signal.SIGTERM) -> dict[int, WorkerExit]:
        """Send `sig` (SIGTERM) to every worker's process group, SIGKILL what is left after
        `grace_s`, reap all."""
        self.terminate(sig)
        deadline = time.monotonic() + grace_s
        for proc in self._procs.values():
            remaining = deadline - time.monotonic()
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(remaining, 0.0))
        for rank, proc in self._procs.items():
            if proc.poll() is None:
                # Said, so that a job whose workers ignore the signal learns why they died by SIGKILL.
                _log.warning(
                    "local rank %d (rank %s, pid %d) did not exit within the %g s grace period after %s: "
                    "sending SIGKILL",
                    rank,
                    self.rank_of(rank),
                    proc.pid,
                    grace_s,
                    sig.name,
                )
            # Kill the group even when the leader has exited: its children may remain.
            _signal_group(proc.pid, signal.SIGKILL)
            proc.wait()
        return self.poll()


def _spawn(
    argv: Sequence[str], env: Mapping[str, str], stdin: int, pass_fds: Sequence[int] = ()
) -> subprocess.Popen[bytes]:
    """Start a worker or standby with piped output, leading its own process group (pgid == pid).

    It stays in the agent's session where Python allows (see the module docstring).
    """
    return subprocess.Popen(
        argv,
        env=dict(env),
        stdin=stdin,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        pass_fds=tuple(pass_fds),
        **_OWN_PROCESS_GROUP,
    )


def _open_pidfd(pid: int) -> int | None:
    """A pidfd for `pid` (readable once it exits), or None where the platform has none."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):  # not Linux, a kernel before 5.3, or seccomp forbids it
        return None


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)
