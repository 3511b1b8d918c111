"""The node's saver: persists snapshots from shared memory to storage, outliving training processes.

Hosted by the ``dlrover-run`` agent, or started detached by the first stager on a node
(`dlrover.flashckpt.saver_main`). It owns the run's shared memory: it records itself as owner at
start and removes every segment of the run when it stops.

Threads: one accepts connections on the Unix socket, one per connection reads its messages, and
one worker persists snapshots one at a time (the disk is the bottleneck; parallel writers would
only interleave). When a connection drops without ``bye``, the training process died: the worker
persists the newest step every local rank still holds complete in memory, at once or, with
`SaverConfig.failure_persist_hold_s`, once the restarted processes have restored.
"""

from __future__ import annotations

import contextlib
import os
import queue
import socket
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs

from dlrover.common import Clock, ConfigError, SystemClock
from dlrover.common.validators import non_negative_finite, non_negative_int, positive
from dlrover.flashckpt.channel import ChannelError, listen_owner_only, recv_message, send_message
from dlrover.flashckpt.commit import Committer, RetentionPolicy
from dlrover.flashckpt.errors import FlashCkptError, LayoutError, StateStructureError, StorageError
from dlrover.flashckpt.events import EventLog, FlashEvent
from dlrover.flashckpt.layout import SlotHeader, SlotState
from dlrover.flashckpt.pacing import Pacer, default_persist_bandwidth_mb_s
from dlrover.flashckpt.payloads import payload_from_slot
from dlrover.flashckpt.persist import persist_rank
from dlrover.flashckpt.priority import lower_thread_priority
from dlrover.flashckpt.saver_core import (
    FailureHold,
    HeldFailure,
    choose_failure_step,
    newest_common_steps,
    steps_to_join,
)
from dlrover.flashckpt.segment import (
    DEFAULT_SHM_DIR,
    SEGMENT_PREFIX,
    ShmSegment,
    remove_run,
    segment_path,
    validate_id,
    write_owner,
)
from dlrover.flashckpt.shard_tree import rank_files_refusal
from dlrover.flashckpt.slotio import peek_header, read_header
from dlrover.flashckpt.storage.base import Storage

__all__ = ["Saver", "SaverConfig", "socket_path"]


def socket_path(shm_dir: str | Path, job: str, run: str) -> Path:
    """The saver's Unix socket for a run (beside the run's segments, so it is cleaned with them)."""
    return Path(shm_dir) / f"{SEGMENT_PREFIX}{job}.{run}.sock"


@attrs.frozen
class SaverConfig:
    """What a node's saver serves and how.

    Attributes:
        job_id: the job (as in `StagerConfig`).
        run_id: the run.
        world_size: ranks in the job; a step is committed when all of them are done.
        shm_dir: where segments and the socket live.
        num_slots: slots per rank.
        coordinator: whether this saver moves the tracker (one saver per job does).
        persist_on_failure: persist the newest common snapshot when a training process dies.
        failure_persist_hold_s: 0 (the default): that persist starts at once and overlaps the
            restart; it holds every rank's snapshot of its step until that rank is written, so
            the restarted processes' save after next may wait for it (the stager's
            `busy_policy`). Otherwise it is held back while the restarted processes restore, so it does
            not take CPU and memory bandwidth from them on a node with few cores: it starts once
            every rank has sealed a snapshot again, or this long after the death, whichever comes
            first, and at once on `release_held`, `persist_newest` or `stop`. It persists the
            step every rank held at the death if still in memory (the step other nodes' savers
            usually choose too), else the newest common one. The costs: meanwhile the snapshot
            is only in memory, as between two persists while training; and the persist then
            holds that step's slot while training runs, so with two slots the processes' next
            save but one waits for it (the stager's `busy_policy`).
        lock_timeout_s: how long a persist waits for a slot the stager is still sealing.
        poll_interval_s: how often waits re-check (slot locks, the accept loop's stop flag).
        commit_poll_interval_s: how often the coordinator re-checks steps waiting for ranks that
            other nodes' savers persist.
        failure_join_s: for this long after a failure persist, a saver whose ranks are not the
            whole job checks storage every `commit_poll_interval_s` for uncommitted steps other
            nodes' savers persisted and writes the same step from its ranks' memory if they all
            hold it (`saver_core.steps_to_join`): nodes whose failure persists chose different
            steps then still commit the newest step every rank holds. 0 turns it off.
        retention: which committed checkpoints to keep (None: all).
        worker_nice: niceness added to the persist worker thread only (Linux sets it per thread),
            so a saver hosted inside the agent yields the CPU to training (0: unchanged).
        persist_bandwidth_mb_s: cap on the average rate (MB/s, 10^6 bytes) at which a persist
            writes tensor bytes, bounding its share of a core, of memory bandwidth and of the disk
            while training runs (a failure persist drops it). Default:
            `default_persist_bandwidth_mb_s`, 256 MB/s per CPU this process may use, which
            holds a persist back on a small host only; 0: no cap (disk speed, the snapshot
            durable soonest).
    """

    job_id: str
    run_id: str
    world_size: int = attrs.field(default=1, validator=positive)
    shm_dir: str = DEFAULT_SHM_DIR
    num_slots: int = 2
    coordinator: bool = True
    persist_on_failure: bool = True
    failure_persist_hold_s: float = attrs.field(default=0.0, validator=non_negative_finite)
    lock_timeout_s: float = attrs.field(default=60.0, validator=positive)
    poll_interval_s: float = attrs.field(default=0.05, validator=positive)
    commit_poll_interval_s: float = attrs.field(default=1.0, validator=positive)
    failure_join_s: float = attrs.field(default=120.0, validator=non_negative_finite)
    retention: RetentionPolicy | None = None
    worker_nice: int = attrs.field(default=0, validator=non_negative_int)
    persist_bandwidth_mb_s: float = attrs.field(factory=default_persist_bandwidth_mb_s, validator=non_negative_finite)

    def __attrs_post_init__(self) -> None:
        if self.worker_nice > 19:
            raise ConfigError(f"worker_nice must be at most 19 (the lowest priority), got {self.worker_nice!r}")
        for kind, value in (("job", self.job_id), ("run", self.run_id)):
            try:
                validate_id(kind, value)
            except FlashCkptError as e:
                raise ConfigError(str(e)) from None


@attrs.frozen
class _Job:
    kind: str  # "persist" or "failure"
    rank: int = -1
    step: int = -1  # for "failure": the step to prefer (-1: the newest common one)
    reply: _Conn | None = None


class _Conn:
    def __init__(self, sock: socket.socket, serial: int) -> None:
        self.sock = sock
        self.serial = serial  # the order of acceptance: connections of later processes are higher
        self.rank: int | None = None
        self.clean = False
        self._send_lock = threading.Lock()

    def send(self, msg: dict[str, Any]) -> None:
        with self._send_lock, contextlib.suppress(OSError):
            send_message(self.sock, msg)


class Saver:
    """Persists snapshots of a run's ranks (see the module docstring).

    Args:
        config: job, run, world size and timing.
        storage: where checkpoints go.
        clock: time source for waits and event timestamps.
    """

    def __init__(self, config: SaverConfig, storage: Storage, clock: Clock | None = None) -> None:
        self.config = config
        self.storage = storage
        self.committer = Committer(storage, config.retention)
        self.events = EventLog()
        self._clock = clock or SystemClock()
        self._queue: queue.Queue[_Job | None] = queue.Queue()
        self._stop = threading.Event()
        self._shutdown_requested = threading.Event()
        self._idle = threading.Condition()
        self._busy = 0
        self._failure_jobs = 0  # failure persists queued or running (under _idle)
        self._lock = threading.Lock()
        self._conns: list[_Conn] = []
        self._ranks: set[int] = set()
        self._sealed_at: dict[int, float] = {}  # rank -> when its newest snapshot was sealed (clock)
        self._sealed_step: dict[int, int] = {}  # rank -> the step of that snapshot
        self._persisted: set[tuple[int, int]] = set()
        self._pending: set[int] = set()  # steps waiting for other savers' ranks (worker thread only)
        self._hold = FailureHold(config.failure_persist_hold_s)  # under _lock
        self._stopping = False  # under _lock: set by `stop`, after which nothing is held
        self._threads: list[threading.Thread] = []
        self._listener: socket.socket | None = None
        self._socket_ino: int | None = None  # the socket file this saver bound (not a successor's)
        # Held while committing: once `retire` returns, this saver never moves the tracker again.
        self._commit_lock = threading.Lock()
        self._newest_commit: int | None = None  # the newest step this saver committed
        self._retired = False
        self._uncapped = threading.Event()  # set at stop: persists run at full speed from then on
        self._pacer: Pacer | None = None  # the running persist's (worker thread; read by `stop`)
        self.connections_seen = 0
        # Connections up to this serial were open when a failure persist was last queued at once.
        self._failure_covers_serial = 0
        self._join_until = float("-inf")  # worker thread: see SaverConfig.failure_join_s
        self._joined: set[int] = set()  # worker thread: steps a join wrote or tried (once each)

    @property
    def socket_path(self) -> Path:
        """Where stagers connect."""
        return socket_path(self.config.shm_dir, self.config.job_id, self.config.run_id)

    def start(self) -> None:
        """Record this process as owner of the run's memory, bind the socket, start the threads."""
        c = self.config
        write_owner(c.shm_dir, c.job_id, c.run_id)
        path = self.socket_path
        # Set listening under a private name, then renamed over the run's socket: a saver
        # replacing another takes the name over atomically, and one that fails to start leaves
        # the running saver's socket in place.
        listener, self._socket_ino = listen_owner_only(path)
        listener.settimeout(c.poll_interval_s)
        self._listener = listener
        for target, name in ((self._accept_loop, "accept"), (self._worker, "worker")):
            t = threading.Thread(target=target, name=f"flashckpt-saver-{name}", daemon=True)
            t.start()
            self._threads.append(t)

    # -- requests ---------------------------------------------------------------------------------

    def request_persist(self, rank: int, step: int) -> None:
        """Queue a persist of `rank`'s snapshot of `step` (in-process hosts call this directly)."""
        with self._lock:
            self._ranks.add(rank)
        self._submit(_Job("persist", rank, step))

    def persist_newest(self) -> None:
        """Queue a persist of the newest step every rank known to this saver holds in memory.

        What a dying training process triggers; a host calls it before stopping for good (the
        agent got SIGTERM) so the newest snapshot reaches storage even if every worker exited
        cleanly. A step already persisted is not written again. Training has stopped then, so
        this persist, and every one after it, ignores `persist_bandwidth_mb_s`.
        """
        self._uncap()
        with self._lock:
            held = self._hold.release()
        if held is not None:
            self._record("failure_persist_released", -1, "the newest snapshot is persisted instead")
        self._submit(_Job("failure"))

    def _submit(self, job: _Job) -> None:
        with self._idle:
            self._busy += 1
            self._failure_jobs += job.kind == "failure"
        self._queue.put(job)

    def failure_persist_pending(self) -> bool:
        """Whether a failure persist is held back, queued or running.

        The agent waits for it to end before it starts work that would take the CPU from it
        (warming standby interpreters): the restarted processes' save after next may be waiting
        for it, and it runs at a low priority.
        """
        with self._idle:
            if self._failure_jobs:
                return True
        with self._lock:
            return self._hold.held is not None

    def wait_idle(self, timeout_s: float) -> bool:
        """Wait until no persist is queued or running; False on timeout.

        A held failure persist (`SaverConfig.failure_persist_hold_s`) is not counted until it is
        released; `stop` releases it first.
        """
        with self._idle:
            return self._idle.wait_for(lambda: self._busy == 0, timeout=timeout_s)

    def wait_shutdown(self, timeout_s: float | None = None) -> bool:
        """Wait for a ``shutdown`` message; False on timeout."""
        return self._shutdown_requested.wait(timeout_s)

    @property
    def newest_commit(self) -> int | None:
        """The newest step this saver committed (moved the tracker to), or None."""
        with self._lock:
            return self._newest_commit

    def ranks_sealed_since(self, since: float) -> frozenset[int]:
        """Ranks that sealed a snapshot at or after `since` (this saver's clock): they are training."""
        with self._lock:
            return frozenset(rank for rank, at in self._sealed_at.items() if at >= since)

    def sealed_steps(self) -> dict[int, int]:
        """The step of each rank's newest sealed snapshot (ranks that sealed none are absent)."""
        with self._lock:
            return dict(self._sealed_step)

    def active_connections(self) -> int:
        """Stagers attached now."""
        with self._lock:
            return len(self._conns)

    def retire(self) -> None:
        """Stop committing: another saver now serves the run (a resize replaced this one).

        Persists still queued or running finish writing their rank files, but from the moment
        this returns this saver never writes a manifest, moves the tracker or removes old steps,
        so two savers of one run never commit concurrently. Steps it would have committed are kept
        pending; `unretire` (the replacement could not start) commits them again.
        """
        with self._commit_lock:
            self._retired = True

    def unretire(self) -> None:
        """Undo `retire`: this saver serves the run again."""
        with self._commit_lock:
            self._retired = False

    def stop(self, remove_memory: bool = True, timeout_s: float = 30.0, uncap: bool = True) -> None:
        """Finish queued persists, close every connection, and (as owner) remove the run's memory.

        Args:
            remove_memory: unlink the run's segments, owner record and socket (job end).
            timeout_s: bound on waiting for the worker.
            uncap: drop `persist_bandwidth_mb_s` for the persists still to finish (training has
                stopped; a capped persist of a large state could not finish within `timeout_s`).
                False for a saver replaced while training goes on.
        """
        if uncap:
            self._uncap()
        with self._lock:
            self._stopping = True  # a process that dies from now on is persisted at once
        self.release_held("the saver stops")
        self.wait_idle(timeout_s)
        self._stop.set()
        self._queue.put(None)
        # The accept loop and the worker first (no connection thread is added after that),
        # then every connection thread, woken by shutting its socket down.
        for t in self._threads[:2]:
            t.join(timeout_s)
        with self._lock:
            conns = list(self._conns)
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.sock.shutdown(socket.SHUT_RDWR)
        for t in self._threads[2:]:
            t.join(timeout_s)
        if self._listener is not None:
            self._listener.close()
        if remove_memory:
            remove_run(self.config.shm_dir, self.config.job_id, self.config.run_id)
        elif self._owns_socket_file():
            self.socket_path.unlink(missing_ok=True)

    def _owns_socket_file(self) -> bool:
        # A saver that replaced this one has renamed its own socket over the path: leave it.
        try:
            return self.socket_path.stat().st_ino == self._socket_ino
        except OSError:
            return False

    def _uncap(self) -> None:
        with self._lock:
            self._uncapped.set()
            if self._pacer is not None:
                self._pacer.rate_bytes_s = 0.0  # the running persist stops pausing

    # -- threads ----------------------------------------------------------------------------------

    def _accept_loop(self) -> None:
        assert self._listener is not None
        while not self._stop.is_set():
            try:
                sock, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            sock.settimeout(None)
            with self._lock:
                self.connections_seen += 1
                conn = _Conn(sock, self.connections_seen)
                self._conns.append(conn)
            t = threading.Thread(target=self._serve, args=(conn,), name="flashckpt-saver-conn", daemon=True)
            t.start()
            self._threads.append(t)

    def _serve(self, conn: _Conn) -> None:
        try:
            while not self._stop.is_set():
                msg = recv_message(conn.sock)
                if msg is None:
                    break
                self._handle(conn, msg)
        except (ChannelError, OSError) as e:
            self._record("channel_error", -1, f"connection of rank {conn.rank}: {e}")
        finally:
            with self._lock:
                # A process that left is not training, unless its successor already said hello;
                # forgotten before a hold starts, so its old seal cannot end the hold.
                if conn.rank is not None and not any(c.rank == conn.rank for c in self._conns if c is not conn):
                    self._sealed_at.pop(conn.rank, None)
            # The failure persist is queued (or held) before the connection leaves the list, so a
            # host that sees no connection left also sees it: in `wait_idle`, or released by `stop`.
            if conn.rank is not None and not conn.clean and not self._stop.is_set():
                self._record("stager_lost", -1, f"rank {conn.rank} disconnected without 'bye': process died?")
                if self.config.persist_on_failure:
                    self._on_stager_lost(conn)
            with self._lock:
                self._conns.remove(conn)
            conn.sock.close()

    def _handle(self, conn: _Conn, msg: dict[str, Any]) -> None:
        kind = msg["type"]
        try:
            if kind == "hello":
                conn.rank = _int(msg, "rank")
                with self._lock:
                    self._ranks.add(conn.rank)
                conn.send({"type": "welcome", "saver_pid": os.getpid()})
            elif kind == "sealed":
                # The saver reads snapshots from memory itself; the notice only says when, for the
                # rank this connection said hello as.
                if conn.rank is None:
                    raise ChannelError("'sealed' before 'hello'")
                step = msg.get("step")  # any int: training steps may be numbered from anywhere
                with self._lock:
                    self._sealed_at[conn.rank] = self._clock.now()
                    if isinstance(step, int) and not isinstance(step, bool) and -(2**63) <= step < 2**63:
                        self._sealed_step[conn.rank] = step
                self._release_held_if_due()
            elif kind == "persist":
                self._submit(_Job("persist", _int(msg, "rank"), _int(msg, "step"), conn))
            elif kind == "bye":
                conn.clean = True
            elif kind == "shutdown":
                conn.clean = True
                self._shutdown_requested.set()
            else:
                conn.send({"type": "error", "reason": f"unknown message type {kind!r}"})
        except ChannelError as e:
            conn.send({"type": "error", "reason": str(e)})

    def _worker(self) -> None:
        if self.config.worker_nice:
            self._lower_priority()
        while True:
            try:
                job = self._queue.get(timeout=self.config.commit_poll_interval_s)
            except queue.Empty:
                self._retry_pending_commits()
                self._join_other_nodes()
                self._release_held_if_due()
                continue
            if job is None:
                return
            try:
                if job.kind == "persist":
                    self._persist_and_reply(job)
                else:
                    self._persist_on_failure(None if job.step < 0 else job.step)
                self._release_held_if_due()  # a steady stream of jobs must not stretch the hold
            except Exception as e:  # a bug must not kill the worker: report it and go on
                reason = f"unexpected error: {e!r}"
                self._record("persist_failed", job.step, reason)
                # The stager waits for an answer: without one it would wait out its whole timeout.
                if job.reply is not None:
                    job.reply.send({"type": "persist_failed", "rank": job.rank, "step": job.step, "reason": reason})
            finally:
                with self._idle:
                    self._busy -= 1
                    self._failure_jobs -= job.kind == "failure"
                    self._idle.notify_all()

    def _lower_priority(self) -> None:
        try:
            lower_thread_priority(self.config.worker_nice)  # only persisting is slowed
        except OSError as e:
            self._record("priority_unchanged", -1, f"cannot lower the persist thread's priority: {e}")

    # -- persisting -------------------------------------------------------------------------------

    def _record(self, kind: str, step: int, reason: str) -> None:
        self.events.record(FlashEvent(kind, step, reason, self._clock.wall_time()))

    def _persist_and_reply(self, job: _Job) -> None:
        def holding(held: bool) -> None:
            # The rank keeps the snapshot from its own later saves until this (`Stager.keep_until`):
            # from here the saver's shared lock protects it, or it was not there to protect.
            if job.reply is not None:
                job.reply.send({"type": "holding", "rank": job.rank, "step": job.step, "held": held})

        ok, reason = self._persist(job.rank, job.step, on_hold=holding)
        committed = False
        if ok:
            committed, reason = self._try_commit(job.step)
        if job.reply is not None:
            if ok:
                job.reply.send(
                    {"type": "persisted", "rank": job.rank, "step": job.step, "committed": committed, "reason": reason}
                )
            else:
                job.reply.send({"type": "persist_failed", "rank": job.rank, "step": job.step, "reason": reason})

    def _try_commit(self, step: int) -> tuple[bool, str]:
        if not self.config.coordinator:
            return False, "this saver is not the coordinator"
        with self._commit_lock:
            if self._retired:
                self._pending.add(step)  # committed again only if `unretire` is called
                return False, "this saver was replaced: the run's new saver commits"
            try:
                decision = self.committer.try_commit(step, self.config.world_size)
            except FlashCkptError as e:
                self._record("persist_failed", step, f"commit of step {step} failed: {e}")
                if isinstance(e, StorageError):
                    # A commit lock held too long, a storage hiccup: every file is written, so
                    # the periodic retry may well commit it.
                    self._pending.add(step)
                return False, str(e)
        if decision.commit:
            self._record("committed", step, decision.reason)
            with self._lock:
                self._newest_commit = max(step, self._newest_commit if self._newest_commit is not None else step)
            self._pending = {s for s in self._pending if s > step}
        elif decision.waiting_for:
            # Ranks on other nodes (other savers) may finish later: check again periodically.
            self._pending.add(step)
        else:
            self._pending.discard(step)
        return decision.commit, decision.reason

    def _retry_pending_commits(self) -> None:
        """The coordinator commits steps whose last done markers were written by other savers."""
        for step in sorted(self._pending):
            if step in self._pending:
                self._try_commit(step)

    def _persist(self, rank: int, step: int, on_hold: Callable[[bool], None] | None = None) -> tuple[bool, str]:
        """Persist one rank's snapshot of `step` from memory. Returns (ok, reason).

        `on_hold` is told whether the snapshot is held (a shared lock of the saver's own) before it
        is written, or that it need not be (written or committed already, or not in memory)."""
        if (rank, step) in self._persisted:
            if on_hold is not None:
                on_hold(False)
            return True, f"rank {rank} step {step} was already persisted"
        committed = self._committed_already(step)
        if committed is not None:
            if on_hold is not None:
                on_hold(False)
            return True, committed
        held = self._hold_snapshot(rank, step)
        if on_hold is not None:
            on_hold(not isinstance(held, str))
        if isinstance(held, str):
            return False, held
        return self._persist_held(rank, step, held)

    def _committed_already(self, step: int) -> str | None:
        """Why `step` needs no writing: storage committed it or a newer step (by any writer:
        the training processes persist too); None when it may be written."""
        try:
            tracker = self.committer.tracker()
        except FlashCkptError:
            return None  # an unreadable tracker is replaced by the next commit
        if tracker is not None and step <= tracker.step:
            return f"step {step} is not newer than the committed step {tracker.step}"
        return None

    def _hold_snapshot(self, rank: int, step: int) -> _HeldSnapshot | str:
        """Find `rank`'s complete snapshot of `step` in memory and hold it (a shared lock), so no
        stager writes over it until `_persist_held` has written it; the reason when there is none."""
        c = self.config
        deadline = self._clock.now() + c.lock_timeout_s
        for slot in range(c.num_slots):
            path = segment_path(c.shm_dir, c.job_id, c.run_id, rank, slot)
            peeked = peek_header(path)
            if peeked is None or peeked.step != step or peeked.state < SlotState.COMPLETE:
                continue
            try:
                seg = ShmSegment.attach(path)
            except (FileNotFoundError, FlashCkptError):
                continue
            held = False
            try:
                header = _header(seg)
                if header is None or header.step != step or header.state < SlotState.COMPLETE:
                    continue
                while not seg.try_lock(exclusive=False):  # the stager may still be sealing it
                    if self._clock.now() >= deadline:
                        reason = f"rank {rank} step {step}: slot {slot} stayed locked for {c.lock_timeout_s}s"
                        self._record("persist_failed", step, reason)
                        return reason
                    self._clock.sleep(c.poll_interval_s)
                locked = _header(seg)
                if locked is None or locked.seq != header.seq or locked.state < SlotState.COMPLETE:
                    seg.unlock()
                    continue  # overwritten meanwhile
                held = True
                return _HeldSnapshot(slot, seg, locked)
            finally:
                if not held:
                    seg.close()
        reason = f"rank {rank} holds no complete snapshot of step {step} in memory"
        self._record("persist_failed", step, reason)
        return reason

    def _persist_held(self, rank: int, step: int, held: _HeldSnapshot) -> tuple[bool, str]:
        """Write a snapshot `_hold_snapshot` holds, then let it go."""
        c = self.config
        try:
            with self._lock:
                capped = bool(c.persist_bandwidth_mb_s) and not self._uncapped.is_set()
                self._pacer = Pacer(c.persist_bandwidth_mb_s * 1e6, self._clock) if capped else None
            try:
                payload = payload_from_slot(held.seg, held.header, rank, c.world_size)
                refusal = rank_files_refusal(payload.tree, payload.specs)
                if refusal is not None:
                    raise StateStructureError(
                        f"{refusal}, so its per-rank files could never be loaded: such a step is persisted only "
                        "by the training processes, through DCP"
                    )
                # The slot is let go once its bytes are handed over, not after the fsync: a
                # stager waiting for it (the save after next) waits no longer than it must.
                persist_rank(self.storage, payload, pacer=self._pacer, on_streamed=held.release)
            finally:
                with self._lock:
                    self._pacer = None
        except FlashCkptError as e:
            reason = f"rank {rank} step {step}: {e}"
            self._record("persist_failed", step, reason)
            return False, reason
        finally:
            held.release()
        self._persisted.add((rank, step))
        self._record("persisted", step, f"rank {rank} step {step} from slot {held.slot}")
        return True, f"rank {rank} step {step} persisted"

    def held_steps(self, rank: int) -> list[int]:
        """Steps of `rank`'s complete snapshots in memory."""
        c = self.config
        steps = []
        for slot in range(c.num_slots):
            header = peek_header(segment_path(c.shm_dir, c.job_id, c.run_id, rank, slot))
            if header is not None and header.state >= SlotState.COMPLETE:
                steps.append(header.step)
        return steps

    # -- persisting on failure ----------------------------------------------------------------------

    def _on_stager_lost(self, conn: _Conn) -> None:
        """A training process died: persist its newest snapshot now, or hold the persist back."""
        with self._lock:
            ranks = set(self._ranks)
            at_once = self.config.failure_persist_hold_s <= 0 or self._stopping
            # A process that was already connected when an earlier loss queued a failure persist
            # is its peer in the same failure (typically stopped by the agent for the restart):
            # without the dead rank it could seal no newer step every rank holds, so that persist
            # covers it. Queuing another would persist the restarted processes' newest step
            # while they overwrite it.
            covered = at_once and conn.serial <= self._failure_covers_serial
            if at_once and not covered:
                self._failure_covers_serial = self.connections_seen
        if covered:
            self._record(
                "failure_persist_covered",
                -1,
                f"rank {conn.rank} left after an earlier loss among the same processes; that failure persist covers it",
            )
            return
        if at_once:
            self._submit(_Job("failure"))
            return
        common = newest_common_steps({r: self.held_steps(r) for r in ranks}, ranks)
        with self._lock:
            if self._stopping:  # `stop` began meanwhile: it releases only what was held before
                held = None
                at_once = True
            else:
                held = self._hold.lost(self._clock.now(), max(common) if common else None)
        if at_once:
            self._submit(_Job("failure"))
        elif held is not None:
            self._record(
                "failure_persist_held",
                -1 if held.step is None else held.step,
                f"held back up to {self._hold.hold_s:g} s, until every rank has sealed a snapshot again",
            )

    def _release_held_if_due(self) -> None:
        with self._lock:
            due = self._hold.release_if_due(self._clock.now(), self._sealed_at, self._ranks)
        if due is not None:
            self._run_held(*due)

    def release_held(self, reason: str) -> None:
        """Run a held failure persist now, if one is held (`SaverConfig.failure_persist_hold_s`).

        The agent calls it when the job's membership changes: the run's saver may be replaced
        then, and a replaced saver no longer commits.
        """
        with self._lock:
            held = self._hold.release()
        if held is not None:
            self._run_held(held, reason)

    def _run_held(self, held: HeldFailure, reason: str) -> None:
        step = -1 if held.step is None else held.step
        self._record("failure_persist_released", step, reason)
        self._submit(_Job("failure", step=step))

    def _persist_on_failure(self, preferred: int | None) -> None:
        with self._lock:
            ranks = set(self._ranks)
        if len(ranks) < self.config.world_size:
            self._join_until = self._clock.now() + self.config.failure_join_s
        held = {r: self.held_steps(r) for r in ranks}
        step, reason = choose_failure_step(held, ranks, self._persisted_by_all(ranks), preferred)
        committed = None if step is None else self._committed_already(step)
        if committed is not None:
            reason = f"{reason}; nothing to write: {committed}"
        self._record("failure_persist", -1 if step is None else step, reason)
        if step is None or committed is not None:
            return
        self._persist_every_rank(step, ranks, "persist on failure")

    def _persisted_by_all(self, ranks: set[int]) -> set[int]:
        return {s for s in {s for _, s in self._persisted} if all((r, s) in self._persisted for r in ranks)}

    def _persist_every_rank(self, step: int, ranks: set[int], why: str) -> None:
        """Persist every one of `ranks`' snapshots of `step` from memory, then try to commit it."""
        # Every rank's snapshot is held before the first is written: the restarted processes stage
        # into their other slot meanwhile, and cannot write over a rank still waiting its turn
        # (their next-but-one save waits for it, as their busy policy says).
        snapshots: dict[int, _HeldSnapshot] = {}
        try:
            for rank in sorted(ranks):
                if (rank, step) in self._persisted:
                    continue
                found = self._hold_snapshot(rank, step)
                if isinstance(found, str):
                    self._record("persist_failed", step, f"{why}: {found}")
                    return
                snapshots[rank] = found
            for rank in sorted(snapshots):
                ok, reason = self._persist_held(rank, step, snapshots.pop(rank))
                if not ok:
                    self._record("persist_failed", step, f"{why}: {reason}")
                    return
        finally:
            for snapshot in snapshots.values():
                snapshot.release()
        self._try_commit(step)

    def _join_other_nodes(self) -> None:
        """Within `SaverConfig.failure_join_s` of a failure persist, write the uncommitted steps
        other nodes' savers persisted that this node's ranks all hold (`steps_to_join`)."""
        if self._clock.now() > self._join_until:
            return
        with self._lock:
            ranks = set(self._ranks)
        try:
            tracker = self.committer.tracker()
            _, partial = self.committer.steps()
            uncommitted = {s: self.committer.done_ranks(s) for s in partial if tracker is None or s > tracker.step}
        except FlashCkptError:
            return  # storage unreadable now: the next tick looks again
        if not uncommitted:
            return  # nothing to join: no slot headers to read
        held = {r: self.held_steps(r) for r in ranks}
        for step, reason in steps_to_join(uncommitted, ranks, held, self._persisted_by_all(ranks) | self._joined):
            self._joined.add(step)
            self._record("failure_persist_join", step, reason)
            self._persist_every_rank(step, ranks, "joining another node's failure persist")


@attrs.define
class _HeldSnapshot:
    """One rank's complete snapshot in memory, held by the saver's shared lock on its slot."""

    slot: int
    seg: ShmSegment
    header: SlotHeader

    released: bool = False

    def release(self) -> None:
        """Let the slot go (the stager may write it again); later calls do nothing."""
        if self.released:
            return
        self.released = True
        try:
            self.seg.unlock()
        finally:
            self.seg.close()


def _header(seg: ShmSegment) -> SlotHeader | None:
    try:
        return read_header(seg)
    except LayoutError:
        return None


def _int(msg: dict[str, Any], key: str) -> int:
    value = msg.get(key)
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ChannelError(f"message {msg.get('type')!r} needs a non-negative integer {key!r}, got {value!r}")
    return value
