"""A standby worker: an interpreter that has already imported heavy modules and waits to run.

    python -u -m dlrover.launcher._standby PARENT_PID MODULES READY_FD -- PYTHON -u SCRIPT [ARGS...]
    python -u -m dlrover.launcher._standby PARENT_PID MODULES READY_FD -- PYTHON -u -m MODULE [ARGS...]

Starting a worker costs the interpreter's start and the imports of torch and the like: seconds,
all of it on the restart path after a failure. A standby pays that ahead of time: it arms the
parent-death signal (as `dlrover.common.orphan_guard` does, so it dies with its agent), imports `MODULES`
(comma-separated), writes a line to the inherited file descriptor `READY_FD` and closes it (``-``:
none; the agent learns that the standby is warm), then blocks reading one line from standard input.
The line is the JSON object ``{"env": {NAME: VALUE, ...}}``: the standby replaces its environment
with that one, points fd 0 at /dev/null, and runs the worker program the way ``python -u SCRIPT``
or ``python -u -m MODULE`` would (``sys.argv``, ``sys.path[0]``, ``__name__ == "__main__"``, ``__file__``,
``sys.modules["__main__"]`` for pickling and multiprocessing's spawn, the same ``sys.flags``, the
modules' warnings filters placed where the program's own import would place them). End of input
without a line means the agent no longer needs it: it exits 0 without running anything. An
exception the program does not catch is printed as a fresh interpreter prints it (through
``sys.excepthook``, exit status 1; SIGINT for ``KeyboardInterrupt``), its traceback starting at the
program's own first frame: the frames of this runner are left out. Such a failed worker then ends as
the interpreter ends one, up to the end of its exit handlers (non-daemon threads waited for, the
``atexit`` handlers the modules and the program registered run, torch's included, the standard
streams and every open file flushed), and exits without tearing down its modules: torch's teardown
takes half a second here, seconds with CUDA, and the restart of every worker of the job waits for the
failed one to exit. Left out: finalizers of objects still alive at the end (``__del__``, so a gzip,
zip or tar writer the program left open gets its data flushed but no trailer or directory), and
exit handlers registered before this runner started (by a ``sitecustomize`` or ``.pth`` file).
``DLROVER_FAILED_WORKER_TEARDOWN=1`` in ``dlrover-run``'s environment keeps the full teardown. A
program that ends without an uncaught exception gets the full teardown, after one collection of its
cyclic garbage once its
exit handlers ran (while the interpreter is whole): torch's gloo worker threads would otherwise abort
the process now and then when a process group the program destroyed is freed during teardown.

`dlrover-run` uses standbys by default (``--prewarm torch,dlrover.flashckpt.checkpointer``). What could
differ from a fresh start is that `MODULES` were imported before the worker's own environment was
set, so a variable they read at import time (``OMP_NUM_THREADS`` for the OpenMP runtime torch loads) would miss anything
the program sets before its own first import of them. The standby guards against that
(decisions in `dlrover.launcher.env_guard`):

- The go message's environment is compared with the one the modules were imported under; a
  difference in a name they may read at import re-executes at once (below).
- While the program runs, an audit hook sees every environment write (``os.putenv``,
  ``os.unsetenv``: ``os.environ`` item set and delete) and the events that a second run would
  repeat (files opened for writing, sockets, child processes, ...); wrappers around
  ``builtins.__import__`` and ``importlib.import_module`` see the program's own first import of
  each prewarmed module, and are removed then (the hook does nothing more from then on).
- A write, before that import, of a name the modules may read at import (every name except the
  worker contract and a short list torch 2.13 reads only when used; none for the flash checkpoint
  client; see `import_time_sensitive`)
  makes the standby re-execute in place: ``os.execve`` of this interpreter with the worker's
  original argv and the go message's environment, after restoring the working directory, the
  signal mask and the signal dispositions the program may have changed. The pid stays the same
  (the agent's bookkeeping holds), the parent-death signal survives the exec (this is not a
  set-user-ID program), fds 0, 1 and 2 are what a fresh worker has (/dev/null and the agent's
  pipes; everything Python opens is close-on-exec). The fresh interpreter runs the program again
  from the start, which sets the variable again before its own import.
- If the program already did something a second run would repeat, the standby does not re-exec:
  it writes a warning naming the variable to stderr (``--prewarm none`` avoids it). Writes after
  the program's own import change nothing that a fresh start would not also ignore.

Limits: output the program wrote before a re-exec is written again by the second run; writes made
from C (``setenv`` through ctypes or an extension) are not seen; a side effect that raises no
audit event (writing through a file descriptor opened before, process state such as the CPU
affinity or niceness) does not stop the re-exec; a prewarmed module that changes ``os.environ``
while it imports (torch 2.13 does not) has those changes replaced by the worker's environment.
Seen from outside, ``/proc/PID/environ`` of a standby that runs a program still shows the
environment the standby was started with (the kernel keeps the one a process was exec'ed with).
"""

from __future__ import annotations

import atexit
import builtins
import contextlib
import gc
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import io
import json
import os
import runpy
import signal
import sys
import threading
import types
import warnings
import zipfile
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

from dlrover.common.orphan_guard import ORPHANED_EXIT_CODE, arm_parent_death_signal, prefer_for_oom_kill
from dlrover.launcher.env_guard import EnvGuard, EnvWriteAction, EnvWriteDecision, side_effect_of

USAGE = (
    "usage: python -u -m dlrover.launcher._standby PARENT_PID MODULES READY_FD -- PYTHON -u (SCRIPT | -m MODULE) "
    "[ARGS...]"
)

_Filter = tuple[Any, ...]


def runnable(program: Sequence[str]) -> bool:
    """Whether a standby can run `program` (``python -u SCRIPT ...`` or ``python -u -m MODULE ...``)."""
    if len(program) < 3 or program[1] != "-u":
        return False
    if program[2] == "-m":
        return len(program) >= 4
    return not program[2].startswith("-")


def _read_go_message() -> dict[str, str] | None:
    line = sys.stdin.readline()
    if not line:
        return None
    message = json.loads(line)
    env = message["env"]
    if not isinstance(env, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise ValueError("the go message's env must map names to strings")
    return env


def _detach_stdin() -> None:
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    sys.stdin = open(0, closefd=False)  # noqa: SIM115 (fd 0 lives as long as the process)


def _set_filters(filters: list[_Filter]) -> None:
    # resetwarnings bumps the filters' version, so no warning registry filled under the old list
    # (during the prewarm imports) is trusted afterwards.
    warnings.resetwarnings()
    cast("list[_Filter]", warnings.filters)[:] = filters


class _ImportFilters:
    """The warnings filters the prewarm imports added, held back until the program imports the modules.

    A fresh run adds them when the program imports torch, in front of (or behind, for appended
    ones) whatever the program had set by then; adding them at the same moment keeps their order.
    """

    def __init__(self, before: list[_Filter]) -> None:
        old = {id(f) for f in before}
        after = list(warnings.filters)
        first_old = next((i for i, f in enumerate(after) if id(f) in old), len(after))
        self._front = [f for f in after[:first_old] if id(f) not in old]
        self._back = [f for f in after[first_old:] if id(f) not in old]
        _set_filters([f for f in after if id(f) in old])

    def restore(self) -> None:
        if self._front or self._back:
            _set_filters([*self._front, *warnings.filters, *self._back])
            self._front = self._back = []


class _ProcessState:
    """What a fresh worker starts with and the program may change before a re-exec keeps it."""

    def __init__(self) -> None:
        self.cwd = os.getcwd()
        self.mask = signal.pthread_sigmask(signal.SIG_BLOCK, ())
        self.handlers: dict[signal.Signals, Any] = {}
        for sig in signal.valid_signals():
            if isinstance(sig, signal.Signals) and sig not in (signal.SIGKILL, signal.SIGSTOP):
                self.handlers[sig] = signal.getsignal(sig)

    def restore(self) -> None:
        os.chdir(self.cwd)
        for sig, handler in self.handlers.items():
            if handler is not None and signal.getsignal(sig) is not handler:
                with contextlib.suppress(OSError, ValueError):
                    signal.signal(sig, handler)
        signal.pthread_sigmask(signal.SIG_SETMASK, self.mask)


def _fd_target(fd: int) -> int | str:
    """The file an open descriptor names, or the descriptor where that cannot be read.

    Imports write bytecode by opening the file with ``os.open`` and then wrapping the descriptor,
    and the second audit event names only the descriptor: without its target, every bytecode write
    would look like a write to an unknown file. (``os.readlink`` raises no audit event.)
    """
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return fd


def _say(text: str) -> None:
    with contextlib.suppress(OSError):
        os.write(2, f"dlrover-run standby worker: {text}\n".encode())


def _reexec(program: Sequence[str], env: dict[str, str], state: _ProcessState, decision: EnvWriteDecision) -> None:
    """Replace this process with a fresh interpreter running `program`; returns only if exec failed."""
    _say(decision.reason)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    state.restore()
    try:
        os.execve(sys.executable, list(program), env)  # noqa: S606 (the worker's own argv, no shell)
    except OSError as exc:
        _say(f"could not restart as a fresh interpreter ({exc}); {decision.name} may not take effect")


class _Watch:
    """The adapter around `EnvGuard`: the audit hook, the import wrappers and the re-exec."""

    def __init__(
        self,
        guard: EnvGuard,
        program: Sequence[str],
        env: dict[str, str],
        state: _ProcessState,
        filters: _ImportFilters,
    ) -> None:
        self._guard = guard
        self._program = program
        self._env = env
        self._state = state
        self._filters = filters
        self._threads = threading.active_count()
        self.active = False
        self._import = builtins.__import__
        self._import_module = importlib.import_module
        self._guarded_import: Callable[..., Any] | None = None
        self._guarded_import_module: Callable[..., Any] | None = None

    def install(self) -> None:
        original_import, original_import_module = self._import, self._import_module

        def guarded_import(
            name: str,
            globals: Mapping[str, object] | None = None,  # builtins.__import__'s own parameter names
            locals: Mapping[str, object] | None = None,
            fromlist: Sequence[str] | None = (),
            level: int = 0,
        ) -> types.ModuleType:
            if level == 0 and self.active:
                self._imported(name)
            return original_import(name, globals, locals, fromlist, level)

        def guarded_import_module(name: str, package: str | None = None) -> types.ModuleType:
            if self.active:
                absolute = name
                if name.startswith("."):
                    with contextlib.suppress(ImportError, ValueError):
                        absolute = importlib.util.resolve_name(name, package)
                self._imported(absolute)
            return original_import_module(name, package)

        self._guarded_import, self._guarded_import_module = guarded_import, guarded_import_module
        self.active = True
        builtins.__import__ = guarded_import
        importlib.import_module = guarded_import_module
        # Audit hooks cannot be removed: once the guard is settled this one returns at once.
        sys.addaudithook(self._audit)

    def _settle(self) -> None:
        self.active = False
        # Steady-state imports must cost nothing: unwrap, unless the program wrapped them again.
        if builtins.__import__ is self._guarded_import:
            builtins.__import__ = self._import
        if importlib.import_module is self._guarded_import_module:
            importlib.import_module = self._import_module

    def _imported(self, name: str) -> None:
        pending = self._guard.pending
        self._guard.on_import(name)
        if self._guard.pending != pending:
            self._filters.restore()
        if self._guard.settled:
            self._settle()

    def _audit(self, event: str, args: tuple[Any, ...]) -> None:
        if not self.active:
            return
        try:
            if event in ("os.putenv", "os.unsetenv"):
                if threading.active_count() > self._threads:
                    self._guard.on_side_effect("started a thread")
                value = os.fsdecode(args[1]) if event == "os.putenv" else None
                self._decided(self._guard.on_env_write(os.fsdecode(args[0]), value))
                return
            if event == "open" and args and isinstance(args[0], int):
                args = (_fd_target(args[0]), *args[1:])
            what = side_effect_of(event, args, sys.pycache_prefix)
            if what is not None:
                self._guard.on_side_effect(what)
        except Exception as exc:  # an audit hook that raises breaks the audited call in the program
            self._settle()
            _say(f"the environment guard stopped after an internal error ({exc!r}); writes are no longer checked")

    def _decided(self, decision: EnvWriteDecision) -> None:
        if decision.action is EnvWriteAction.WARN:
            _say(f"warning: {decision.reason}")
        elif decision.action is EnvWriteAction.REEXEC:
            self._settle()  # were the exec to fail, the program goes on unwatched and unwrapped
            _reexec(self._program, self._env, self._state, decision)


def _run(program: list[str]) -> None:
    sys.orig_argv = list(program)  # what a fresh `python -u ...` was started with
    if program[2] == "-m":
        module, args = program[3], program[4:]
        # As `python -m`: the current directory first on the path; argv[0] becomes the module's file.
        sys.path[0] = os.getcwd()
        sys.argv = [module, *args]
        _run_module(module)
        return
    script, args = program[2], program[3:]
    sys.path[0] = os.path.dirname(os.path.realpath(script))
    sys.argv = [script, *args]
    path = os.path.abspath(script)
    if not os.path.exists(path):
        # As the interpreter says it, with its exit status (a usage error, not the script's failure).
        print(f"{sys.executable}: can't open file {path!r}: [Errno 2] No such file or directory", file=sys.stderr)
        raise SystemExit(2)
    if not os.path.isfile(path) or zipfile.is_zipfile(path):
        runpy.run_path(path, run_name="__main__")  # a folder or zip archive with a __main__.py
        return
    _run_file(path)


def _run_module(name: str) -> None:
    """Run module `name` (a package: its ``__main__``) as the main module, as `python -m` does.

    Not `runpy.run_module`: its main module would get ``__builtins__`` as a dict and no
    ``__annotations__``, unlike the one `python -m` runs in.
    """
    spec = importlib.util.find_spec(name)
    if spec is not None and spec.submodule_search_locations is not None:
        spec = importlib.util.find_spec(f"{name}.__main__")
    if spec is None or spec.origin is None or not isinstance(spec.loader, importlib.abc.InspectLoader):
        raise ImportError(f"No module named {name!r} that can be run as the main module", name=name)
    code = spec.loader.get_code(spec.name)
    if code is None:
        raise ImportError(f"No code object available for {name!r}", name=name)
    sys.argv[0] = spec.origin
    _exec_as_main(code, spec.origin, spec.loader, spec)


def _run_file(path: str) -> None:
    """Run the script at absolute `path` as the main module, as `python SCRIPT` does.

    Not `runpy.run_path`: it would set ``sys.argv[0]`` to its argument and ``__loader__`` to None,
    while a fresh interpreter keeps ``argv[0]`` as given and makes ``__file__`` absolute.
    """
    with io.open_code(path) as source:
        # dont_inherit: this module's `from __future__` flags must not change how the script compiles.
        code = compile(source.read(), path, "exec", dont_inherit=True)
    _exec_as_main(code, path, importlib.machinery.SourceFileLoader("__main__", path), None)


def _exec_as_main(
    code: types.CodeType, origin: str, loader: importlib.abc.Loader, spec: importlib.machinery.ModuleSpec | None
) -> None:
    main = types.ModuleType("__main__")
    main.__dict__.update(
        __file__=origin,
        __loader__=loader,
        __cached__=spec.cached if spec is not None else None,
        __package__=spec.parent if spec is not None else None,
        __spec__=spec,
        __annotations__={},
        __builtins__=builtins,
    )
    sys.modules["__main__"] = main
    exec(code, main.__dict__)  # noqa: S102 (the worker's own program, as the interpreter would run it)


def main(argv: list[str]) -> int:
    """Run as a standby worker (see the module's docstring); returns the exit status."""
    if not _usable(argv):
        print(USAGE, file=sys.stderr)
        return 2
    expected_parent, modules, program = int(argv[0]), argv[1], argv[4:]
    ready_fd = _ready_fd(argv[2])
    # Registered before any module is imported: exit handlers run last first, so this runs after
    # every handler the modules and the program register.
    failed_exit = _FailedExit()
    atexit.register(failed_exit)
    arm_parent_death_signal()
    prefer_for_oom_kill()  # as a worker started through the orphan guard
    if os.getppid() != expected_parent:
        return ORPHANED_EXIT_CODE
    prewarmed = [name for name in modules.split(",") if name]
    import_env = dict(os.environ)
    filters_before = list(warnings.filters)
    for name in prewarmed:
        importlib.import_module(name)
    filters = _ImportFilters(filters_before)
    _say_ready(ready_fd)
    env = _read_go_message()
    if env is None:
        return 0
    state = _ProcessState()
    os.environ.clear()
    os.environ.update(env)
    _detach_stdin()
    guard = EnvGuard(prewarmed, import_env)
    # The worker's environment against the one the modules were imported under: the agent's
    # writes come before the program's, so they are judged the same way.
    for name in sorted(set(env) | set(import_env)):
        if env.get(name) != import_env.get(name):
            decision = guard.on_env_write(name, env.get(name))
            if decision.action is EnvWriteAction.REEXEC:
                _reexec(program, env, state, decision)
                break
    if not guard.settled:
        _Watch(guard, program, env, state, filters).install()
    else:
        filters.restore()
    try:
        _run(program)
    except SystemExit:
        raise
    except KeyboardInterrupt as exc:
        _report_uncaught(exc)
        # Printed: the interpreter, which ends a process Ctrl-C stopped by SIGINT (its parent sees
        # the signal), must not print it again with this runner's frames.
        sys.excepthook = _printed_already
        raise
    except BaseException as exc:
        _report_uncaught(exc)
        failed_exit.status = 1
        return 1  # the interpreter's status for an uncaught exception
    return 0


def _usable(argv: list[str]) -> bool:
    return len(argv) >= 4 and argv[3] == "--" and runnable(argv[4:]) and (argv[2] == "-" or argv[2].isdigit())


def _ready_fd(arg: str) -> int | None:
    if arg == "-":
        return None
    fd = int(arg)
    # Not handed on to anything the imports start: a child holding it would keep the agent waiting
    # for a standby that died.
    os.set_inheritable(fd, False)
    return fd


def _say_ready(fd: int | None) -> None:
    """Tell the agent the imports are done (None: nobody asked); the descriptor is closed either way, so the
    program never sees it."""
    if fd is None:
        return
    try:
        os.write(fd, b"warm\n")
    except OSError:  # the agent closed its end: it no longer waits for this standby
        pass
    finally:
        os.close(fd)


def _printed_already(*_args: object) -> None:
    pass


FAILED_TEARDOWN_ENV_VAR = "DLROVER_FAILED_WORKER_TEARDOWN"
"""Set to 1 in `dlrover-run`'s environment: a failed worker tears its modules down as a fresh
interpreter does (for programs that rely on finalizers at exit, see the module)."""


class _FailedExit:
    """The last exit handler: once the program failed (`status` set), it flushes what the
    interpreter's teardown would have flushed and ends the process with `status` (see the module).
    Otherwise (a program that ended without an uncaught exception, `sys.exit` included, or a standby
    never used) the cyclic garbage is collected there, while the interpreter still runs, and then the
    interpreter ends as usual."""

    def __init__(self) -> None:
        self.status: int | None = None

    def __call__(self) -> None:
        if self.status is None:
            # Torch's gloo backend releases a finished collective's tensors on its own worker
            # threads; one that does so while the interpreter finalizes takes the GIL of a dying
            # interpreter, and the process aborts ("terminate called without an active exception",
            # status 134) after the program succeeded: about one exit in ten of a two-rank DDP job
            # on a loaded host. A process group the program destroyed, and a DDP model it released
            # (its reducer holds the group through reference cycles), go here instead: the group's
            # destructor joins those threads while the interpreter is whole.
            gc.collect()
            return
        if os.environ.get(FAILED_TEARDOWN_ENV_VAR) == "1":
            return
        try:
            _flush_open_files()
        finally:
            os._exit(self.status)


def _file_layer(obj: io.IOBase) -> int:
    """Outer wrappers first: a text file's buffer, a buffered file's raw file come after it."""
    if issubclass(type(obj), io.TextIOBase):
        return 0
    return 1 if issubclass(type(obj), io.BufferedIOBase) else 2


def _flush_open_files() -> None:
    """Flush the standard streams, then every open writable file object, outer wrappers first and
    twice (a gzip writer flushes into a buffered file it wraps): what their finalizers would have
    written at teardown, short of closing them. A file that cannot be flushed is said on stderr, if
    stderr still works."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # a closed or broken standard stream: nowhere to say it
            stream.flush()
    is_file: dict[type, bool] = {}
    files: list[io.IOBase] = []
    for obj in gc.get_objects():
        kind = type(obj)  # not obj.__class__, which an object may compute (or warn about)
        known = is_file.get(kind)
        if known is None:
            known = is_file[kind] = issubclass(kind, io.IOBase)
        if known:
            files.append(obj)
    files.sort(key=_file_layer)
    failed: set[int] = set()
    for _round in range(2):
        for file in files:
            if id(file) in failed:
                continue
            try:
                if not file.closed and file.writable():
                    file.flush()
            except Exception as exc:
                failed.add(id(file))  # said once
                with contextlib.suppress(Exception):
                    print(f"dlrover standby: could not flush {file!r} at exit: {exc}", file=sys.stderr, flush=True)


# runpy runs a folder or zip archive; a frozen runpy (3.11+) names its frames "<frozen runpy>".
_RUNNER_FILES = frozenset({os.path.abspath(__file__), os.path.abspath(runpy.__file__), "<frozen runpy>"})


def _runner_file(filename: str) -> bool:
    return filename in _RUNNER_FILES or os.path.abspath(filename) in _RUNNER_FILES


def _program_traceback(tb: types.TracebackType | None) -> types.TracebackType | None:
    """`tb` without its leading frames of this runner (and of runpy, which runs a folder or zip
    archive): the traceback starts at the program's own first frame, as in a fresh interpreter."""
    while tb is not None and _runner_file(tb.tb_frame.f_code.co_filename):
        tb = tb.tb_next
    return tb


def _report_uncaught(exc: BaseException) -> None:
    """Print an exception the program did not catch as a fresh interpreter would: through
    `sys.excepthook` (the program may have installed its own), starting at the program's frame.

    Without this the traceback would begin with the frames of this module that ran the program. A
    traceback that holds no frame of the program is a fault of this runner, and is printed whole,
    except for a `SyntaxError` in compiling the program, which Python prints without frames.
    """
    tb = _program_traceback(exc.__traceback__)
    if tb is None and not isinstance(exc, SyntaxError):
        tb = exc.__traceback__
    sys.excepthook(type(exc), exc.with_traceback(tb), tb)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
