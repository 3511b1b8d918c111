"""`CheckpointMirror`: `checkpoint_mirror.mirror_once` run every `poll_s` in a thread of its own, or on demand
with a time limit, and what its passes committed.

Its status says the newest checkpoint in the destination and when it was committed, and a problem: a pass that
failed (storage unwritable, the source gone), a state file no pass can copy, or one left behind several passes in
a row (the chief saves faster than its checkpoints are copied). The thread never ends on an error: it is said and
tried again. With `record`, it keeps the digests of the destination's state files in a file of the source after
each pass that changed them, so a master that finds the source later can tell whether the destination moved on.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import threading
from pathlib import Path

import attrs

from dlrover.common import Clock
from dlrover.master.psjob.checkpoint_mirror import (
    PARTIAL_SUFFIX,
    MirrorMemo,
    MirrorPass,
    mirror_once,
    state_digests,
)
from dlrover.master.psjob.state_file import STATE_FILE
from dlrover.master.psjob.tf_checkpoint import CheckpointReadError, newest_checkpoint

__all__ = ["BEHIND_PASSES", "CheckpointMirror", "MirrorStatus", "read_record", "write_record"]

_log = logging.getLogger(__name__)


def write_record(path: Path, digests: dict[str, str]) -> None:
    """Write the digests of the destination's state files (`state_digests`) to `path`, atomically."""
    partial = path.with_name(path.name + PARTIAL_SUFFIX)
    partial.write_text(json.dumps(digests, sort_keys=True), encoding="utf-8")
    os.replace(partial, path)


def read_record(path: Path) -> dict[str, str] | None:
    """What `write_record` wrote; None when there is no such file or it is not one."""
    try:
        found = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(found, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in found.items()):
        return None
    return found


@attrs.frozen
class MirrorStatus:
    """Where a `CheckpointMirror` stands.

    Attributes:
        committed: the newest checkpoint in the destination (`newest_checkpoint`; None: none yet).
        committed_wall_time: when it was committed there (wall seconds; the state file's modification time where
            this mirror did not write it).
        problem: why the last pass failed, or why state files have been left behind `BEHIND_PASSES` passes in a
            row ("" when neither).
        newest_bytes: the bytes of the source's newest checkpoint at the last pass.
        passes: passes run so far.
        running_since: when (the clock's `now()`) the pass under way began; None between passes.
    """

    committed: Path | None = None
    committed_wall_time: float = 0.0
    problem: str = ""
    newest_bytes: int = 0
    passes: int = 0
    running_since: float | None = None


BEHIND_PASSES = 3
"""Passes in a row that leave a state file behind before it is a problem (one is a save racing the pass)."""


class CheckpointMirror:
    """Runs `mirror_once(source, dest)` every `poll_s` in a thread of its own (`start`), or on demand (`sync`).

    Args:
        source: the directory the chief saves in.
        dest: the storage directory copied to.
        poll_s: seconds between passes.
        clock: the wall time of commits, the start of a pass.
        ignored: names neither copied nor deleted.
        sentinel: a file that must be in `source` for a pass to run (`mirror_once`).
        record: a file of `source` (among `ignored`) to keep the digests of the destination's state files in,
            rewritten after each pass that changed them: a master that finds the source later can tell whether
            the destination moved on without it.
    """

    def __init__(
        self,
        source: Path,
        dest: Path,
        *,
        poll_s: float,
        clock: Clock,
        ignored: frozenset[str] = frozenset(),
        sentinel: str | None = None,
        record: str | None = None,
    ) -> None:
        self._source, self._dest, self._poll_s, self._clock = source, dest, poll_s, clock
        self._ignored, self._sentinel, self._record = ignored, sentinel, record
        self._recorded: dict[str, str] | None = None
        self._behind_passes = 0
        self._memo = MirrorMemo()
        self._lock = threading.Lock()  # one pass at a time
        self._status_lock = threading.Lock()
        self._status = MirrorStatus()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def status(self) -> MirrorStatus:
        """The newest committed checkpoint and the last pass's problem (thread-safe)."""
        with self._status_lock:
            return self._status

    def start(self) -> None:
        """Run a pass every `poll_s` in the background until `close()` (the first after `poll_s`)."""
        if self._thread is None:
            # Each run of passes has its own stop event: a mirror closed before a move to storage that
            # failed runs again, while a pass of the closed run may still be finishing (see `close`).
            stop = self._stop = threading.Event()
            self._thread = threading.Thread(
                target=self._loop, args=(stop,), name="dlrover-checkpoint-mirror", daemon=True
            )
            self._thread.start()

    def sync(self, *, final: bool = False) -> MirrorPass:
        """One pass now (after any under way); thread-safe. `final`: the source's writers have ended
        (`mirror_once`).

        Raises:
            OSError: the pass failed (also in `status.problem`).
        """
        with self._lock:
            with self._status_lock:
                self._status = attrs.evolve(self._status, running_since=self._clock.now())
            try:
                done = mirror_once(self._source, self._dest, ignored=self._ignored, memo=self._memo,
                                   sentinel=self._sentinel, final=final)  # fmt: skip
            except OSError as exc:
                self._set_problem(str(exc))
                self._keep_record()  # (a pass that failed after it wrote a state file changed storage too)
                raise
            if done.committed or done.deleted_files or self._recorded is None:  # only these change state files
                self._keep_record()
            self._behind_passes = self._behind_passes + 1 if done.behind else 0
            with self._status_lock:
                committed, when = self._status.committed, self._status.committed_wall_time
            if done.committed or committed is None:
                committed, when = self._newest_in_dest(written_now=bool(done.committed), when=when)
            problems = [f"state file {s} is not copied" for s in done.skipped]
            if self._behind_passes >= BEHIND_PASSES:
                problems += [f"state file {b} ({self._behind_passes} passes in a row: the chief saves faster than "
                             "its checkpoints are copied)" for b in done.behind]  # fmt: skip
            with self._status_lock:
                self._status = MirrorStatus(committed, when, "; ".join(problems),
                                            done.newest_bytes or self._status.newest_bytes,
                                            self._status.passes + 1)  # fmt: skip
            return done

    def _keep_record(self) -> None:
        """Record the digests of the destination's state files in the source. A record that cannot be written is
        left as it was: a master that finds it stale discards the source rather than trust it (the safe side)."""
        if self._record is None or (self._sentinel is not None and not (self._source / self._sentinel).is_file()):
            return  # (a source that lost its sentinel is not the one mirrored: nothing is written into it)
        with contextlib.suppress(OSError):
            digests = state_digests(self._dest, self._ignored)
            if digests != self._recorded:
                write_record(self._source / self._record, digests)
                self._recorded = digests

    def sync_within(self, timeout_s: float, *, final: bool = False) -> tuple[MirrorPass | None, str]:
        """One pass, waiting at most `timeout_s` for it: (its result, "") or (None, why it failed or did not
        finish; a pass still under way goes on in the background)."""
        result: list[MirrorPass] = []
        failure: list[str] = []

        def run() -> None:
            try:
                result.append(self.sync(final=final))
            except Exception as exc:  # reported to the caller, whatever it is
                failure.append(str(exc))

        worker = threading.Thread(target=run, name="dlrover-checkpoint-mirror-last", daemon=True)
        worker.start()
        worker.join(timeout_s)
        if worker.is_alive():
            return None, f"the copy did not finish within {timeout_s:g} s"
        return (result[0], "") if result else (None, failure[0] if failure else "the copy failed")

    def _set_problem(self, problem: str) -> None:
        with self._status_lock:
            self._status = attrs.evolve(self._status, problem=problem, passes=self._status.passes + 1,
                                        running_since=None)  # fmt: skip

    def _newest_in_dest(self, *, written_now: bool, when: float) -> tuple[Path | None, float]:
        try:
            newest = newest_checkpoint(self._dest)
        except CheckpointReadError:
            return None, 0.0
        if newest is None:
            return None, 0.0
        if written_now:
            return newest, self._clock.wall_time()
        try:
            return newest, when or (newest.parent / STATE_FILE).stat().st_mtime
        except OSError:
            return newest, when

    def _loop(self, stop: threading.Event) -> None:
        while not stop.wait(self._poll_s):
            try:
                self.sync()
            except OSError:
                continue  # in status; the next pass tries again
            except Exception as exc:  # a defect must not end the copies unseen: said, and tried again
                _log.exception("a checkpoint mirror pass failed")
                self._set_problem(f"{type(exc).__name__}: {exc}")

    def close(self, timeout_s: float | None = None) -> bool:
        """Stop the background passes, waiting at most `timeout_s` (None: as long as it takes) for a pass
        under way; idempotent. Returns whether they ended: False when a pass outlived the wait (storage
        that hangs); it ends on its own when that pass does, and no other pass starts."""
        self._stop.set()
        thread, self._thread = self._thread, None
        if thread is None:
            return True
        thread.join(timeout_s)
        return not thread.is_alive()
