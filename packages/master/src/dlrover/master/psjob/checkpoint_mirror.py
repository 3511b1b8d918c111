"""Copy a TensorFlow checkpoint directory to another, so that the copy only ever names complete checkpoints.

A TensorFlow save writes its data files and index into `<prefix>_temp/` and renames them into place, then names
the checkpoint in the directory's `checkpoint` state file (written to `checkpoint.tmp<hex>` and renamed). The state
file is the commit point. `mirror_once` keeps the destination's state files naming complete checkpoints only:

1. it reads every state file first, then lists the files: a checkpoint a state file names was complete before the
   listing, so every one of its files is listed unless it was dropped since;
2. it copies every other file the destination lacks or holds another version of, the newest checkpoints' first
   (a copy keeps the source's modification time; `MirrorMemo` remembers what was copied, for file systems with
   coarser times), each to a temporary name, flushed to disk, then renamed. A checkpoint the program saved again
   under the same name is replaced only after the destination's state file stops naming it; a file that changed
   since the listing is not counted as there;
3. it writes a state file once the newest checkpoint it names is complete in the destination (the index, and data
   files 0 to n-1 of the n their names give). Older checkpoints it names that are not (`CheckpointManager` names
   the one it is about to delete until its next write) are left out of the copy, with their timestamps; paths
   written absolute are made relative when they lie in the state file's directory;
4. only then it deletes what the source dropped: files an earlier pass saw in the source (others, written to the
   destination by someone else, are not the mirror's), never a file of a checkpoint a destination state file
   names, and a state file only in a final pass (the program has ended: Keras drops its backup at the end of
   `fit`; while it runs, a state file gone from the source may be someone else's clean-up under way).

A crash at any point leaves the destination's state files naming complete checkpoints. Saves in progress (`_temp`
directories, `.tmp` and `.tempstate` files) are never copied; this module's own partial copies left by a crash
are removed. Files the program writes beside its checkpoints (a data position, ...) are copied too.

`mirror_thread.CheckpointMirror` runs passes in a thread of its own and reports what they committed.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import stat
from collections.abc import Iterable
from pathlib import Path, PurePosixPath

import attrs

from dlrover.master.psjob.state_file import STATE_FILE, named_paths, state_copy, state_paths

__all__ = ["MirrorMemo", "MirrorPass", "checkpoint_files", "in_progress", "mirror_once", "state_digests"]

PARTIAL_SUFFIX = ".dlrover-partial"
# TensorFlow's saves in progress: `ckpt-3_temp/` (and TF1's `ckpt-3_temp_<hex>/`), an index being merged
# (`ckpt-3.index.tempstate<n>`), a state file being written (`checkpoint.tmp<hex>`); and this module's own copies.
_IN_PROGRESS = re.compile(r"(_temp(_[0-9a-f]+)?$|\.tmp[0-9a-f]*$|\.tempstate\d*$|" + re.escape(PARTIAL_SUFFIX) + "$)")
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


def _copy(src: Path, dst: Path, listed: os.stat_result) -> tuple[int, bool]:
    """Copy `src` to `dst` through a temporary name, flushed to disk, with `src`'s modification time as it was when
    opened (a change during the copy that moves it leaves them different: the next pass copies again). Returns the
    bytes, and whether the file copied is the one `listed` (the same inode, size and time: a checkpoint saved again
    under its name since the listing is not)."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    partial = dst.with_name(dst.name + PARTIAL_SUFFIX)
    with open(src, "rb") as fin:
        st = os.fstat(fin.fileno())
        same = (st.st_ino, st.st_size, st.st_mtime_ns) == (listed.st_ino, listed.st_size, listed.st_mtime_ns)
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
    return copied, same


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
    final: bool = False,
) -> MirrorPass:
    """Make `dest` hold what `source` holds, state files last and deletions after them (see the module).

    Args:
        source: the directory copied from.
        dest: the directory copied to (made when missing).
        ignored: file and directory names neither copied nor deleted (a marker of the caller's).
        memo: what earlier passes of the same mirror did (None: a first pass, which deletes nothing).
        sentinel: a file that must be in `source`: a source without it (gone, emptied by someone else) fails the
            pass, and nothing is copied or deleted (it is looked at again before the deletions).
        final: the source will not change again (its writers have ended): a state file it no longer has is
            deleted from `dest` too, with what it names (Keras removes its backup when `fit` ends). While a
            program runs that could be a clean-up of someone else's under way, so state files stay.

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
    newest_first = _newest_files(source, states, listed)
    order = sorted(listed, key=lambda rel: rel not in newest_first)  # the newest before a save drops them
    copied, copied_bytes, unstable = _copy_changed(source, dest, order, listed, have, memo=memo, ignored=ignored)
    present = [rel for rel in listed if rel not in unstable]
    committed, behind, skipped, newest_bytes = _commit_states(source, dest, states, listed, present)
    if sentinel is not None and not (source / sentinel).is_file():
        raise FileNotFoundError(f"{source / sentinel} went missing during the pass: nothing is deleted")
    deleted = 0
    if not behind:
        deleted = _delete_dropped(dest, ignored, set(have) - set(listed), memo, final=final)
    memo.seen.update(listed)
    total = sum(st.st_size for st in listed.values())
    return MirrorPass(copied, copied_bytes, deleted, committed, behind, skipped, newest_bytes, total)


def _newest_files(source: Path, states: dict[str, bytes], listed: dict[str, os.stat_result]) -> set[str]:
    """The files of the newest checkpoint each state file names."""
    out: set[str] = set()
    for rel, text in states.items():
        named = state_paths(text.decode("utf-8", "replace"))
        if named:
            newest = named[0]
            with contextlib.suppress(ValueError):  # one outside the directory is never copied
                if PurePosixPath(newest).is_absolute():
                    newest = PurePosixPath(newest).relative_to((source / rel).parent.as_posix()).as_posix()
                out |= checkpoint_files(listed, rel, newest)
    return out


def _delete_dropped(dest: Path, ignored: frozenset[str], dropped: set[str], memo: MirrorMemo, *, final: bool) -> int:
    """Delete from `dest` what the source dropped: files a pass saw in the source, never a file of a checkpoint a
    state file in `dest` names, and a state file only in a final pass."""
    deleted = 0
    if final:
        for rel in sorted(r for r in dropped & memo.seen if _is_state(r)):
            with contextlib.suppress(FileNotFoundError):
                (dest / rel).unlink()
                deleted += 1
    protected = _named_by(dest, ignored)
    for rel in sorted(dropped & memo.seen):
        if _is_state(rel) or rel in protected:
            continue
        with contextlib.suppress(FileNotFoundError):
            (dest / rel).unlink()
            deleted += 1
        memo.copied.pop(rel, None)
    return deleted


def _copy_changed(
    source: Path,
    dest: Path,
    order: list[str],
    listed: dict[str, os.stat_result],
    have: dict[str, os.stat_result],
    *,
    memo: MirrorMemo,
    ignored: frozenset[str],
) -> tuple[int, int, set[str]]:
    """Copy, in `order`, every file but the state files that `dest` lacks or holds another version of; (files
    copied, their bytes, those that left the source or changed since the listing). A file of a checkpoint a state
    file of `dest` names is replaced only once that state file no longer names it (`_withdraw`)."""
    copied = copied_bytes = 0
    unstable: set[str] = set()
    named: dict[str, set[tuple[str, str]]] | None = None  # read once a file of `dest` is to be replaced
    for rel in order:
        st = listed[rel]
        if _is_state(rel):
            continue
        old = have.get(rel)
        if old is not None and (
            (old.st_size, old.st_mtime_ns) == (st.st_size, st.st_mtime_ns)
            or memo.copied.get(rel) == (st.st_size, st.st_mtime_ns, old.st_size, old.st_mtime_ns)
        ):
            continue
        if old is not None:  # (a state file of `dest` names only files it has)
            named = _named_by(dest, ignored) if named is None else named
            for state_rel, checkpoint in named.pop(rel, ()):
                _withdraw(dest, ignored, state_rel, checkpoint)
                named = _named_by(dest, ignored)
        try:
            size, same = _copy(source / rel, dest / rel, st)
        except FileNotFoundError:
            unstable.add(rel)
            continue
        copied_bytes += size
        copied += 1
        if not same:
            unstable.add(rel)  # (copied as it is now; the next pass sees it listed so, and counts it)
            continue
        after = (dest / rel).stat()
        memo.copied[rel] = (st.st_size, st.st_mtime_ns, after.st_size, after.st_mtime_ns)
    return copied, copied_bytes, unstable


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


def _named_by(dest: Path, ignored: frozenset[str]) -> dict[str, set[tuple[str, str]]]:
    """Each file of a checkpoint a state file in `dest` names, and (that state file, the checkpoint's name as
    relative to it) for each that does: they are what storage restores."""
    listed = _listing(dest, ignored)
    named: dict[str, set[tuple[str, str]]] = {}
    for rel in (r for r in listed if _is_state(r)):
        try:
            text = (dest / rel).read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            continue
        base = (dest / rel).parent.as_posix()
        for _field, path in named_paths(text):
            with contextlib.suppress(ValueError):  # (one written absolute, by a program that saved here itself)
                relative = PurePosixPath(path).relative_to(base).as_posix() if path.startswith("/") else path
                for file in checkpoint_files(listed, rel, relative):
                    named.setdefault(file, set()).add((rel, relative))
    return named


def _withdraw(dest: Path, ignored: frozenset[str], state_rel: str, checkpoint: str) -> None:
    """Make the state file `state_rel` of `dest` stop naming `checkpoint`, whose files are about to be replaced
    (the program saved it again under the same name): it names the newest other complete one, or is removed when
    there is none (storage then names nothing for the moment, never a checkpoint of two saves)."""
    target = dest / state_rel
    listed = _listing(dest, ignored)

    def complete(named: str) -> bool:
        return named != checkpoint and _complete(checkpoint_files(listed, state_rel, named))

    copy = state_copy(target.read_bytes(), target.parent.as_posix(), complete, promote=True)
    if copy.text is None:
        target.unlink()
        _fsync_dir(target.parent)
    else:
        _write_state(copy.text, target)


def state_digests(directory: Path, ignored: frozenset[str] = frozenset()) -> dict[str, str]:
    """Each state file under `directory` (relative path) and the SHA-256 of its bytes."""
    out = {}
    for rel in sorted(r for r in _listing(directory, ignored) if _is_state(r)):
        with contextlib.suppress(FileNotFoundError):
            out[rel] = hashlib.sha256((directory / rel).read_bytes()).hexdigest()
    return out
