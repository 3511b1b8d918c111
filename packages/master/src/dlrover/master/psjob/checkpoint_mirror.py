"""Copy a TensorFlow checkpoint directory to another, so that the copy only ever names complete checkpoints.

A TensorFlow save writes its data files and index into `<prefix>_temp/` and renames them into place, then names
the checkpoint in the directory's `checkpoint` state file (written to `checkpoint.tmp<hex>` and renamed). The state
file is the commit point. `mirror_once` keeps the destination's state files naming complete checkpoints only:

1. it reads every state file first, then lists the files: a checkpoint a state file names was complete before the
   listing, so every one of its files is listed unless it was dropped since;
2. it copies every other file the destination lacks or holds another version of (a copy keeps the source's
   modification time; `MirrorMemo` remembers what was copied, for file systems with coarser times), each to a
   temporary name, flushed to disk, then renamed;
3. it writes a state file once the newest checkpoint it names is complete in the destination (the index, and data
   files 0 to n-1 of the n their names give). Older checkpoints it names that are not (`CheckpointManager` names
   the one it is about to delete until its next write) are left out of the copy, with their timestamps; paths
   written absolute are made relative when they lie in the state file's directory;
4. only then it deletes what the source dropped: files an earlier pass saw in the source (others, written to the
   destination by someone else, are not the mirror's), never a state file, and never a file of a checkpoint a
   destination state file names.

A crash at any point leaves the destination's state files naming complete checkpoints. Saves in progress (`_temp`
directories, `.tmp` and `.tempstate` files) are never copied; this module's own partial copies left by a crash
are removed. Files the program writes beside its checkpoints (a data position, ...) are copied too.

`CheckpointMirror` runs passes in a thread of its own, every `poll_s`, and reports what it committed.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import stat
import threading
from collections.abc import Iterable
from pathlib import Path, PurePosixPath

import attrs

from dlrover.common import Clock
from dlrover.master.psjob.state_file import STATE_FILE, named_paths, state_copy
from dlrover.master.psjob.tf_checkpoint import CheckpointReadError, newest_checkpoint

__all__ = ["CheckpointMirror", "MirrorMemo", "MirrorPass", "MirrorStatus", "checkpoint_files", "mirror_once"]

_log = logging.getLogger(__name__)

PARTIAL_SUFFIX = ".dlrover-partial"
# TensorFlow's saves in progress: `ckpt-3_temp/` (and TF1's `ckpt-3_temp_<hex>/`), an index being merged
# (`ckpt-3.index.tempstate<n>`), a state file being written (`checkpoint.tmp<hex>`); and this module's own copies.
_IN_PROGRESS = re.compile(r"(_temp(_[0-9a-f]+)?$|\.tmp|\.tempstate|" + re.escape(PARTIAL_SUFFIX) + "$)")
_CHUNK_BYTES = 1 << 30
_DATA_FILE = re.compile(r"\.data-(\d+)-of-(\d+)$")


def in_progress(name: str) -> bool:
    """Whether a file or directory name is one of a save in progress (or a partial copy of this module's)."""
    return _IN_PROGRESS.search(name) is not None


def _raise(error: OSError) -> None:
    raise error


def _listing(root: Path, ignored: frozenset[str], partials: list[Path] | None = None) -> dict[str, os.stat_result]:
    """Every regular file under `root` (relative POSIX paths), saves in progress and `ignored` names left out (this
    module's partial copies put in `partials` when given). A root that cannot be walked raises OSError."""
    found: dict[str, os.stat_result] = {}
    for directory, subdirs, files in os.walk(root, onerror=_raise):
        subdirs[:] = [d for d in subdirs if d not in ignored and not in_progress(d)]
        base = Path(directory)
        for name in files:
            if partials is not None and name.endswith(PARTIAL_SUFFIX):
                partials.append(base / name)
            if name in ignored or in_progress(name):
                continue
            try:
                st = (base / name).lstat()
            except FileNotFoundError:  # deleted since it was listed
                continue
            if stat.S_ISREG(st.st_mode):
                found[(base / name).relative_to(root).as_posix()] = st
    return found


def _is_state(rel: str) -> bool:
    return PurePosixPath(rel).name == STATE_FILE


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _copy(src: Path, dst: Path) -> int:
    """Copy `src` to `dst` through a temporary name, flushed to disk, with `src`'s modification time as it was when
    opened (a change during the copy that moves it leaves them different: the next pass copies again). Returns the
    bytes."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    partial = dst.with_name(dst.name + PARTIAL_SUFFIX)
    with open(src, "rb") as fin:
        st = os.fstat(fin.fileno())
        try:
            with open(partial, "wb") as fout:
                copied = 0
                while copied < st.st_size:
                    sent = os.sendfile(fout.fileno(), fin.fileno(), copied, min(_CHUNK_BYTES, st.st_size - copied))
                    if sent == 0:  # shrunk while copied: the next pass sees its new size
                        break
                    copied += sent
                fout.flush()
                os.fsync(fout.fileno())
            os.utime(partial, ns=(st.st_atime_ns, st.st_mtime_ns))
            os.replace(partial, dst)
        except BaseException:
            with contextlib.suppress(OSError):
                partial.unlink()
            raise
    return copied


def _write_state(text: bytes, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    partial = dst.with_name(dst.name + PARTIAL_SUFFIX)
    with open(partial, "wb") as out:
        out.write(text)
        out.flush()
        os.fsync(out.fileno())
    os.replace(partial, dst)
    _fsync_dir(dst.parent)


def _complete(files: Iterable[str]) -> bool:
    """Whether a checkpoint's files are all there: its index, and data files 0 to n-1 of the n their names give."""
    shards: set[tuple[int, int]] = set()
    has_index = False
    for rel in files:
        has_index = has_index or rel.endswith(".index")
        found = _DATA_FILE.search(rel)
        if found:
            shards.add((int(found.group(1)), int(found.group(2))))
    counts = {n for _i, n in shards}
    return has_index and len(counts) == 1 and {i for i, _n in shards} == set(range(counts.pop()))


def checkpoint_files(listing: Iterable[str], state_rel: str, named: str) -> set[str]:
    """The files of checkpoint `named` (relative to the directory of the state file at `state_rel`) among
    `listing`'s paths: its index and data files, `<prefix>.*`."""
    prefix = (PurePosixPath(state_rel).parent / named).as_posix()
    return {rel for rel in listing if rel.startswith(prefix + ".")}


@attrs.define
class MirrorMemo:
    """What a mirror remembers between its passes.

    Attributes:
        copied: for each file copied, (source size, source mtime_ns, destination size, destination mtime_ns) as
            they were right after the copy: unchanged on both sides, it is not copied again even where the
            destination keeps coarser times.
        seen: every file some pass listed in the source; only those are ever deleted from the destination.
    """

    copied: dict[str, tuple[int, int, int, int]] = attrs.field(factory=dict)
    seen: set[str] = attrs.field(factory=set)


@attrs.frozen
class MirrorPass:
    """What one pass of `mirror_once` did.

    Attributes:
        copied_files: files copied (new or changed).
        copied_bytes: their bytes.
        deleted_files: files deleted from the destination (the source dropped them).
        committed: the state files written (relative paths).
        behind: state files not written yet, and why (`path: reason`): their newest checkpoint is not complete
            in the source (dropped meanwhile: a newer state file names others, which the next pass writes).
        skipped: state files no pass can copy, and why (`path: reason`).
        newest_bytes: the bytes of the newest checkpoint a state file names (the largest where several do).
        total_bytes: the bytes of every file listed in the source.
    """

    copied_files: int = 0
    copied_bytes: int = 0
    deleted_files: int = 0
    committed: tuple[str, ...] = ()
    behind: tuple[str, ...] = ()
    skipped: tuple[str, ...] = ()
    newest_bytes: int = 0
    total_bytes: int = 0

    @property
    def caught_up(self) -> bool:
        """Whether every state file of the source is in the destination as of this pass."""
        return not self.behind and not self.skipped


def mirror_once(
    source: Path,
    dest: Path,
    *,
    ignored: frozenset[str] = frozenset(),
    memo: MirrorMemo | None = None,
    sentinel: str | None = None,
) -> MirrorPass:
    """Make `dest` hold what `source` holds, state files last and deletions after them (see the module).

    Args:
        source: the directory copied from.
        dest: the directory copied to (made when missing).
        ignored: file and directory names neither copied nor deleted (a marker of the caller's).
        memo: what earlier passes of the same mirror did (None: a first pass, which deletes nothing).
        sentinel: a file that must be in `source`: a source without it (gone, emptied by someone else) fails the
            pass, and nothing is copied or deleted.

    Raises:
        OSError: the source cannot be read (or lacks `sentinel`), or a file could not be written (a file that
            vanished from the source is no error).
    """
    memo = memo if memo is not None else MirrorMemo()
    if sentinel is not None and not (source / sentinel).is_file():
        raise FileNotFoundError(f"{source / sentinel} is missing: the source is gone or not the one mirrored")
    states: dict[str, bytes] = {}
    for rel in sorted(r for r in _listing(source, ignored) if _is_state(r)):
        with contextlib.suppress(FileNotFoundError):
            states[rel] = (source / rel).read_bytes()
    listed = _listing(source, ignored)
    dest.mkdir(parents=True, exist_ok=True)
    partials: list[Path] = []
    have = _listing(dest, ignored, partials)
    for leftover in partials:  # a copy cut short by a crash
        with contextlib.suppress(FileNotFoundError):
            leftover.unlink()
    copied, copied_bytes, vanished = _copy_changed(source, dest, listed, have, memo)
    present = [rel for rel in listed if rel not in vanished]
    committed, behind, skipped, newest_bytes = _commit_states(source, dest, states, listed, present)
    protected = _named_in(dest, ignored)
    deleted = 0
    for rel in sorted((set(have) - set(listed)) & memo.seen):
        if _is_state(rel) or rel in protected:
            continue
        with contextlib.suppress(FileNotFoundError):
            (dest / rel).unlink()
            deleted += 1
        memo.copied.pop(rel, None)
    memo.seen.update(listed)
    total = sum(st.st_size for st in listed.values())
    return MirrorPass(copied, copied_bytes, deleted, committed, behind, skipped, newest_bytes, total)


def _copy_changed(
    source: Path,
    dest: Path,
    listed: dict[str, os.stat_result],
    have: dict[str, os.stat_result],
    memo: MirrorMemo,
) -> tuple[int, int, set[str]]:
    """Copy every file but the state files that `dest` lacks or holds another version of; (files copied, their
    bytes, those that left the source meanwhile)."""
    copied = copied_bytes = 0
    vanished: set[str] = set()
    for rel, st in listed.items():
        if _is_state(rel):
            continue
        old = have.get(rel)
        if old is not None and (
            (old.st_size, old.st_mtime_ns) == (st.st_size, st.st_mtime_ns)
            or memo.copied.get(rel) == (st.st_size, st.st_mtime_ns, old.st_size, old.st_mtime_ns)
        ):
            continue
        try:
            copied_bytes += _copy(source / rel, dest / rel)
        except FileNotFoundError:
            vanished.add(rel)
            continue
        after = (dest / rel).stat()
        memo.copied[rel] = (st.st_size, st.st_mtime_ns, after.st_size, after.st_mtime_ns)
        copied += 1
    return copied, copied_bytes, vanished


def _commit_states(
    source: Path, dest: Path, states: dict[str, bytes], listed: dict[str, os.stat_result], present: list[str]
) -> tuple[tuple[str, ...], tuple[str, ...], tuple[str, ...], int]:
    """Write each state file whose newest checkpoint is complete in `dest`; (those written, those behind, those
    that cannot be copied and why, the newest checkpoint's bytes)."""
    committed: list[str] = []
    behind: list[str] = []
    skipped: list[str] = []
    newest_bytes = 0
    for rel, text in states.items():

        def complete(named: str, rel: str = rel) -> bool:
            return _complete(checkpoint_files(present, rel, named))

        copy = state_copy(text, (source / rel).parent.as_posix(), complete)
        if copy.text is None:
            (skipped if copy.never else behind).append(f"{rel}: {copy.why}")
            continue
        written = copy.text
        newest_bytes = max(newest_bytes, sum(listed[f].st_size for f in checkpoint_files(present, rel, copy.newest)))
        target = dest / rel
        try:
            current = target.read_bytes()
        except FileNotFoundError:
            current = None
        if current != written:
            _write_state(written, target)
            committed.append(rel)
    return tuple(committed), tuple(behind), tuple(skipped), newest_bytes


def _named_in(dest: Path, ignored: frozenset[str]) -> set[str]:
    """Every file of every checkpoint a state file in `dest` names (never deleted: they are what it restores)."""
    listed = _listing(dest, ignored)
    named: set[str] = set()
    for rel in (r for r in listed if _is_state(r)):
        try:
            text = (dest / rel).read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            continue
        for _field, path in named_paths(text):
            named |= checkpoint_files(listed, rel, path)
    return named


@attrs.frozen
class MirrorStatus:
    """Where a `CheckpointMirror` stands.

    Attributes:
        committed: the newest checkpoint in the destination (`newest_checkpoint`; None: none yet).
        committed_wall_time: when it was committed there (wall seconds; the state file's modification time where
            this mirror did not write it).
        problem: why the last pass failed or left a state file behind for good ("" when it did not).
        newest_bytes: the bytes of the source's newest checkpoint at the last pass.
        passes: passes run so far.
    """

    committed: Path | None = None
    committed_wall_time: float = 0.0
    problem: str = ""
    newest_bytes: int = 0
    passes: int = 0


class CheckpointMirror:
    """Runs `mirror_once(source, dest)` every `poll_s` in a thread of its own (`start`), or on demand (`sync`).

    Args:
        source: the directory the chief saves in.
        dest: the storage directory copied to.
        poll_s: seconds between passes.
        clock: the wall time of commits.
        ignored: names neither copied nor deleted.
        sentinel: a file that must be in `source` for a pass to run (`mirror_once`).
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
    ) -> None:
        self._source, self._dest, self._poll_s, self._clock = source, dest, poll_s, clock
        self._ignored, self._sentinel = ignored, sentinel
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
            self._stop = threading.Event()  # (a mirror closed before a move to storage that failed runs again)
            self._thread = threading.Thread(target=self._loop, name="dlrover-checkpoint-mirror", daemon=True)
            self._thread.start()

    def sync(self) -> MirrorPass:
        """One pass now (after any under way); thread-safe.

        Raises:
            OSError: the pass failed (also in `status.problem`).
        """
        with self._lock:
            try:
                done = mirror_once(self._source, self._dest, ignored=self._ignored, memo=self._memo,
                                   sentinel=self._sentinel)  # fmt: skip
            except OSError as exc:
                self._set_problem(str(exc))
                raise
            with self._status_lock:
                committed, when = self._status.committed, self._status.committed_wall_time
            if done.committed or committed is None:
                committed, when = self._newest_in_dest(written_now=bool(done.committed), when=when)
            problem = "; ".join(f"state file {s} is not copied" for s in done.skipped)
            with self._status_lock:
                self._status = MirrorStatus(committed, when, problem, done.newest_bytes or self._status.newest_bytes,
                                            self._status.passes + 1)  # fmt: skip
            return done

    def sync_within(self, timeout_s: float) -> tuple[MirrorPass | None, str]:
        """One pass, waiting at most `timeout_s` for it: (its result, "") or (None, why it failed or did not
        finish; a pass still under way goes on in the background)."""
        result: list[MirrorPass] = []
        failure: list[str] = []

        def run() -> None:
            try:
                result.append(self.sync())
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
            self._status = attrs.evolve(self._status, problem=problem, passes=self._status.passes + 1)

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

    def _loop(self) -> None:
        while not self._stop.wait(self._poll_s):
            try:
                self.sync()
            except OSError:
                continue  # in status; the next pass tries again
            except Exception as exc:  # a defect must not end the copies unseen: said, and tried again
                _log.exception("a checkpoint mirror pass failed")
                self._set_problem(f"{type(exc).__name__}: {exc}")

    def close(self) -> None:
        """Stop the background passes (a pass under way finishes first); idempotent."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
