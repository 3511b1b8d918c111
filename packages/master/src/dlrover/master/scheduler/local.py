"""The local backend: each node's agent is a subprocess of the master on this host.

Each agent runs in its own session (process group), so stopping a node signals the agent and
every process it started; SIGTERM first, SIGKILL after a grace period. `close()` stops and reaps
everything, so nothing outlives the master that exits normally.

A master killed with SIGKILL leaves its agents running on purpose, and a restarted master on the
same state directory adopts them: the backend is a `StatefulCollaborator` whose journaled state
is each node's agent pid and process start time. An adopted agent is not the new master's child,
so it cannot be waited for: it is observed through its pid, checked against the recorded start
time so a reused pid is never mistaken for it (and never signalled), and its exit status is
unknown (observed as failed with no exit code, or stopped when the master stopped it). Stopping it
signals its process group like any other; `close()` waits for it to vanish instead of reaping it.
An agent whose own process has exited is not signalled after an adoption: its group can no longer
be told apart from a new one with the same id.

Memory: a node launched with `resources.memory_mb` runs in a child memory cgroup of its own (see
`dlrover.master.scheduler.cgroups`), joined before the agent's first instruction, so the node's agent and
workers together are limited to it and an OOM kill is recorded by the kernel in the group. The group's record
is the node's `memory_record`; the group is removed once the node's processes are gone (its OOM count is
kept). Where no group can be made, `memory_enforcement` says why and nodes run unlimited. CPU and
accelerators are not enforced here: `largest_node` (this host's CPUs, memory and NVIDIA GPUs) only refuses
what no node here could ever have.

Capacity is counted in slots, one node each: unbounded by default (`slots=None`), else set at
construction, with `set_slots` while the job runs (`dlrover-master capacity`), or by a capacity
file the backend re-reads whenever it changes (a number of slots, or ``unbounded``). A node
launched while every slot is taken waits, observed as pending, and starts when a slot frees;
a node being stopped no longer holds its slot. Lowering the slots below what runs stops nothing
by itself: `capacity` turns negative and the master chooses which nodes give their slots back.
Waiting launches are not journaled: after a master restart the lifecycle's start timeout handles
them like any node that never came.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import attrs
import psutil  # type: ignore[import-untyped, unused-ignore]  # no stubs in the pinned set

from dlrover.autoscale import Resources
from dlrover.common import ConfigError
from dlrover.master.journal import JournalError
from dlrover.master.scheduler.base import (
    MemoryRecord,
    NodeRejectedError,
    NodeSpec,
    ObservedNode,
    ObservedState,
    SchedulerError,
)
from dlrover.master.scheduler.cgroups import MemoryGroup, MemoryGroups

__all__ = ["LOCAL_STATE_FORMAT", "LocalScheduler", "parse_slots"]

_log = logging.getLogger(__name__)

LOCAL_STATE_FORMAT = "dlrover.master.local"
_START_TIME_TOLERANCE_S = 0.05  # start times are read from /proc in clock ticks (1/100 s)
_ADOPTED_POLL_S = 0.05
# Why a command cannot run at all (not there, not runnable), unlike a fork that ran out of resources.
_COMMAND_UNUSABLE = frozenset({errno.ENOENT, errno.EACCES, errno.ENOEXEC, errno.ENOTDIR, errno.EISDIR})


def _start_time(pid: int) -> float | None:
    """The start time of process `pid` (seconds since the epoch), or None when there is none."""
    try:
        return float(psutil.Process(pid).create_time())
    except psutil.Error:
        return None


_NVIDIA_GPUS = Path("/proc/driver/nvidia/gpus")  # one directory per GPU the NVIDIA driver sees


def _this_host() -> Resources:
    """This host's CPUs (those this process may run on), physical memory and NVIDIA GPUs (of any type: the
    driver's directory does not say which in a form worth matching)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    try:
        gpus = sum(1 for _ in _NVIDIA_GPUS.iterdir())
    except OSError:
        gpus = 0
    return Resources(cpu=cpus, memory_mb=int(psutil.virtual_memory().total // (1024 * 1024)), gpu=gpus)


def parse_slots(text: str, *, source: str = "capacity") -> int | None:
    """A number of slots from text: a non-negative integer, or ``unbounded`` (None).

    Raises:
        ConfigError: anything else; the message names the text and where it came from.
    """
    value = text.strip()
    if value.lower() in ("unbounded", "none", "inf"):
        return None
    if not value.isdecimal():
        raise ConfigError(f"{source}: {value[:80]!r} is not a number of slots (a non-negative integer or 'unbounded')")
    return int(value)


def _words(slots: int | None) -> str:
    return "unbounded" if slots is None else str(slots)


def _check_slots(slots: int | None) -> int | None:
    if slots is not None and (isinstance(slots, bool) or not isinstance(slots, int) or slots < 0):
        raise ConfigError(f"slots must be None (unbounded) or a non-negative integer, got {slots!r}")
    return slots


@attrs.define
class _Proc:
    pid: int
    start_time: float
    popen: subprocess.Popen[bytes] | None  # None: adopted from a previous master, not our child
    stop_requested_at: float | None = None
    killed: bool = False
    group: MemoryGroup | None = None  # the node's memory cgroup, until it is removed
    oom_kills: int | None = None  # its OOM record, kept once the group is gone
    limit_mb: int | None = None
    group_path: str = ""

    def exited(self) -> tuple[bool, int | None]:
        """Whether the agent has exited, and its status when known."""
        if self.popen is not None:
            code = self.popen.poll()
            return code is not None, code
        return not self.is_alive_adopted(), None

    def is_alive_adopted(self) -> bool:
        """Whether the adopted agent still runs: same pid, same start time, not a zombie."""
        try:
            proc = psutil.Process(self.pid)
            if abs(proc.create_time() - self.start_time) > _START_TIME_TOLERANCE_S:
                return False  # the pid was reused by another process
            return bool(proc.status() != psutil.STATUS_ZOMBIE)
        except psutil.Error:
            return False


def _export_proc(proc: _Proc) -> dict[str, object]:
    entry: dict[str, object] = {
        "pid": proc.pid,
        "start_time": proc.start_time,
        "stopping": proc.stop_requested_at is not None,
    }
    if proc.limit_mb is not None:
        entry["memory"] = {
            "path": proc.group_path,
            "name": proc.group.name if proc.group is not None else "",
            "limit_mb": proc.limit_mb,
            "removed": proc.group is None,
            "oom_kills": proc.oom_kills,
        }
    return entry


def _import_proc(entry: Mapping[str, object], groups: MemoryGroups | None) -> _Proc:
    """A node's journaled agent; its memory group is adopted only when `groups` recognises it as its own."""
    proc = _Proc(int(entry["pid"]), float(entry["start_time"]), None)  # type: ignore[call-overload, arg-type]
    memory = entry.get("memory")
    if memory is not None:
        if not isinstance(memory, dict):
            raise ValueError(f"memory must be an object, got {memory!r}")
        proc.limit_mb = int(memory["limit_mb"])
        proc.group_path = str(memory["path"])
        kills = memory.get("oom_kills")
        proc.oom_kills = None if kills is None else int(kills)
        if not memory.get("removed"):
            if groups is None:
                _log.warning("memory group %s of an adopted agent is not managed: no memory groups", proc.group_path)
                return proc
            try:
                proc.group = groups.adopt(str(memory["name"]), proc.group_path, proc.limit_mb)
            except OSError as exc:
                _log.warning("memory group %s of an adopted agent is not managed: %s", proc.group_path, exc)
    return proc


class LocalScheduler:
    """Agents as local subprocesses.

    Args:
        command: argv of the agent; the node's environment tells it who it is.
        stop_grace_s: wait between SIGTERM and SIGKILL.
        log_dir: each node's stdout and stderr go to `<log_dir>/node-<id>.log` (0600, in a 0700
            directory); discarded when None.
        monotonic: time source for the grace period (injectable for tests).
        memory_groups: where nodes' memory cgroups are made (`detect_memory_groups()` in the master);
            None enforces no memory limit (and says so in `memory_enforcement`).
        host_resources: what this host has (its CPUs, memory and NVIDIA GPUs when None).
        slots: how many nodes may run at once (None: unbounded).
        capacity_file: a file holding the slots (see `parse_slots`), re-read whenever it changes;
            it overrides `slots` once read. A file with bad content is logged and ignored: the
            slots stay as they were.
    """

    name = "local"
    relaunches_nodes = True
    state_name = "local_scheduler"

    def __init__(
        self,
        command: Sequence[str],
        *,
        stop_grace_s: float = 5.0,
        log_dir: str | os.PathLike[str] | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        memory_groups: MemoryGroups | None = None,
        host_resources: Resources | None = None,
        slots: int | None = None,
        capacity_file: str | os.PathLike[str] | None = None,
    ) -> None:
        if not command:
            raise ConfigError("the local backend needs an agent command, got an empty one")
        if stop_grace_s < 0:
            raise ConfigError(f"stop_grace_s must be zero or positive, got {stop_grace_s!r}")
        self._command = list(command)
        self._grace = stop_grace_s
        self._log_dir = Path(log_dir) if log_dir is not None else None
        self._now = monotonic
        self._lock = threading.Lock()
        self._procs: dict[int, _Proc] = {}
        self._host = socket.gethostname()
        self._closed = False
        self._version = 0
        self._groups = memory_groups
        self._host_resources = host_resources or _this_host()
        self._slots = _check_slots(slots)
        self._waiting: dict[int, NodeSpec] = {}  # launched while every slot was taken, in order
        self._stopped_waiting: set[int] = set()
        self._spawn_failed: set[int] = set()
        self._capacity_file = Path(capacity_file) if capacity_file is not None else None
        self._capacity_seen: tuple[int, int] | None = None  # (mtime_ns, size) last read
        if self._capacity_file is not None:
            with self._lock:
                self._read_capacity_file()

    # ---------------------------------------------------------------- capacity

    @property
    def slots(self) -> int | None:
        """How many nodes may run at once (None: unbounded)."""
        with self._lock:
            self._read_capacity_file()
            return self._slots

    def set_slots(self, slots: int | None) -> None:
        """Change the slots while the job runs; waiting launches start when they fit (next `observe`).

        Raises:
            ConfigError: not None or a non-negative integer; nothing changed.
        """
        checked = _check_slots(slots)
        with self._lock:
            if checked != self._slots:
                _log.info("local backend capacity: %s -> %s slot(s)", _words(self._slots), _words(checked))
            self._slots = checked

    def capacity(self) -> int | None:
        """Free slots (negative: more nodes hold slots than there are); None when unbounded."""
        with self._lock:
            self._read_capacity_file()
            if self._slots is None:
                return None
            return self._slots - self._held() - len(self._waiting)

    def _held(self) -> int:
        return sum(1 for p in self._procs.values() if p.stop_requested_at is None and not p.exited()[0])

    def _read_capacity_file(self) -> None:
        """Re-read the capacity file if it changed (lock held); bad content changes nothing."""
        path = self._capacity_file
        if path is None:
            return
        try:
            info = path.stat()
        except FileNotFoundError:
            return  # not written yet: the slots stay as they are
        except OSError as exc:
            _log.error("capacity file %s cannot be read: %s; the slots stay %s", path, exc, _words(self._slots))
            return
        seen = (info.st_mtime_ns, info.st_size)
        if seen == self._capacity_seen:
            return
        self._capacity_seen = seen
        try:
            slots = parse_slots(path.read_text(encoding="utf-8"), source=f"capacity file {path}")
        except (OSError, UnicodeDecodeError, ConfigError) as exc:
            _log.error("%s; the slots stay %s", exc, _words(self._slots))
            return
        if slots != self._slots:
            _log.info("capacity file %s: %s -> %s slot(s)", path, _words(self._slots), _words(slots))
        self._slots = slots

    def _start_waiting(self) -> None:
        """Start waiting launches while slots are free (lock held)."""
        while self._waiting and not self._closed:
            if self._slots is not None and self._held() >= self._slots:
                return
            node_id = next(iter(self._waiting))
            spec = self._waiting.pop(node_id)
            try:
                self._spawn(spec)
            except SchedulerError as exc:
                _log.error("%s", exc)
                self._spawn_failed.add(node_id)  # observed as failed: the master decides

    @property
    def host(self) -> str:
        """The host every node runs on (see `SingleHost`)."""
        return self._host

    @property
    def memory_enforcement(self) -> str:
        """A sentence saying how node memory is limited here, or why it is not."""
        if self._groups is None:
            return "memory limits are not enforced: the local backend was built without memory groups"
        return self._groups.describe()

    @property
    def enforces_memory(self) -> bool:
        """Whether a node's memory request becomes a limit the kernel enforces."""
        return self._groups is not None and self._groups.usable

    def largest_node(self) -> Resources:
        """The most one node can have here: this host's CPUs, memory and GPUs."""
        return self._host_resources

    def memory_record(self, node_id: int) -> MemoryRecord | None:
        """The node's memory limit and the kernel's count of OOM kills in its group; None without a group."""
        with self._lock:
            proc = self._procs.get(node_id)
            if proc is None or proc.limit_mb is None:
                return None
            kills = self._read_kills(proc)
            return MemoryRecord(proc.limit_mb, kills, proc.group_path)

    def _read_kills(self, proc: _Proc) -> int | None:
        if proc.group is not None and self._groups is not None:
            kills = self._groups.oom_kills(proc.group)
            if kills is not None:
                proc.oom_kills = kills
        return proc.oom_kills

    def _release_group(self, proc: _Proc) -> bool:
        """Remove the node's group once its processes are gone, keeping its OOM record; True when none is left."""
        if proc.group is None or self._groups is None:
            return True
        self._read_kills(proc)
        try:
            gone = self._groups.remove(proc.group)
        except OSError as exc:
            _log.warning("memory group %s cannot be removed: %s", proc.group.path, exc)
            return False
        if gone:
            proc.group = None
            self._version += 1
        return gone

    def _join_group(self, spec: NodeSpec) -> tuple[MemoryGroup | None, list[str]]:
        """The node's memory group (when it asks for memory and groups work here) and the command to run."""
        memory = spec.resources.memory_mb if spec.resources is not None else 0
        if not memory or self._groups is None or not self._groups.usable:
            return None, list(self._command)
        name = f"dlrover-{os.getpid()}-node-{spec.node_id}"
        try:
            group = self._groups.create(name, memory)
        except (OSError, ValueError) as exc:
            raise SchedulerError(f"cannot make the memory group of node {spec.node_id} ({memory} MiB): {exc}") from exc
        return group, self._groups.join_argv(group, self._command)

    def launch(self, spec: NodeSpec) -> None:
        """Start the agent of `spec` in a new session.

        Raises:
            SchedulerError: the node was launched before, this host is avoided, the backend is
                closed, or the command cannot be started.
        """
        with self._lock:
            if self._closed:
                raise SchedulerError(f"cannot launch node {spec.node_id}: the local backend is closed")
            if spec.node_id in self._procs:
                raise SchedulerError(f"node {spec.node_id} was already launched")
            if spec.node_id in self._waiting or spec.node_id in self._stopped_waiting | self._spawn_failed:
                raise SchedulerError(f"node {spec.node_id} was already launched")
            if self._host in spec.avoid_hosts:
                # Every node of this backend runs here: a relaunch would be refused alike (the master
                # avoids no single host, see `JobLifecycle`'s `single_host`; this guards direct use).
                raise NodeRejectedError(
                    f"cannot launch node {spec.node_id}: this host ({self._host}) is avoided, and every node of the "
                    "local backend runs on it"
                )
            self._read_capacity_file()
            if self._waiting or (self._slots is not None and self._held() >= self._slots):
                # Every slot is taken: the node waits (pending) for one, as a pod waits for a node.
                self._waiting[spec.node_id] = spec
                return
            self._spawn(spec)

    def _spawn(self, spec: NodeSpec) -> None:
        """Start the agent process of `spec` (lock held), in its memory group when it has one."""
        env = {**os.environ, **spec.env}
        group, command = self._join_group(spec)
        try:
            if self._log_dir is not None:
                # Private like the rest of the state directory: agents' logs may hold secrets.
                self._log_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
                log_fd = os.open(
                    self._log_dir / f"node-{spec.node_id}.log",
                    os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC,
                    0o600,
                )
                with open(log_fd, "ab") as log:
                    os.fchmod(log_fd, 0o600)  # a log an older master created 0644
                    popen = subprocess.Popen(
                        command, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                        start_new_session=True,
                    )  # fmt: skip
            else:
                popen = subprocess.Popen(
                    command, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL, start_new_session=True,
                )  # fmt: skip
        except OSError as exc:
            if group is not None and self._groups is not None:
                try:
                    if not self._groups.remove(group):
                        _log.warning("memory group %s of a node that did not start still holds processes", group.path)
                except OSError as remove_exc:  # the failed start is the error to report, not the cleanup's
                    _log.warning(
                        "memory group %s of a node that did not start cannot be removed: %s", group.path, remove_exc
                    )
            message = f"cannot start node {spec.node_id} ({self._command[0]!r}): {exc}"
            if exc.errno in _COMMAND_UNUSABLE:
                # Every node starts with the same command: a relaunch would fail alike, in milliseconds.
                raise NodeRejectedError(f"{message}; every node of this backend starts with this command") from exc
            raise SchedulerError(message) from exc
        # Our unreaped child: its pid cannot be reused, so its start time is its own.
        started = _start_time(popen.pid)
        self._procs[spec.node_id] = _Proc(
            popen.pid,
            started if started is not None else 0.0,
            popen,
            group=group,
            limit_mb=None if group is None else group.limit_mb,
            group_path="" if group is None else group.path,
        )
        self._version += 1

    def _signal(self, proc: _Proc, sig: signal.Signals) -> None:
        if proc.popen is None and not proc.is_alive_adopted():
            return  # not ours any more: the pid may belong to someone else now
        with contextlib.suppress(ProcessLookupError, PermissionError):  # the group is gone already
            os.killpg(proc.pid, sig)

    def stop(self, node_id: int) -> None:
        """SIGTERM the node's process group; `observe` escalates to SIGKILL after the grace."""
        with self._lock:
            if self._waiting.pop(node_id, None) is not None:
                self._stopped_waiting.add(node_id)  # never started: nothing to signal
                return
            proc = self._procs.get(node_id)
            if proc is None or proc.stop_requested_at is not None:
                return
            proc.stop_requested_at = self._now()
            self._version += 1
            if not proc.exited()[0]:
                self._signal(proc, signal.SIGTERM)
            else:
                # The agent is gone, but what it started may not be.
                self._signal(proc, signal.SIGKILL)

    def kill(self, node_id: int) -> None:
        """SIGKILL the node's process group now, without a grace: for a node with nothing worth saving (a PS job's
        chief whose parameter server, and with it the variables, is gone). Idempotent; a no-op for an unknown id."""
        with self._lock:
            if self._waiting.pop(node_id, None) is not None:
                self._stopped_waiting.add(node_id)
                return
            proc = self._procs.get(node_id)
            if proc is None or proc.killed:
                return
            if proc.stop_requested_at is None:
                proc.stop_requested_at = self._now()
            proc.killed = True
            self._version += 1
            self._signal(proc, signal.SIGKILL)

    def _state(self, proc: _Proc) -> ObservedNode:
        exited, code = proc.exited()
        node_id = -1
        if not exited:
            stopping = proc.stop_requested_at
            if stopping is not None and not proc.killed and self._now() - stopping >= self._grace:
                _log.warning(
                    "agent pid %d did not stop within the %.1f s grace after SIGTERM: SIGKILL", proc.pid, self._grace
                )
                self._signal(proc, signal.SIGKILL)
                proc.killed = True
            return ObservedNode(node_id, ObservedState.RUNNING, None, self._host)
        self._release_group(proc)
        if proc.stop_requested_at is not None:
            return ObservedNode(node_id, ObservedState.STOPPED, code, self._host)
        # An adopted agent's status is unknown (None): it is not ours to wait for.
        state = ObservedState.SUCCEEDED if code == 0 else ObservedState.FAILED
        return ObservedNode(node_id, state, code, self._host)

    def observe(self) -> Mapping[int, ObservedNode]:
        """Poll every agent (and escalate stops past their grace period); start waiting launches
        that fit now (the capacity file is re-read first)."""
        with self._lock:
            self._read_capacity_file()
            self._start_waiting()
            seen = {nid: attrs.evolve(self._state(p), node_id=nid) for nid, p in self._procs.items()}
            seen.update({nid: ObservedNode(nid, ObservedState.PENDING) for nid in self._waiting})
            seen.update({nid: ObservedNode(nid, ObservedState.STOPPED) for nid in self._stopped_waiting})
            seen.update({nid: ObservedNode(nid, ObservedState.FAILED) for nid in self._spawn_failed})
            return seen

    def pid(self, node_id: int) -> int | None:
        """The agent's process id (its process group id too), for diagnostics and tests."""
        with self._lock:
            proc = self._procs.get(node_id)
            return None if proc is None else proc.pid

    def adopted(self) -> frozenset[int]:
        """The nodes whose agents were adopted from a previous master (not children of this one)."""
        with self._lock:
            return frozenset(nid for nid, p in self._procs.items() if p.popen is None)

    # StatefulCollaborator: the agents' identities survive a master restart.

    def export_state(self) -> tuple[int, str]:
        """Every launched node's agent pid, start time and whether it was told to stop."""
        with self._lock:
            nodes = {str(nid): _export_proc(p) for nid, p in sorted(self._procs.items())}
            doc = {"format": LOCAL_STATE_FORMAT, "version": 2, "nodes": nodes}
            return self._version, json.dumps(doc, separators=(",", ":"))

    def import_state(self, version: int, data: str) -> None:
        """Adopt the agents a previous master launched (before anything is launched here).

        An agent that still runs (same pid and start time) is observed as running and stopped
        like any other; one that is gone is observed as failed (or stopped, if it was told to
        stop), with no exit status. Their memory groups (version 2 documents) are managed as this
        master's own; version 1 documents (before memory groups) are read as nodes without one.

        Raises:
            JournalError: the state is corrupt; nothing changed.
        """
        try:
            doc = json.loads(data)
            if not isinstance(doc, dict) or doc.get("format") != LOCAL_STATE_FORMAT or doc.get("version") not in (1, 2):
                raise ValueError(f"not a {LOCAL_STATE_FORMAT!r} version 1 or 2 document")
            adopted = {int(nid): _import_proc(entry, self._groups) for nid, entry in dict(doc["nodes"]).items()}
            stopping = {int(nid) for nid, entry in dict(doc["nodes"]).items() if entry.get("stopping")}
        except (KeyError, TypeError, ValueError) as exc:
            raise JournalError(f"local scheduler state: {exc}") from exc
        with self._lock:
            now = self._now()
            for nid, proc in adopted.items():
                if nid in self._procs:
                    continue  # launched by this master already: it is its own
                if nid in stopping:
                    proc.stop_requested_at = now  # the grace period starts again
                self._procs[nid] = proc
            self._version = max(self._version, version)

    def close(self) -> None:
        """SIGTERM every agent's group, SIGKILL after the grace, and reap them all (adopted ones:
        wait until they are gone, for the grace and then once more after SIGKILL)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._stopped_waiting.update(self._waiting)
            self._waiting.clear()
            procs = list(self._procs.values())
            for proc in procs:
                if proc.stop_requested_at is None and not proc.exited()[0]:
                    proc.stop_requested_at = self._now()
        for proc in procs:
            if not proc.exited()[0]:
                self._signal(proc, signal.SIGTERM)
        deadline = self._now() + self._grace
        for proc in procs:
            if proc.popen is None:
                self._close_adopted(proc, deadline)
                continue
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.popen.wait(timeout=max(deadline - self._now(), 0.0))
            # SIGKILL the group even if the agent exited: its children must not survive it.
            self._signal(proc, signal.SIGKILL)
            proc.popen.wait()
        for proc in procs:
            self._close_group(proc)

    def _close_group(self, proc: _Proc) -> None:
        """Remove the node's memory group, killing whatever is left in it (a worker that left the agent's
        process group): every member is this node's process, so nothing else is touched."""
        group, groups = proc.group, self._groups
        if group is None or groups is None:
            return
        deadline = self._now() + max(self._grace, 1.0)
        while True:
            with self._lock:
                if self._release_group(proc):
                    return
            if self._now() >= deadline:
                _log.warning("memory group %s still holds processes %s", group.path, groups.pids(group))
                return
            for pid in groups.pids(group):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(_ADOPTED_POLL_S)

    def _close_adopted(self, proc: _Proc, deadline: float) -> None:
        # Not our child: no waitpid. Poll until it is gone (its parent, init or a subreaper,
        # reaps it), SIGKILL after the grace, and give it one more grace to vanish.
        while proc.is_alive_adopted() and self._now() < deadline:
            time.sleep(_ADOPTED_POLL_S)
        if proc.is_alive_adopted():
            self._signal(proc, signal.SIGKILL)
            last = self._now() + max(self._grace, 1.0)
            while proc.is_alive_adopted() and self._now() < last:
                time.sleep(_ADOPTED_POLL_S)
