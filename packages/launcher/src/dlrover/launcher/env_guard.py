"""Whether a warm standby can honour an environment variable the worker program sets.

A standby worker (`dlrover.launcher._standby`) imported its prewarmed modules (torch by default)
before the worker's program ran. A fresh ``python -u SCRIPT`` imports them only when the program
does, so anything the program writes to ``os.environ`` before that import reaches them at load
time (``OMP_NUM_THREADS`` for the OpenMP runtime torch loads, for example). In a standby it comes
too late. This module decides, for each write, what the standby must do about it:

- ``IGNORE``: the write cannot make a difference. The program has already imported every
  prewarmed module itself (a fresh start would not see it at import either), the value is the
  one the modules were imported with, or no prewarmed module the program has yet to import reads
  the name while it imports (`import_time_sensitive`).
- ``REEXEC``: the standby replaces itself with a fresh interpreter running the same program
  (same pid, the worker's original environment), which then makes the write again before its
  own import. Only while the program has done nothing a second run would repeat.
- ``WARN``: as ``REEXEC``, but the program already had a side effect (`side_effect_of`: a file
  opened for writing, a socket, a child process, a thread), so a second run is not safe; the
  standby says on stderr that the variable does not reach the prewarmed modules.

Everything here is pure: `EnvGuard` is fed events and returns decisions; the standby owns the
audit hook, the import wrappers and the ``execve``.
"""

from __future__ import annotations

import enum
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import PurePath

import attrs

from dlrover.launcher.env_names import PER_ROUND_ENV_VARS

__all__ = [
    "EnvGuard",
    "EnvWriteAction",
    "EnvWriteDecision",
    "decide_env_write",
    "also_imports",
    "import_time_sensitive",
    "reads_environment_at_import",
    "side_effect_of",
]

# The worker contract the agent hands a standby when it is taken: the standby cannot know a
# worker's rank, round or master while it imports, whichever module it imports, so these names
# are set for the first time after the import in every standby by design.
_CONTRACT_NAMES = frozenset(PER_ROUND_ENV_VARS) | {"ROLE_NAME"}
_CONTRACT_PREFIXES = ("TORCHELASTIC_", "DLROVER_")

# Names torch 2.13 reads only when the feature is used, never while `import torch` runs. Checked
# against torch 2.13's Python sources (every read of these names is inside a function; module-level
# mentions are only the names as constants), against a trace of every name the CPU build reads while
# `import torch` runs (os.environ lookups, and getenv from its native libraries through an
# LD_PRELOAD shim: none of these, nor MASTER_ADDR/MASTER_PORT; the CUDA build was not at hand to
# trace), and torch's documented lazy initialisation: the CUDA runtime reads CUDA_VISIBLE_DEVICES /
# CUDA_DEVICE_ORDER when torch first initialises CUDA, the CUDA caching allocator reads
# PYTORCH_CUDA_ALLOC_CONF on its first allocation, NCCL and ProcessGroupNCCL read NCCL_* /
# TORCH_NCCL_* when a process group is created, gloo reads GLOO_* likewise. TOKENIZERS_PARALLELISM,
# HF_*, TRANSFORMERS_* and WANDB_* appear nowhere in torch. They say nothing of other modules
# (transformers reads HF_HOME while it imports), for which every other name is sensitive.
_TORCH_LAZY_NAMES = frozenset(
    {"CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "PYTORCH_CUDA_ALLOC_CONF", "TOKENIZERS_PARALLELISM"}
)
_TORCH_LAZY_PREFIXES = ("NCCL_", "TORCH_NCCL_", "GLOO_", "HF_", "TRANSFORMERS_", "WANDB_")
# Modules of ours that read no environment variable while they are imported, nor does what they
# import beyond torch (attrs, isal, hmac, secrets): checked by a trace of os.environ and of the
# native getenv (an LD_PRELOAD shim) while importing them after torch. Exact names: other parts
# of dlrover.flashckpt import more (its Hugging Face adapter imports transformers).
# `test_imports` keeps the os.environ half true as the code changes. The checkpointer module (what
# `FlashCheckpointer` and its loads import) was traced the same way; beyond the client's, it
# imports faulthandler, which reads none either.
_READS_NOTHING_AT_IMPORT = frozenset(
    {"dlrover.flashckpt", "dlrover.flashckpt.client", "dlrover.flashckpt.checkpointer"}
)
# What importing a module of ours loads that reads the environment: a standby that prewarmed the
# module had torch imported too, and a program that imports the module first imports torch with
# it (the module is then already loaded, so the guard never sees that nested import).
# `test_imports` checks it.
_ALSO_IMPORTS: Mapping[str, tuple[str, ...]] = {
    "dlrover.flashckpt.client": ("torch",),
    "dlrover.flashckpt.checkpointer": ("torch",),
}


def _covers(prewarmed: str, imported: str) -> bool:
    return imported == prewarmed or imported.startswith(prewarmed + ".")


def _reads_at_import(name: str, module: str) -> bool:
    if module in _READS_NOTHING_AT_IMPORT:
        return False
    if _covers("torch", module):
        return not (name in _TORCH_LAZY_NAMES or name.startswith(_TORCH_LAZY_PREFIXES))
    return True


def reads_environment_at_import(module: str) -> bool:
    """Whether the code of `module` may read any environment variable while it is imported.

    False only for the modules of ours checked to read none (``dlrover.flashckpt``,
    ``dlrover.flashckpt.client`` and ``dlrover.flashckpt.checkpointer``); any other module may.
    What a module imports is judged as a module of its own (`also_imports`).
    """
    return module not in _READS_NOTHING_AT_IMPORT


def also_imports(module: str) -> tuple[str, ...]:
    """The modules that may read the environment which importing `module` of ours loads too.

    ``dlrover.flashckpt.client`` and ``dlrover.flashckpt.checkpointer`` import torch; for any
    other module nothing is known (its
    import of a prewarmed module is seen when it runs, as the standby's guard sees every import).
    """
    return _ALSO_IMPORTS.get(module, ())


def import_time_sensitive(name: str, modules: Sequence[str]) -> bool:
    """Whether one of `modules` may read the variable `name` while it is imported.

    Conservative: a module may read every name, except the worker contract the agent sets when a
    standby is taken (``RANK``, ``MASTER_ADDR``, ``TORCHELASTIC_*``, ``DLROVER_*``, ...); torch
    and its parts may read every name but a short list torch 2.13 reads only when used
    (``CUDA_VISIBLE_DEVICES``, ``CUDA_DEVICE_ORDER``, ``PYTORCH_CUDA_ALLOC_CONF``, ``NCCL_*``,
    ``TORCH_NCCL_*``, ``GLOO_*``, ``TOKENIZERS_PARALLELISM``, ``HF_*``, ``TRANSFORMERS_*``,
    ``WANDB_*``); ``dlrover.flashckpt``, its client and its checkpointer read none.

    Args:
        name: the environment variable.
        modules: the prewarmed modules whose import is still ahead of a fresh run of the program.
    """
    if name in _CONTRACT_NAMES or name.startswith(_CONTRACT_PREFIXES):
        return False
    return any(_reads_at_import(name, module) for module in modules)


class EnvWriteAction(enum.Enum):
    """What a standby does about one environment write of the program it runs."""

    IGNORE = "ignore"
    REEXEC = "reexec"
    WARN = "warn"


@attrs.frozen
class EnvWriteDecision:
    """A decision about one environment write, and why.

    Attributes:
        action: what to do.
        name: the variable written.
        reason: a sentence saying why, fit for a log line.
    """

    action: EnvWriteAction
    name: str
    reason: str


def decide_env_write(
    name: str,
    value: str | None,
    import_value: str | None,
    *,
    prewarmed: Sequence[str],
    pending: Iterable[str],
    side_effect: str | None,
) -> EnvWriteDecision:
    """Decide what a standby does when its program sets or removes the variable `name`.

    Args:
        name: the variable.
        value: its new value; None when it is removed.
        import_value: its value while the prewarmed modules were imported; None when unset then.
        prewarmed: the modules the standby imported ahead of time.
        pending: the prewarmed modules the program has not imported itself yet.
        side_effect: the first thing the program did that a second run would repeat, or None.
    """
    waiting = sorted(pending)
    if not waiting:
        return EnvWriteDecision(
            EnvWriteAction.IGNORE,
            name,
            f"{name} changed after the program imported {', '.join(prewarmed)} itself; a fresh start would not "
            "see it at import either",
        )
    if value == import_value:
        return EnvWriteDecision(
            EnvWriteAction.IGNORE, name, f"{name} already had this value when {', '.join(prewarmed)} was imported"
        )
    if not import_time_sensitive(name, waiting):
        return EnvWriteDecision(
            EnvWriteAction.IGNORE,
            name,
            f"{name} is not read while {', '.join(waiting)} is imported",
        )
    what = "set" if value is not None else "removed"
    if side_effect is not None:
        return EnvWriteDecision(
            EnvWriteAction.WARN,
            name,
            f"{name} was {what} before the program imported {', '.join(waiting)}, but this warm standby worker "
            f"imported {', '.join(prewarmed)} before {name} was {what}, so it may not take effect; it cannot "
            f"restart as a fresh interpreter because the program already {side_effect}. Run dlrover-run with "
            "--prewarm none to start workers fresh",
        )
    return EnvWriteDecision(
        EnvWriteAction.REEXEC,
        name,
        f"{name} was {what} before the program imported {', '.join(waiting)}, which this warm standby worker "
        "imported earlier; restarting as a fresh interpreter (same pid) so that the import sees it",
    )


_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
_PROCESS_EVENTS = {
    "subprocess.Popen": "started a child process",
    "os.system": "started a child process",
    "os.fork": "forked",
    "os.forkpty": "forked",
    "os.posix_spawn": "started a child process",
    "os.spawn": "started a child process",
    "os.kill": "sent a signal",
    "os.killpg": "sent a signal",
    "signal.pthread_kill": "sent a signal",
    "socket.__new__": "opened a socket",
    "sqlite3.connect": "opened a database",
}
_FILE_EVENTS = frozenset(
    {
        "os.remove",
        "os.rename",
        "os.rmdir",
        "os.mkdir",
        "os.link",
        "os.symlink",
        "os.truncate",
        "os.chmod",
        "os.chown",
        "os.utime",
        "os.setxattr",
        "os.removexattr",
        "shutil.copyfile",
        "shutil.copymode",
        "shutil.copystat",
        "shutil.copytree",
        "shutil.move",
        "shutil.rmtree",
        "shutil.chown",
        "shutil.make_archive",
        "shutil.unpack_archive",
    }
)
# mmap's ACCESS_READ and ACCESS_COPY never write to the mapped file.
_MMAP_READ_ONLY_ACCESS = (1, 3)


def _bytecode_cache(path: object, pycache_prefix: str | None) -> bool:
    """Whether `path` is bytecode that importing writes, which a second run rewrites harmlessly: in a
    ``__pycache__`` folder, or anywhere under `pycache_prefix` (``PYTHONPYCACHEPREFIX``), where
    imports write their bytecode and the folders that mirror the sources instead."""
    if not isinstance(path, (str, bytes, os.PathLike)):
        return False  # a file descriptor: nothing says where it points
    where = PurePath(os.fsdecode(path))
    if "__pycache__" in where.parts:
        return True
    return pycache_prefix is not None and where.is_absolute() and where.is_relative_to(pycache_prefix)


def side_effect_of(event: str, args: Sequence[object], pycache_prefix: str | None = None) -> str | None:
    """What an audit event did that a second run of the program would repeat, or None.

    Counted: opening a file for writing (not bytecode, which imports write and a second run
    rewrites harmlessly), creating, renaming, removing or changing files, a writable shared file
    mapping, sockets, child processes, signals to processes, databases.

    Args:
        event: the audit event's name (see ``sys.addaudithook``).
        args: its arguments.
        pycache_prefix: the interpreter's ``sys.pycache_prefix``: where set, imports write bytecode
            under it rather than into ``__pycache__`` folders.

    Returns:
        A phrase such as ``"opened '/tmp/x' for writing"``, or None when the event is harmless.
    """
    if event == "open" and len(args) >= 3:
        return _opened_for_writing(args[0], args[1], args[2], pycache_prefix)
    if event in _PROCESS_EVENTS:
        return _PROCESS_EVENTS[event]
    if event in _FILE_EVENTS:
        if not args:
            return f"changed the file system ({event})"
        return None if _bytecode_cache(args[0], pycache_prefix) else f"changed the file system ({event} {args[0]!r})"
    if event == "mmap.__new__" and len(args) >= 3 and args[0] != -1 and args[2] not in _MMAP_READ_ONLY_ACCESS:
        return "mapped a file for writing"
    return None


def _opened_for_writing(path: object, mode: object, flags: object, pycache_prefix: str | None) -> str | None:
    writing = (isinstance(mode, str) and any(c in mode for c in "wax+")) or (
        isinstance(flags, int) and bool(flags & _WRITE_FLAGS)
    )
    if writing and not _bytecode_cache(path, pycache_prefix):
        return f"opened {path!r} for writing"
    return None


class EnvGuard:
    """The standby's guard over its program's environment writes, as a pure state machine.

    Fed the program's imports, its side effects and its environment writes, in order; answers
    each write with an `EnvWriteDecision`. A name already warned about is not warned about again,
    and after a ``REEXEC`` decision the guard answers ``IGNORE`` (the process is being replaced).

    Args:
        prewarmed: the modules the standby imported ahead of time.
        import_env: the environment they were imported under.
    """

    def __init__(self, prewarmed: Sequence[str], import_env: Mapping[str, str]) -> None:
        self.prewarmed = tuple(prewarmed)
        self._import_env = dict(import_env)
        # What the prewarmed modules imported with them was prewarmed too.
        self._pending = {*self.prewarmed, *(m for p in self.prewarmed for m in also_imports(p))}
        self._side_effect: str | None = None
        self._warned: set[str] = set()
        self._reexec: EnvWriteDecision | None = None

    @property
    def pending(self) -> frozenset[str]:
        """The prewarmed modules (and what they imported, `also_imports`) the program has not
        imported itself yet."""
        return frozenset(self._pending)

    @property
    def settled(self) -> bool:
        """Whether no later write can matter: every prewarmed module that may read one was imported
        by the program, or a re-exec is due."""
        return self._reexec is not None or not any(reads_environment_at_import(m) for m in self._pending)

    @property
    def side_effect(self) -> str | None:
        """The program's first side effect, if it had one."""
        return self._side_effect

    @property
    def reexec(self) -> EnvWriteDecision | None:
        """The write that made the guard decide to re-exec, if any."""
        return self._reexec

    def on_import(self, name: str) -> None:
        """The program imported module `name` (``import a.b`` imports ``a`` first, so it covers
        ``a``; importing a module covers what it imports, `also_imports`)."""
        imported = (name, *also_imports(name))
        self._pending = {m for m in self._pending if not any(_covers(m, i) for i in imported)}

    def on_side_effect(self, what: str) -> None:
        """The program did something a second run would repeat (`side_effect_of`)."""
        if self._side_effect is None:
            self._side_effect = what

    def on_env_write(self, name: str, value: str | None) -> EnvWriteDecision:
        """The program set `name` to `value` (None: removed it). Returns what to do."""
        if self._reexec is not None:
            return EnvWriteDecision(EnvWriteAction.IGNORE, name, "the standby is already restarting fresh")
        decision = decide_env_write(
            name,
            value,
            self._import_env.get(name),
            prewarmed=self.prewarmed,
            pending=self._pending,
            side_effect=self._side_effect,
        )
        if decision.action is EnvWriteAction.WARN:
            if name in self._warned:
                return EnvWriteDecision(EnvWriteAction.IGNORE, name, f"{name}: already warned about")
            self._warned.add(name)
        elif decision.action is EnvWriteAction.REEXEC:
            self._reexec = decision
        return decision
