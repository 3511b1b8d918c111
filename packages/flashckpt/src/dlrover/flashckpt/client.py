"""The stager's side of the local channel, and starting a detached saver when none runs."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import attrs

from dlrover.common import Clock, SystemClock
from dlrover.common.validators import non_negative_finite, non_negative_int
from dlrover.flashckpt.channel import ChannelError, recv_message, send_message, unix_address
from dlrover.flashckpt.commit import RetentionPolicy
from dlrover.flashckpt.errors import SaverUnavailableError
from dlrover.flashckpt.events import EventLog, FlashEvent
from dlrover.flashckpt.pacing import default_persist_bandwidth_mb_s
from dlrover.flashckpt.saver import socket_path
from dlrover.flashckpt.segment import SEGMENT_PREFIX
from dlrover.flashckpt.stager import SealedNotice
from dlrover.flashckpt.storage.location import STORAGE_OPTIONS_ENV_VAR

__all__ = ["KEPT_PERSIST_OUTCOMES", "DetachedSaverSpec", "PersistOutcome", "SaverClient", "ensure_saver"]

KEPT_PERSIST_OUTCOMES = 1024
"""The saver's answers a `SaverClient` keeps for `wait_persisted`, the newest ones: a job that
persists for weeks must not keep one per persist. Answers are waited for right after their
request, so only a caller over a thousand persists behind would miss its own."""


@attrs.frozen
class PersistOutcome:
    """The saver's answer to a persist request."""

    rank: int
    step: int
    ok: bool
    committed: bool
    reason: str


class SaverClient:
    """A stager's connection to the node's saver.

    Args:
        path: the saver's socket.
        rank: this stager's rank.
        world_size: ranks in the job.
        events: where persist outcomes are recorded.
        clock: time source for event timestamps.
        connect_timeout_s: bound on connecting and on the ``welcome`` answer.
    """

    def __init__(
        self,
        path: Path,
        rank: int,
        world_size: int,
        *,
        events: EventLog | None = None,
        clock: Clock | None = None,
        connect_timeout_s: float = 10.0,
    ) -> None:
        self.path = path
        self.rank = rank
        self.events = events or EventLog()
        self._clock = clock or SystemClock()
        self._cond = threading.Condition()
        self._outcomes: dict[int, PersistOutcome] = {}
        self._holding: set[int] = set()  # steps whose persist the saver reached, not yet answered
        self._closed = False
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            self._sock.settimeout(connect_timeout_s)
            with unix_address(path) as address:
                self._sock.connect(address)
            send_message(self._sock, {"type": "hello", "rank": rank, "world_size": world_size, "pid": os.getpid()})
            reply = recv_message(self._sock)
            if reply is None or reply["type"] != "welcome":
                raise SaverUnavailableError(f"saver at {path} answered {reply!r} instead of 'welcome'")
            self.saver_pid = int(reply.get("saver_pid", -1))
            self._sock.settimeout(None)
        except (OSError, ChannelError) as e:
            self._sock.close()
            raise SaverUnavailableError(f"cannot reach the saver at {path}: {e}") from e
        self._send_lock = threading.Lock()
        self._reader = threading.Thread(target=self._read_loop, name="flashckpt-client", daemon=True)
        self._reader.start()

    @property
    def closed(self) -> bool:
        """Whether the connection is gone (a ``saver_lost`` event says why)."""
        return self._closed

    def _send(self, msg: dict[str, Any]) -> None:
        if self._closed:
            raise SaverUnavailableError(f"the connection to the saver at {self.path} is closed")
        try:
            with self._send_lock:
                send_message(self._sock, msg)
        except OSError as e:
            raise SaverUnavailableError(f"the saver at {self.path} is gone: {e}") from e

    def _read_loop(self) -> None:
        try:
            while True:
                msg = recv_message(self._sock)
                if msg is None:
                    if not self._closed:
                        self._record("saver_lost", -1, "the saver closed the connection")
                    break
                if msg["type"] == "holding":
                    with self._cond:
                        self._holding.add(int(msg.get("step", -1)))
                        self._cond.notify_all()
                elif msg["type"] in ("persisted", "persist_failed"):
                    ok = msg["type"] == "persisted"
                    outcome = PersistOutcome(
                        int(msg.get("rank", -1)),
                        int(msg.get("step", -1)),
                        ok,
                        bool(msg.get("committed", False)),
                        str(msg.get("reason", "")),
                    )
                    self._record("persisted" if ok else "persist_failed", outcome.step, outcome.reason)
                    with self._cond:
                        self._outcomes.pop(outcome.step, None)  # a repeat is the newest
                        self._outcomes[outcome.step] = outcome
                        while len(self._outcomes) > KEPT_PERSIST_OUTCOMES:
                            del self._outcomes[next(iter(self._outcomes))]
                        self._holding.discard(outcome.step)
                        self._cond.notify_all()
                elif msg["type"] == "error":
                    self._record("saver_error", -1, str(msg.get("reason")))
        except (OSError, ChannelError) as e:
            if not self._closed:
                self._record("saver_lost", -1, f"connection to the saver broke: {e}")
        finally:
            with self._cond:
                self._closed = True
                self._cond.notify_all()

    def _record(self, kind: str, step: int, reason: str) -> None:
        self.events.record(FlashEvent(kind, step, reason, self._clock.wall_time()))

    def notify_sealed(self, notice: SealedNotice) -> None:
        """Tell the saver a snapshot is final (the stager's ``on_sealed`` callback).

        Raises:
            SaverUnavailableError: the saver is gone.
        """
        self._send({"type": "sealed", "rank": notice.rank, "slot": notice.slot, "seq": notice.seq, "step": notice.step})

    def request_persist(self, step: int) -> None:
        """Ask the saver to persist this rank's snapshot of `step`.

        Raises:
            SaverUnavailableError: the saver is gone.
        """
        with self._cond:
            self._outcomes.pop(step, None)
            self._holding.discard(step)
        self._send({"type": "persist", "rank": self.rank, "step": step})

    def holding_or_done(self, step: int) -> bool:
        """Whether this rank's snapshot of `step` no longer needs keeping for the persist request:
        the saver holds it (a shared lock of its own) or found it need not, answered the request,
        or can no longer answer (the connection closed). Never blocks."""
        with self._cond:
            return step in self._holding or step in self._outcomes or self._closed

    def wait_persisted(self, step: int, timeout_s: float) -> PersistOutcome:
        """Wait for the outcome of a persist request.

        Raises:
            TimeoutError: no answer within `timeout_s`.
            SaverUnavailableError: the connection closed first.
        """
        with self._cond:
            ok = self._cond.wait_for(lambda: step in self._outcomes or self._closed, timeout=timeout_s)
            if step in self._outcomes:
                return self._outcomes[step]
        if not ok:
            raise TimeoutError(f"no answer from the saver about step {step} within {timeout_s}s")
        raise SaverUnavailableError(f"the saver at {self.path} closed the connection")

    def close(self, shutdown_saver: bool = False) -> None:
        """Detach cleanly (``bye``), optionally telling the saver the job ended (``shutdown``)."""
        with contextlib.suppress(SaverUnavailableError):
            self._send({"type": "shutdown" if shutdown_saver else "bye", "rank": self.rank})
        self._closed = True
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._reader.join(10)
        self._sock.close()


@attrs.frozen
class DetachedSaverSpec:
    """How to start a detached saver (used when no ``dlrover-run`` agent hosts one).

    Attributes:
        job_id: the job.
        run_id: the run.
        world_size: ranks in the job.
        storage_dir: where checkpoints go: a POSIX directory, or an fsspec URL such as
            ``s3://bucket/prefix`` (see `StorageLocation`).
        shm_dir: where segments and the socket live.
        idle_exit_s: the saver exits (removing the run's memory) after this long with no stager,
            or this long after its start if no stager ever connects.
        start_timeout_s: how long to wait for its socket.
        log_path: where its log goes (None: discarded).
        nice: niceness added to the saver, so persisting yields the CPU to training (0: none). The
            saver runs in a session of its own, so it also gives its session's autogroup this
            niceness (see `dlrover.flashckpt.priority`).
        coordinator: whether this node's saver moves the tracker (exactly one node's does).
        persist_bandwidth_mb_s: the saver's persist rate cap in MB/s (default: 256 per CPU this
            process may use; 0: none; see `SaverConfig`).
        storage_options: for a URL, the fsspec filesystem's options (for a POSIX directory,
            `PosixStorage`'s write settings that differ from their defaults); they reach the saver through
            its environment (`STORAGE_OPTIONS_ENV_VAR`), never its command line, which every
            user of the machine can read.
        keep_last: retention: the saver keeps the last N committed checkpoints (0: all).
        keep_every: retention: and every K-th step (0: none besides the last N).
        failure_join_s: how long after a failure persist the saver writes steps other nodes
            persisted (see `SaverConfig.failure_join_s`; 0: never).
    """

    job_id: str
    run_id: str
    world_size: int
    storage_dir: str
    shm_dir: str = "/dev/shm"  # noqa: S108 (the POSIX shared-memory mount)
    idle_exit_s: float = 60.0
    start_timeout_s: float = 30.0
    log_path: str | None = None
    nice: int = 19
    coordinator: bool = True
    persist_bandwidth_mb_s: float = attrs.field(factory=default_persist_bandwidth_mb_s, validator=non_negative_finite)
    storage_options: Mapping[str, Any] = attrs.field(factory=dict, repr=False)
    keep_last: int = attrs.field(default=0, validator=non_negative_int)
    keep_every: int = attrs.field(default=0, validator=non_negative_int)
    failure_join_s: float = attrs.field(default=120.0, validator=non_negative_finite)

    def __attrs_post_init__(self) -> None:
        RetentionPolicy.from_counts(self.keep_last, self.keep_every)  # raises ConfigError


def ensure_saver(spec: DetachedSaverSpec, rank: int, clock: Clock | None = None) -> SaverClient:
    """Connect to the run's saver, starting a detached one first if none answers.

    Concurrent first stagers on a node serialise on a lock file, so exactly one saver starts.

    Raises:
        SaverUnavailableError: the saver did not come up within `spec.start_timeout_s`.
    """
    clock = clock or SystemClock()
    path = socket_path(spec.shm_dir, spec.job_id, spec.run_id)
    with contextlib.suppress(SaverUnavailableError):
        return SaverClient(path, rank, spec.world_size, clock=clock)
    lock_path = Path(spec.shm_dir) / f"{SEGMENT_PREFIX}{spec.job_id}.{spec.run_id}.spawnlock"
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        with contextlib.suppress(SaverUnavailableError):
            return SaverClient(path, rank, spec.world_size, clock=clock)
        _spawn(spec)
        deadline = clock.now() + spec.start_timeout_s
        while True:
            try:
                return SaverClient(path, rank, spec.world_size, clock=clock)
            except SaverUnavailableError:
                if clock.now() >= deadline:
                    raise
                clock.sleep(0.05)
    finally:
        # The lock file stays (unlinking it would let a late opener lock a different file); it is
        # removed with the run's other files.
        os.close(fd)


def _spawn(spec: DetachedSaverSpec) -> None:
    args = [
        sys.executable,
        "-m",
        "dlrover.flashckpt.saver_main",
        "--job",
        spec.job_id,
        "--run",
        spec.run_id,
        "--world-size",
        str(spec.world_size),
        "--storage-dir",
        spec.storage_dir,
        "--shm-dir",
        spec.shm_dir,
        "--idle-exit-s",
        str(spec.idle_exit_s),
        "--nice",
        str(spec.nice),
        "--persist-bandwidth-mb-s",
        repr(float(spec.persist_bandwidth_mb_s)),
        "--keep-last",
        str(spec.keep_last),
        "--keep-every",
        str(spec.keep_every),
        "--failure-join-s",
        repr(float(spec.failure_join_s)),
        *([] if spec.coordinator else ["--not-coordinator"]),
    ]
    env = dict(os.environ)
    env.pop(STORAGE_OPTIONS_ENV_VAR, None)
    if spec.storage_options:
        env[STORAGE_OPTIONS_ENV_VAR] = json.dumps(dict(spec.storage_options))
    out = open(spec.log_path, "ab") if spec.log_path else subprocess.DEVNULL  # noqa: SIM115
    try:
        # A new session: the saver survives the training process and its signals.
        subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True, env=env)
    finally:
        if out is not subprocess.DEVNULL:
            out.close()  # type: ignore[union-attr]
