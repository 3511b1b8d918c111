"""``python -m dlrover.flashckpt.saver_main``: a detached saver for one run on this node.

Started by the first stager on a node when no ``dlrover-run`` agent hosts a saver. It exits, and
removes the run's shared memory, on a ``shutdown`` message, on SIGTERM/SIGINT, once no stager
has been attached for ``--idle-exit-s`` seconds (after persisting on failure if one died), or when
no stager has connected at all within ``--first-connect-timeout-s`` (its starter died first).

Test seams (faults enter at the storage seam, never by patching internals):

* ``DLROVER_FLASHCKPT_FAULT_EXIT_BEFORE=<suffix>:<n>`` (e.g. ``tracker.json:2``): exit abruptly
  just before the n-th write of a path ending with the suffix, like a saver killed mid-commit.
* ``DLROVER_FLASHCKPT_FAULT_PAUSE_BEFORE=<suffix>:<n>``: before that write, create
  ``<storage>/.fault-paused`` and wait until ``<storage>/.fault-resume`` exists, so a test can act
  while a persist is provably half done.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import signal
import threading
import time
from collections.abc import Iterable
from types import FrameType

from dlrover.common import ConfigError, SystemClock, configure_logging
from dlrover.flashckpt.commit import RetentionPolicy
from dlrover.flashckpt.errors import FlashCkptError
from dlrover.flashckpt.pacing import persist_bandwidth_or_default
from dlrover.flashckpt.priority import lower_process_priority
from dlrover.flashckpt.saver import Saver, SaverConfig
from dlrover.flashckpt.storage.base import Chunk, Storage
from dlrover.flashckpt.storage.location import STORAGE_OPTIONS_ENV_VAR, StorageLocation
from dlrover.flashckpt.storage.posix import PosixStorage

__all__ = ["main"]

FAULT_EXIT_ENV = "DLROVER_FLASHCKPT_FAULT_EXIT_BEFORE"
FAULT_PAUSE_ENV = "DLROVER_FLASHCKPT_FAULT_PAUSE_BEFORE"


def _parse_fault(value: str | None) -> tuple[str, int] | None:
    if not value:
        return None
    suffix, _, nth = value.rpartition(":")
    return (suffix, int(nth)) if suffix else (value, 1)


class _FaultyStorage(PosixStorage):
    def __init__(self, root: str, exit_before: tuple[str, int] | None, pause_before: tuple[str, int] | None) -> None:
        super().__init__(root)
        self._faults = {"exit": exit_before, "pause": pause_before}
        self._counts: dict[str, int] = {"exit": 0, "pause": 0}

    def _hit(self, kind: str, path: str) -> bool:
        fault = self._faults[kind]
        if fault is None or not path.endswith(fault[0]):
            return False
        self._counts[kind] += 1
        return self._counts[kind] == fault[1]

    def write_file(self, path: str, chunks: Iterable[Chunk]) -> int:
        if self._hit("exit", path):
            os._exit(70)
        if self._hit("pause", path):
            (self.root / ".fault-paused").write_text(path)
            while not (self.root / ".fault-resume").exists():
                time.sleep(0.02)
        return super().write_file(path, chunks)


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--job", required=True)
    p.add_argument("--run", required=True)
    p.add_argument("--world-size", type=int, default=1)
    p.add_argument(
        "--storage-dir",
        required=True,
        help=f"a POSIX directory or an fsspec URL like s3://bucket/dir (options: JSON in ${STORAGE_OPTIONS_ENV_VAR})",
    )
    p.add_argument("--shm-dir", default="/dev/shm")  # noqa: S108 (the POSIX shared-memory mount)
    p.add_argument("--idle-exit-s", type=float, default=60.0)
    p.add_argument(
        "--first-connect-timeout-s",
        type=float,
        default=None,
        help="exit if no stager connects within this many seconds of start (default: --idle-exit-s)",
    )
    p.add_argument("--lock-timeout-s", type=float, default=60.0)
    p.add_argument("--keep-last", type=int, default=0, help="retention: keep the last N (0: keep all)")
    p.add_argument("--keep-every", type=int, default=0, help="retention: also keep every K-th step")
    p.add_argument(
        "--not-coordinator",
        action="store_true",
        help="another node's saver moves the tracker (one saver per job coordinates)",
    )
    p.add_argument(
        "--nice",
        type=int,
        default=19,
        help="raise the saver's niceness by this much, so persisting yields the CPU to training (0: off)",
    )
    p.add_argument(
        "--persist-bandwidth-mb-s",
        type=float,
        default=None,
        help="cap on the rate a persist writes at, in MB/s (default: 256 per CPU the saver may use; "
        "0: none, the disk's speed)",
    )
    p.add_argument(
        "--failure-join-s",
        type=float,
        default=120.0,
        help="after a failure persist, write steps other nodes persisted for this long (0: never)",
    )
    args = p.parse_args(argv)
    if not math.isfinite(args.failure_join_s) or args.failure_join_s < 0:
        p.error(f"--failure-join-s must be a non-negative number of seconds, got {args.failure_join_s!r}")
    if args.first_connect_timeout_s is None:
        args.first_connect_timeout_s = args.idle_exit_s
    bounds = (("--idle-exit-s", args.idle_exit_s), ("--first-connect-timeout-s", args.first_connect_timeout_s))
    for flag, value in bounds:
        if not math.isfinite(value) or value <= 0:
            p.error(f"{flag} must be a positive number of seconds, got {value!r}")
    return args


def _open_storage(url: str, options_json: str) -> Storage:
    options = json.loads(options_json) if options_json else {}
    location = StorageLocation(url if "://" in url else os.path.abspath(url), options)
    exit_before = _parse_fault(os.environ.get(FAULT_EXIT_ENV))
    pause_before = _parse_fault(os.environ.get(FAULT_PAUSE_ENV))
    if (exit_before or pause_before) and location.is_posix:
        return _FaultyStorage(location.url, exit_before, pause_before)
    return location.open()


def main(argv: list[str] | None = None) -> int:
    """Run a saver until shutdown, a signal, idleness, or no first stager; returns the exit status."""
    args = _parse_args(argv)
    first_connect_s: float = args.first_connect_timeout_s
    configure_logging()
    log = logging.getLogger("dlrover.flashckpt.saver")
    # This process leads a session of its own: niceness alone would not rank it below training.
    _, why = lower_process_priority(min(19, max(0, args.nice)))
    log.info("saver priority: %s", why)
    try:
        retention = RetentionPolicy.from_counts(args.keep_last, args.keep_every)
        config = SaverConfig(
            job_id=args.job,
            run_id=args.run,
            world_size=args.world_size,
            shm_dir=args.shm_dir,
            lock_timeout_s=args.lock_timeout_s,
            retention=retention,
            coordinator=not args.not_coordinator,
            failure_join_s=args.failure_join_s,
            persist_bandwidth_mb_s=persist_bandwidth_or_default(args.persist_bandwidth_mb_s),
        )
    except ConfigError as e:
        log.error("bad saver settings: %s", e)
        return 2
    try:
        storage = _open_storage(args.storage_dir, os.environ.pop(STORAGE_OPTIONS_ENV_VAR, ""))
    except (FlashCkptError, OSError, ValueError) as e:
        log.error("cannot open storage %r: %s", args.storage_dir, e)
        return 2
    saver = Saver(config, storage)
    stop = threading.Event()

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    saver.start()
    log.info("flashckpt saver for %s/%s listening on %s", args.job, args.run, saver.socket_path)
    clock = SystemClock()
    started = clock.now()
    idle_since: float | None = None
    while not stop.is_set() and not saver.wait_shutdown(0.05):
        if not saver.connections_seen:
            # Without this, a saver whose starter died before connecting would run forever.
            if clock.now() - started >= first_connect_s:
                log.info("no stager connected within %.1fs: exiting", first_connect_s)
                break
        elif saver.active_connections() == 0 and saver.wait_idle(0):
            idle_since = clock.now() if idle_since is None else idle_since
            if clock.now() - idle_since >= args.idle_exit_s:
                log.info("no stager attached for %.1fs: exiting", args.idle_exit_s)
                break
        else:
            idle_since = None
    saver.stop(remove_memory=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
