"""`SaverHost`: the node's savers, run inside the ``dlrover-run`` agent.

A detached saver (`dlrover.flashckpt.saver_main`) is started by the first training process and
fixes its world size at start; it cannot follow an elastic resize and is left behind when the
agent is killed. Hosted in the agent instead, the savers live exactly as long as the agent: they
outlive crashed training processes (whose snapshots they persist), follow a resize (a request with
a new world size replaces the run's saver), and are stopped, with their shared memory removed,
when the agent exits.

The agent starts one `SaverHost` and names its socket to every worker in the environment variable
`HOST_SOCKET_ENV_VAR`. A `FlashCheckpointer` that finds it asks the host for its run's saver
(`request_saver`) and connects to the socket in the answer, as it would to a detached saver.

Wire: the length-prefixed JSON frames of `dlrover.flashckpt.channel`, on a Unix socket created
0600. A connection may carry several requests; each gets one answer.

Stager to host:

==========  ================================================================================
``ensure``  ``job_id``, ``run_id`` (ids as in `StagerConfig`), ``world_size`` (int >= 1),
            ``storage_dir`` (absolute path, or an fsspec URL such as ``s3://bucket/prefix``),
            ``coordinator`` (bool: this node's saver moves the tracker), ``shm_dir``
            (absolute path of an existing directory), ``num_slots`` (int >= 2), optional
            ``storage_options`` (a JSON object: a URL's fsspec options, or a POSIX
            directory's write settings, see `StorageLocation`), optional
            ``keep_last`` and ``keep_every`` (ints >= 0: the job's retention; 0 and 0: the
            host's): start, reuse or replace the run's saver
==========  ================================================================================

Host to stager:

==========  ================================================================================
``saver``   ``path`` (the saver's socket), ``saver_pid`` (the agent's pid), ``action``
            (``started``, ``reused`` or ``replaced``), ``reason``
``error``   ``reason``: the request was refused and nothing changed (a bad field, a
            different ``storage_dir``/``shm_dir``/``num_slots`` than the running saver of the
            run, too many runs) or the saver could not be started
==========  ================================================================================

A run's saver is replaced when a request names another ``world_size`` or ``coordinator``: after
a resize every new worker asks with the new values. The new saver is started first and takes the
run's socket over (an atomic rename); only then is the old one retired: from that moment it never
commits (its queued persists may still write rank files) and it is stopped, without removing
memory, in the background, so a slow persist never delays the answer. If the new saver cannot
start, the old one keeps serving (and committing) and the answer is an ``error`` saying so.

A ``shutdown`` a stager sends its saver (``close(job_end=True)``) stops that saver and removes the
run's memory, as a detached saver would (requests for the run are refused until it is gone).
There is no idle exit: the agent calls `SaverHost.stop` when it exits.

This module never imports torch: the agent loads it.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import socket
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import attrs

from dlrover.common import Clock, ConfigError, SystemClock, pid_scope
from dlrover.common.validators import non_negative_finite, non_negative_int, positive, positive_int
from dlrover.flashckpt.channel import ChannelError, listen_owner_only, recv_message, send_message, unix_address
from dlrover.flashckpt.ckpt_format import step_dir
from dlrover.flashckpt.commit import RetentionPolicy
from dlrover.flashckpt.errors import FlashCkptError, SaverUnavailableError
from dlrover.flashckpt.events import EventLog, FlashEvent
from dlrover.flashckpt.host_runs import EnsureAction, EnsureDecision, HostRuns, SaverRequest
from dlrover.flashckpt.job_env import HOST_SOCKET_ENV_VAR
from dlrover.flashckpt.pacing import default_persist_bandwidth_mb_s
from dlrover.flashckpt.saver import Saver, SaverConfig
from dlrover.flashckpt.segment import (
    DEFAULT_SHM_DIR,
    SEGMENT_PREFIX,
    owner_record_alive,
    remove_run,
    run_ranks,
    segment_path,
    write_owner,
)
from dlrover.flashckpt.storage.base import Storage
from dlrover.flashckpt.storage.location import StorageLocation

__all__ = [
    "HOST_SOCKET_ENV_VAR",
    "EnsureAction",
    "EnsureDecision",
    "HostedCommit",
    "HostedSaver",
    "HostRuns",
    "SaverHost",
    "SaverHostConfig",
    "SaverRequest",
    "host_socket_path",
    "remove_dead_hosts",
    "request_saver",
]


_HOST_NAME_RE = re.compile(re.escape(SEGMENT_PREFIX) + r"([A-Za-z0-9_-]{1,64})\.([A-Za-z0-9_-]{1,64})\.sock$")


_HOST_RECORD_KIND = "saver-host"


def remove_dead_hosts(shm_dir: str | Path) -> list[Path]:
    """Remove the socket and owner record of every saver host in `shm_dir` whose agent is gone.

    A SIGKILLed agent leaves them behind; the next host on the node removes them when it starts.
    Only files a host recorded as its own are judged: owned by this user, with an owner record
    that says it is a saver host's and names this pid scope (same boot, same pid namespace: a
    live agent in another container sharing /dev/shm is never taken for a dead one). Checkpoint
    segments are never touched: a dead job's restarted workers may still load them, and their
    stagers sweep the rest (`cleanup_stale`). A file that cannot be removed is skipped.

    Returns:
        The files removed.
    """
    scope = pid_scope()
    if scope is None:
        return []  # owners cannot be judged here
    uid = os.getuid()
    removed: list[Path] = []
    for record in Path(shm_dir).glob(f"{SEGMENT_PREFIX}host*.owner"):
        try:
            if record.lstat().st_uid != uid:
                continue
            doc = json.loads(record.read_text())
        except (OSError, ValueError):
            continue
        if not isinstance(doc, dict) or doc.get("kind") != _HOST_RECORD_KIND or doc.get("pid_scope") != scope:
            continue
        if owner_record_alive(doc):
            continue
        sock = record.with_name(record.name[: -len(".owner")] + ".sock")
        for path in (sock, record):
            try:
                path.unlink()
            except FileNotFoundError:
                continue
            except OSError:
                break  # not ours to remove after all: leave the pair as it is
            removed.append(path)
    return removed


@attrs.frozen
class HostedCommit:
    """A checkpoint a saver of this host committed.

    Attributes:
        job_id: the run's job.
        run_id: the run.
        step: the committed step.
        world_size: the ranks of the checkpoint.
        path: where it is (the storage directory or URL and the step's folder).
    """

    job_id: str
    run_id: str
    step: int
    world_size: int
    path: str


def host_socket_path(shm_dir: str | Path = DEFAULT_SHM_DIR) -> Path:
    """A fresh socket path for this process's host, named like a run of its own.

    ``<shm_dir>/dlrover-fc.host<pid>.<random>.sock``: the host records itself as that "run"'s
    owner, so `cleanup_stale` removes the socket once the agent is gone (even after SIGKILL) and
    never while it runs.
    """
    return Path(shm_dir) / f"{SEGMENT_PREFIX}host{os.getpid()}.{secrets.token_hex(4)}.sock"


# -- the service ------------------------------------------------------------------------------------


@attrs.frozen
class SaverHostConfig:
    """How the host listens and runs its savers.

    Attributes:
        socket_path: where the host listens (see `host_socket_path`).
        max_runs: the most runs served at once.
        stop_timeout_s: bound on finishing a saver's queued persists when it is stopped or
            replaced.
        drain_timeout_s: at `SaverHost.stop`, bound on waiting for the connections of stopped
            training processes to close (their failure persist is queued then).
        request_timeout_s: a connected stager must send each request within this.
        lock_timeout_s: how long a persist waits for a slot the stager still seals.
        poll_interval_s: how often the accept loop and the shutdown watcher look again.
        commit_poll_interval_s: how often a coordinator re-checks steps other nodes finish.
        persist_nice: niceness added to each saver's persist thread (0: unchanged). It ranks the
            thread only against the agent's own threads: training processes run in sessions of
            their own (Linux autogroups), so to bound what a persist takes from them, see
            `persist_bandwidth_mb_s`.
        persist_bandwidth_mb_s: each saver's cap on its persist rate in MB/s (default: 256 per
            CPU this process may use; 0: none); see `SaverConfig`.
        retention: which committed checkpoints to keep (None: all).
        failure_persist_hold_s: how long each saver may hold back the persist a dead training
            process triggers while the restarted ones restore (0: persist at once); see
            `SaverConfig`.
        failure_join_s: how long after a failure persist each saver writes steps other nodes
            persisted (0: never); see `SaverConfig`.
    """

    socket_path: str = attrs.field(converter=str)
    max_runs: int = attrs.field(default=16, validator=positive_int)
    stop_timeout_s: float = attrs.field(default=120.0, validator=positive)
    drain_timeout_s: float = attrs.field(default=10.0, validator=positive)
    request_timeout_s: float = attrs.field(default=10.0, validator=positive)
    lock_timeout_s: float = attrs.field(default=60.0, validator=positive)
    poll_interval_s: float = attrs.field(default=0.05, validator=positive)
    commit_poll_interval_s: float = attrs.field(default=1.0, validator=positive)
    persist_nice: int = attrs.field(default=19, validator=non_negative_int)
    persist_bandwidth_mb_s: float = attrs.field(factory=default_persist_bandwidth_mb_s, validator=non_negative_finite)
    retention: RetentionPolicy | None = None
    failure_persist_hold_s: float = attrs.field(default=0.0, validator=non_negative_finite)
    failure_join_s: float = attrs.field(default=120.0, validator=non_negative_finite)

    def __attrs_post_init__(self) -> None:
        if self.persist_nice > 19:
            raise ConfigError(f"persist_nice must be at most 19, got {self.persist_nice!r}")
        if not os.path.isabs(self.socket_path):
            raise ConfigError(f"socket_path must be absolute, got {self.socket_path!r}")
        if not os.path.isdir(os.path.dirname(self.socket_path)):
            raise ConfigError(f"socket_path {self.socket_path!r} is not in an existing directory")


StorageFactory = Callable[[StorageLocation], Storage]


class SaverHost:
    """Runs the savers of this node's runs in this process (see the module docstring).

    Args:
        config: where to listen and how to run savers.
        storage_factory: the storage of a run from its location (default `StorageLocation.open`:
            a POSIX directory or an fsspec URL).
        clock: time source for waits and event timestamps.
    """

    def __init__(
        self,
        config: SaverHostConfig,
        *,
        storage_factory: StorageFactory = StorageLocation.open,
        clock: Clock | None = None,
    ) -> None:
        self.config = config
        self.events = EventLog()
        self._storage_factory = storage_factory
        self._clock = clock or SystemClock()
        self._table = HostRuns(config.max_runs)
        self._savers: dict[tuple[str, str], Saver] = {}
        self._serving: tuple[Saver, ...] = ()  # the values of `_savers`, for lock-free readers
        self._ended_commits: dict[tuple[str, str], HostedCommit] = {}  # of runs whose saver stopped
        self._lock = threading.Lock()  # serialises every change of the runs and their savers
        self._conn_lock = threading.Lock()
        self._conns: set[socket.socket] = set()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._retiring: list[threading.Thread] = []  # stopping replaced savers (under _lock)
        self._ending: set[tuple[str, str]] = set()  # runs whose saver stops after a shutdown (under _lock)
        self._listener: socket.socket | None = None
        self._owner_key: tuple[str, str] | None = None
        self._stopped = False

    @property
    def socket_path(self) -> Path:
        """Where stagers ask for savers."""
        return Path(self.config.socket_path)

    def start(self) -> None:
        """Bind the 0600 socket and start the accept loop and the shutdown watcher.

        Raises:
            FlashCkptError: the socket cannot be bound (the message names it).
        """
        path = self.socket_path
        for removed in remove_dead_hosts(path.parent):
            self._record("stale_host_removed", f"removed {removed}: the saver host that made it is gone")
        match = _HOST_NAME_RE.fullmatch(path.name)
        if match is not None:
            # Named like a run: record this process as its owner, for cleanup_stale.
            self._owner_key = (match.group(1), match.group(2))
            write_owner(path.parent, *self._owner_key, extra={"kind": _HOST_RECORD_KIND, "pid_scope": pid_scope()})
        try:
            listener, _ = listen_owner_only(path)
        except OSError as e:
            self._remove_files()
            raise FlashCkptError(f"cannot listen on {path}: {e}") from e
        listener.settimeout(self.config.poll_interval_s)
        self._listener = listener
        for target, name in ((self._accept_loop, "accept"), (self._watch_shutdowns, "watch")):
            t = threading.Thread(target=target, name=f"flashckpt-host-{name}", daemon=True)
            t.start()
            self._threads.append(t)
        self._record("host_started", f"listening on {path}")

    # -- requests -----------------------------------------------------------------------------------

    def ensure(self, request: SaverRequest) -> tuple[EnsureDecision, Saver | None]:
        """Start, reuse or replace the saver of `request`'s run (also callable in-process).

        Returns:
            The decision and the run's saver (None when refused or it could not start; the
            decision's reason then says why).
        """
        with self._lock:
            decision = self._decide(request)
            if decision.action is EnsureAction.REFUSE:
                self._record("request_refused", decision.reason)
                return decision, None
            if decision.action is EnsureAction.REUSE:
                return decision, self._savers[request.key]
            try:
                # The storage first: a directory that cannot be made refuses the request before
                # a running saver is touched.
                storage = self._storage_factory(request.location)
            except (OSError, FlashCkptError) as e:
                refused = EnsureDecision(EnsureAction.REFUSE, f"storage {request.storage_dir!r} is unusable: {e}")
                self._record("request_refused", refused.reason)
                return refused, None
            old = self._savers.get(request.key) if decision.action is EnsureAction.REPLACE else None
            if old is not None:
                # Retired before the new saver listens: never two savers of the run committing.
                old.retire()
            saver = Saver(self._saver_config(request), storage, clock=self._clock)
            try:
                saver.start()
            except OSError as e:
                reason = f"cannot start the saver of {request.key}: {e}"
                if old is not None:
                    old.unretire()
                    reason += f"; the previous saver (world size {old.config.world_size}) keeps serving the run"
                failed = EnsureDecision(EnsureAction.REFUSE, reason)
                self._record("request_refused", failed.reason)
                return failed, None
            if old is not None:
                # Stopped outside the lock: its queued persists may take long on slow storage,
                # and every other request (the resized workers') must be answered meanwhile.
                t = threading.Thread(target=self._stop_replaced, args=(request.key, old), daemon=True)
                t.start()
                self._retiring = [r for r in self._retiring if r.is_alive()] + [t]
            self._savers[request.key] = saver
            self._serving = tuple(self._savers.values())
            self._table.apply(request, decision)
            self._record(f"saver_{decision.action.value}", decision.reason)
            return decision, saver

    def _decide(self, request: SaverRequest) -> EnsureDecision:
        if self._stopped:
            return EnsureDecision(EnsureAction.REFUSE, "the host is stopping")
        if request.key in self._ending:
            return EnsureDecision(
                EnsureAction.REFUSE, f"run {request.key} is ending (its job sent shutdown): its saver is stopping"
            )
        return self._table.decide(request)

    def _stop_replaced(self, key: tuple[str, str], old: Saver) -> None:
        # Training goes on with the new saver: the old one's persists keep their rate cap.
        old.stop(remove_memory=False, timeout_s=self.config.stop_timeout_s, uncap=False)
        self._record("saver_retired", f"replaced saver of run {key[0]}/{key[1]} stopped")

    def _saver_config(self, request: SaverRequest) -> SaverConfig:
        c = self.config
        return SaverConfig(
            job_id=request.job_id,
            run_id=request.run_id,
            world_size=request.world_size,
            shm_dir=request.shm_dir,
            num_slots=request.num_slots,
            coordinator=request.coordinator,
            lock_timeout_s=c.lock_timeout_s,
            poll_interval_s=c.poll_interval_s,
            commit_poll_interval_s=c.commit_poll_interval_s,
            # A request without retention (0 and 0) leaves the agent's own policy.
            retention=RetentionPolicy.from_counts(request.keep_last, request.keep_every) or c.retention,
            worker_nice=c.persist_nice,
            persist_bandwidth_mb_s=c.persist_bandwidth_mb_s,
            failure_persist_hold_s=c.failure_persist_hold_s,
            failure_join_s=c.failure_join_s,
        )

    def saver(self, job_id: str, run_id: str) -> Saver | None:
        """The saver serving a run now, if any."""
        with self._lock:
            return self._savers.get((job_id, run_id))

    def ranks_sealed_since(self, since: float) -> frozenset[int]:
        """Ranks of any run that sealed a snapshot at or after `since` (this host's clock).

        The agent reads it as "these workers are training again" after it (re)starts them, from
        its monitoring loop: so it does not take the host's lock, which `ensure` holds while it
        starts or replaces a saver.
        """
        savers = self._serving  # replaced whole under the lock, read without it
        return frozenset().union(*(s.ranks_sealed_since(since) for s in savers))

    def newest_step_sealed_by(self, ranks: Iterable[int]) -> int | None:
        """The newest step every one of `ranks` has sealed a snapshot of, in any run; None when
        one of them has sealed none (read without the host's lock, as `ranks_sealed_since`).

        The agent reports it as its node's training progress.
        """
        newest: dict[int, int] = {}
        for saver in self._serving:  # replaced whole under the lock, read without it
            for rank, step in saver.sealed_steps().items():
                newest[rank] = max(step, newest.get(rank, step))
        wanted = list(ranks)
        if not wanted or any(rank not in newest for rank in wanted):
            return None
        return min(newest[rank] for rank in wanted)

    def commits(self) -> list[HostedCommit]:
        """The newest checkpoint each run's saver on this host committed (runs whose saver is the
        coordinator and committed one), read under the host's lock.

        The agent tells the master about each new one (`dlrover-master status` shows it).
        """
        with self._lock:
            out = dict(self._ended_commits)
            for key, saver in self._savers.items():
                commit = self._commit_of(key, saver)
                if commit is not None:
                    out[key] = commit
            return list(out.values())

    def _commit_of(self, key: tuple[str, str], saver: Saver) -> HostedCommit | None:
        """The newest commit of `saver` (under the host's lock, while its request is known)."""
        step = saver.newest_commit
        if step is None:
            return None
        request = self._table.runs().get(key)
        root = request.storage_dir.rstrip("/") if request is not None else ""
        path = f"{root}/{step_dir(step)}" if root else step_dir(step)
        return HostedCommit(key[0], key[1], step, saver.config.world_size, path)

    def failure_persist_pending(self) -> bool:
        """Whether any run's saver has a failure persist held, queued or running (read without the
        host's lock, as `ranks_sealed_since`)."""
        return any(s.failure_persist_pending() for s in self._serving)

    def release_held_failures(self, reason: str) -> None:
        """Start every held failure persist now (see `SaverHostConfig.failure_persist_hold_s`).

        The agent calls it when its workers' ranks or the world size change: a replaced saver no
        longer commits, and ranks that moved to another node never seal here again.
        """
        for saver in self._serving:  # replaced whole under the lock, read without it
            saver.release_held(reason)

    def remove_departed_ranks(self, ranks: Iterable[int]) -> list[Path]:
        """Unlink the slot files of ranks other than `ranks` (this node's ranks now), in every run
        whose memory lives in this host's own directory (the one holding its socket).

        After an elastic resize renumbers the node's workers, what they saved under their old
        ranks is read again only until every new rank has sealed a snapshot of its own; left, it
        would hold shared memory until the job ends, once more with every renumbering. The agent
        calls this then. A directory other processes may share (a script's own ``shm_dir``) is
        never touched.

        Returns:
            The files removed.
        """
        keep = set(ranks)
        own = self.socket_path.parent
        removed = []
        for (job, run), request in self.runs().items():
            if Path(request.shm_dir) != own:
                continue
            for rank in run_ranks(own, job, run):
                if rank in keep:
                    continue
                for slot in range(request.num_slots):
                    path = segment_path(own, job, run, rank, slot)
                    with contextlib.suppress(FileNotFoundError):
                        path.unlink()  # a saver still reading it keeps its mapping until done
                        removed.append(path)
        if removed:
            self._record("departed_ranks_removed", f"removed {len(removed)} slot files of ranks no longer on this node")
        return removed

    def runs(self) -> dict[tuple[str, str], SaverRequest]:
        """The runs served now and the request each saver was started for."""
        with self._lock:
            return self._table.runs()

    # -- stopping -----------------------------------------------------------------------------------

    def stop(self, remove_memory: bool, persist_newest: bool = False) -> None:
        """Stop accepting requests and stop every saver, after its queued persists (bounded).

        Call after the training processes are stopped: their connections close first (bounded by
        `drain_timeout_s`), so the persist each dead process triggers is queued and finished.

        Args:
            remove_memory: remove every run's shared memory (job end, node exit).
            persist_newest: first persist the newest snapshot every rank holds (a SIGTERM'd
                agent saves the work since the last persist).
        """
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
            savers = dict(self._savers)
            self._savers.clear()
            self._serving = ()
            for key in savers:
                self._table.forget(key)
            retiring = list(self._retiring)
        self._stop.set()
        for t in retiring:
            t.join(self.config.stop_timeout_s)
        # The accept loop and the watcher first (no connection thread is added after that), then
        # every connection thread, woken by shutting its socket down.
        for t in self._threads[:2]:
            t.join(self.config.stop_timeout_s)
        with self._conn_lock:
            conns = list(self._conns)
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        for t in self._threads[2:]:
            t.join(self.config.stop_timeout_s)
        if self._listener is not None:
            self._listener.close()
        deadline = self._clock.now() + self.config.drain_timeout_s
        for saver in savers.values():
            while saver.active_connections() and self._clock.now() < deadline:
                self._clock.sleep(self.config.poll_interval_s)
        for (job, run), saver in savers.items():
            if persist_newest:
                saver.persist_newest()
            saver.stop(remove_memory=remove_memory, timeout_s=self.config.stop_timeout_s)
            self._record(
                "saver_stopped", f"run {job}/{run} stopped ({'memory removed' if remove_memory else 'memory kept'})"
            )
        self._remove_files()

    def _remove_files(self) -> None:
        self.socket_path.unlink(missing_ok=True)
        if self._owner_key is not None:
            remove_run(self.socket_path.parent, *self._owner_key)

    def _watch_shutdowns(self) -> None:
        """Stop, and remove the memory of, a run whose stager said the job ended."""
        while not self._stop.wait(self.config.poll_interval_s):
            with self._lock:
                done = {key: saver for key, saver in self._savers.items() if saver.wait_shutdown(0)}
                for key, saver in done.items():
                    commit = self._commit_of(key, saver)
                    if commit is not None:
                        self._ended_commits[key] = commit
                    del self._savers[key]
                self._serving = tuple(self._savers.values())
                self._ending.update(done)
            # Stopped outside the lock (its last persists may be slow): other runs are served
            # meanwhile, and requests for this run are refused (and `runs` still lists it) until
            # its memory is gone.
            for key, saver in done.items():
                saver.stop(remove_memory=True, timeout_s=self.config.stop_timeout_s)
                with self._lock:
                    # An ended run's last commit is still news for the agent's next heartbeat.
                    commit = self._commit_of(key, saver)
                    if commit is not None:
                        self._ended_commits[key] = commit
                    self._ending.discard(key)
                    self._table.forget(key)
                self._record("saver_stopped", f"run {key[0]}/{key[1]} ended (shutdown): memory removed")

    # -- the socket ---------------------------------------------------------------------------------

    def _accept_loop(self) -> None:
        assert self._listener is not None
        while not self._stop.is_set():
            try:
                sock, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            sock.settimeout(self.config.request_timeout_s)
            with self._conn_lock:
                self._conns.add(sock)
            t = threading.Thread(target=self._serve, args=(sock,), name="flashckpt-host-conn", daemon=True)
            t.start()
            # Requests are short-lived: forget finished connection threads (the agent runs for days).
            self._threads = self._threads[:2] + [c for c in self._threads[2:] if c.is_alive()] + [t]

    def _serve(self, sock: socket.socket) -> None:
        try:
            while not self._stop.is_set():
                try:
                    msg = recv_message(sock)
                except ChannelError as e:
                    _reply(sock, {"type": "error", "reason": f"bad frame: {e}"})
                    return
                if msg is None:
                    return
                _reply(sock, self._answer(msg))
        except OSError:
            pass  # the stager went away or was too slow (request_timeout_s): nothing changed
        finally:
            with self._conn_lock:
                self._conns.discard(sock)
            sock.close()

    def _answer(self, msg: dict[str, Any]) -> dict[str, Any]:
        if msg["type"] != "ensure":
            return {"type": "error", "reason": f"unknown message type {msg['type']!r} (the host answers 'ensure')"}
        try:
            request = SaverRequest.from_message(msg)
        except FlashCkptError as e:
            self._record("request_refused", str(e))
            return {"type": "error", "reason": str(e)}
        decision, saver = self.ensure(request)
        if saver is None:
            return {"type": "error", "reason": decision.reason}
        return {
            "type": "saver",
            "path": str(saver.socket_path),
            "saver_pid": os.getpid(),
            "action": decision.action.value,
            "reason": decision.reason,
        }

    def _record(self, kind: str, reason: str) -> None:
        self.events.record(FlashEvent(kind, -1, reason, self._clock.wall_time()))


def _reply(sock: socket.socket, msg: dict[str, Any]) -> None:
    with contextlib.suppress(OSError):
        send_message(sock, msg)


# -- the stager's side ------------------------------------------------------------------------------


@attrs.frozen
class HostedSaver:
    """The host's answer: where the run's saver listens.

    Attributes:
        path: the saver's socket.
        saver_pid: the process hosting it (the agent).
        action: ``started``, ``reused`` or ``replaced``.
        reason: why.
    """

    path: Path
    saver_pid: int
    action: str
    reason: str


def request_saver(host_socket: str | Path, request: SaverRequest, timeout_s: float = 180.0) -> HostedSaver:
    """Ask the host at `host_socket` for the saver of `request`'s run.

    `timeout_s` bounds the whole exchange. The host answers without waiting on persists (a
    replaced saver is stopped in the background), but it may be busy stopping a run that ended.

    Raises:
        SaverUnavailableError: the host cannot be reached, or refused (the message names the
            socket and the host's reason).
    """
    path = Path(host_socket)
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout_s)
            with unix_address(path) as address:
                sock.connect(address)
            send_message(sock, request.to_message())
            reply = recv_message(sock)
    except (OSError, ChannelError) as e:
        raise SaverUnavailableError(
            f"cannot reach the agent's saver host at {path} (named by {HOST_SOCKET_ENV_VAR}): {e}"
        ) from e
    if reply is None:
        raise SaverUnavailableError(f"the saver host at {path} closed the connection without an answer")
    if reply["type"] == "error":
        raise SaverUnavailableError(f"the saver host at {path} refused: {reply.get('reason')}")
    if reply["type"] != "saver" or not isinstance(reply.get("path"), str):
        raise SaverUnavailableError(f"the saver host at {path} answered {reply!r}")
    return HostedSaver(
        Path(reply["path"]), int(reply.get("saver_pid", -1)), str(reply.get("action")), str(reply.get("reason"))
    )
