"""mirror_once and CheckpointMirror: storage only ever names complete checkpoints, the state file last."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest
from dlrover_testsupport.tf_checkpoints import files_of, save, state_text

from dlrover.common import ManualClock
from dlrover.master.psjob import checkpoint_mirror
from dlrover.master.psjob.checkpoint_mirror import MirrorMemo, mirror_once
from dlrover.master.psjob.mirror_thread import CheckpointMirror

pytestmark = pytest.mark.timeout(60)


def test_a_pass_copies_every_checkpoint_file_keeping_times_and_then_the_state_file(tmp_path: Path) -> None:
    src, dst = tmp_path / "memory", tmp_path / "storage"
    save(src, 1)
    (src / "data-1.json").write_text('{"position": 1}')
    done = mirror_once(src, dst)
    assert files_of(dst) == files_of(src)
    assert done.committed == ("checkpoint",)
    assert not done.behind
    assert done.copied_files == 4
    assert done.newest_bytes == sum(len(b) for n, b in files_of(src).items() if n.startswith("ckpt-1."))
    for name in files_of(src):  # (a state file is written anew: its time is when it was committed)
        if name != "checkpoint":
            assert (dst / name).stat().st_mtime_ns == (src / name).stat().st_mtime_ns
    # Nothing changed: nothing is copied again, the state file is not rewritten.
    again = mirror_once(src, dst)
    assert (again.copied_files, again.committed, again.deleted_files) == (0, (), 0)


def test_a_newer_checkpoint_replaces_the_one_max_to_keep_dropped(tmp_path: Path) -> None:
    src, dst = tmp_path / "memory", tmp_path / "storage"
    memo = MirrorMemo()
    save(src, 1, keep=1)
    mirror_once(src, dst, memo=memo)
    (dst / "written-by-someone-else.txt").write_text("kept")
    save(src, 2, keep=1)
    done = mirror_once(src, dst, memo=memo)
    assert files_of(dst) == {**files_of(src), "written-by-someone-else.txt": b"kept"}
    assert not any(name.startswith("ckpt-1.") for name in files_of(dst))
    assert done.deleted_files == 3


def test_saves_in_progress_and_the_callers_names_are_not_copied(tmp_path: Path) -> None:
    src, dst = tmp_path / "memory", tmp_path / "storage"
    save(src, 1)
    (src / "ckpt-2_temp").mkdir()
    (src / "ckpt-2_temp" / "part-00000-of-00002.data-00000-of-00001").write_bytes(b"half")
    (src / "ckpt-2.index.tempstate8123").write_bytes(b"merging")
    (src / "checkpoint.tmp1a2b").write_text(state_text(["ckpt-1", "ckpt-2"]))
    (src / ".marker").write_text("mine")
    mirror_once(src, dst, ignored=frozenset({".marker"}))
    assert sorted(files_of(dst)) == sorted(n for n in files_of(src) if "temp" not in n and "tmp" not in n
                                           and n != ".marker")  # fmt: skip


def test_a_state_file_naming_a_checkpoint_that_left_the_source_waits_and_nothing_is_deleted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A save and max_to_keep's deletion between the state file's read and the copies: the old state file names a
    checkpoint gone from the source; storage keeps its own state file and every file it names."""
    src, dst = tmp_path / "memory", tmp_path / "storage"
    memo = MirrorMemo()
    save(src, 1, keep=1)
    mirror_once(src, dst, memo=memo)
    save(src, 2, keep=1)
    real_copy = checkpoint_mirror._copy

    def racing_copy(source: Path, target: Path, listed: os.stat_result) -> tuple[int, bool]:
        if source.name.startswith("ckpt-2."):  # the chief saves ckpt-3 meanwhile and drops ckpt-2
            save(src, 3, keep=1)
            raise FileNotFoundError(source)
        return real_copy(source, target, listed)

    monkeypatch.setattr(checkpoint_mirror, "_copy", racing_copy)
    done = mirror_once(src, dst, memo=memo)
    assert done.behind
    assert done.committed == ()
    assert done.deleted_files == 0
    assert (dst / "checkpoint").read_text() == state_text(["ckpt-1"])
    assert (dst / "ckpt-1.index").exists()
    monkeypatch.setattr(checkpoint_mirror, "_copy", real_copy)
    caught_up = mirror_once(src, dst, memo=memo)
    assert not caught_up.behind
    assert files_of(dst) == files_of(src)


def test_a_pass_cut_short_leaves_storage_naming_only_complete_checkpoints(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src, dst = tmp_path / "memory", tmp_path / "storage"
    first = save(src, 1, keep=1)
    mirror_once(src, dst)
    save(src, 2, keep=1)
    copies = 0
    real_copy = checkpoint_mirror._copy

    def failing_copy(source: Path, target: Path, listed: os.stat_result) -> tuple[int, bool]:
        nonlocal copies
        copies += 1
        if copies == 2:
            raise OSError(28, "No space left on device")
        return real_copy(source, target, listed)

    monkeypatch.setattr(checkpoint_mirror, "_copy", failing_copy)
    with pytest.raises(OSError, match="No space"):
        mirror_once(src, dst)
    assert (dst / "checkpoint").read_text() == state_text(["ckpt-1"])
    assert {n: b for n, b in files_of(dst).items() if n.startswith("ckpt-1.")} == first
    assert not list(dst.glob("*.dlrover-partial"))


def test_a_keras_backup_directory_is_mirrored_with_its_own_state_file(tmp_path: Path) -> None:
    src, dst = tmp_path / "memory", tmp_path / "storage"
    save(src / "chief", 7)
    done = mirror_once(src, dst)
    assert done.committed == ("chief/checkpoint",)
    assert files_of(dst) == files_of(src)


def test_absolute_paths_inside_the_directory_are_made_relative_and_others_never_copied(tmp_path: Path) -> None:
    src, dst = tmp_path / "memory", tmp_path / "storage"
    save(src, 1)
    (src / "checkpoint").write_text(state_text([str(src / "ckpt-1")]))
    done = mirror_once(src, dst)
    assert done.committed == ("checkpoint",)
    assert (dst / "checkpoint").read_text() == state_text(["ckpt-1"])
    (src / "checkpoint").write_text(state_text(["/elsewhere/ckpt-1"]))
    done = mirror_once(src, dst)
    assert done.committed == ()
    assert done.skipped == ("checkpoint: it names /elsewhere/ckpt-1, outside its directory",)
    assert (dst / "checkpoint").read_text() == state_text(["ckpt-1"])


def test_a_state_file_naming_a_checkpoint_being_deleted_is_copied_without_it(tmp_path: Path) -> None:
    """CheckpointManager names the checkpoint it deletes until its next write: a chief killed between the two
    leaves that state file, and the copy names the others, timestamps kept in step."""
    src, dst = tmp_path / "memory", tmp_path / "storage"
    save(src, 2, keep=3)
    save(src, 3, keep=3)
    (src / "checkpoint").write_text(
        'model_checkpoint_path: "ckpt-3"\nall_model_checkpoint_paths: "ckpt-1"\nall_model_checkpoint_paths: '
        '"ckpt-2"\nall_model_checkpoint_paths: "ckpt-3"\nall_model_checkpoint_timestamps: 1.0\n'
        "all_model_checkpoint_timestamps: 2.0\nall_model_checkpoint_timestamps: 3.0\nlast_preserved_timestamp: 0.5\n"
    )
    done = mirror_once(src, dst)
    assert done.caught_up
    assert (dst / "checkpoint").read_text() == (
        'model_checkpoint_path: "ckpt-3"\nall_model_checkpoint_paths: "ckpt-2"\nall_model_checkpoint_paths: '
        '"ckpt-3"\nall_model_checkpoint_timestamps: 2.0\nall_model_checkpoint_timestamps: 3.0\n'
        "last_preserved_timestamp: 0.5\n"
    )


def test_a_source_gone_fails_the_pass_and_storage_keeps_its_checkpoints(tmp_path: Path) -> None:
    """/dev/shm emptied by someone else (a logout's IPC clean-up, an operator): nothing is deleted."""
    src, dst = tmp_path / "memory", tmp_path / "storage"
    memo = MirrorMemo()
    save(src, 1)
    (src / ".marker").write_text("mine")
    mirror_once(src, dst, memo=memo, ignored=frozenset({".marker"}), sentinel=".marker")
    kept = files_of(dst)
    (src / ".marker").unlink()
    with pytest.raises(FileNotFoundError, match="is missing"):
        mirror_once(src, dst, memo=memo, ignored=frozenset({".marker"}), sentinel=".marker")
    shutil.rmtree(src)
    with pytest.raises(FileNotFoundError):
        mirror_once(src, dst, memo=memo)
    assert files_of(dst) == kept


def test_storage_keeps_what_its_state_file_names_and_never_loses_the_state_file(tmp_path: Path) -> None:
    src, dst = tmp_path / "memory", tmp_path / "storage"
    memo = MirrorMemo()
    save(src, 1)
    mirror_once(src, dst, memo=memo)
    for path in list(src.iterdir()):  # the program emptied its directory
        path.unlink()
    done = mirror_once(src, dst, memo=memo)
    assert done.deleted_files == 0
    assert (dst / "checkpoint").read_text() == state_text(["ckpt-1"])
    assert (dst / "ckpt-1.index").exists()


def test_coarse_times_in_storage_do_not_make_every_pass_copy_again(tmp_path: Path) -> None:
    src, dst = tmp_path / "memory", tmp_path / "storage"
    memo = MirrorMemo()
    save(src, 1)
    mirror_once(src, dst, memo=memo)
    for path in dst.iterdir():  # a file system that keeps whole seconds
        whole = path.stat().st_mtime_ns // 10**9 * 10**9
        os.utime(path, ns=(whole, whole))
    memo.copied = {rel: (*src_stat, (dst / rel).stat().st_size, (dst / rel).stat().st_mtime_ns)
                   for rel, (*src_stat, _size, _mtime) in memo.copied.items()}  # fmt: skip
    again = mirror_once(src, dst, memo=memo)
    assert (again.copied_files, again.committed) == (0, ())


def test_a_copy_cut_short_by_a_crash_is_removed(tmp_path: Path) -> None:
    src, dst = tmp_path / "memory", tmp_path / "storage"
    save(src, 1)
    dst.mkdir()
    (dst / "ckpt-1.index.dlrover-partial").write_bytes(b"half")
    mirror_once(src, dst)
    assert files_of(dst) == files_of(src)


def test_the_mirror_thread_commits_new_checkpoints_and_says_when_storage_fails(tmp_path: Path) -> None:
    src, dst = tmp_path / "memory", tmp_path / "storage"
    clock = ManualClock()
    mirror = CheckpointMirror(src, dst, poll_s=0.01, clock=clock)
    save(src, 1)
    done = mirror.sync()
    assert done.committed == ("checkpoint",)
    assert mirror.status.committed == dst / "ckpt-1"
    assert mirror.status.committed_wall_time == clock.wall_time()
    dst.rename(tmp_path / "moved")
    dst.write_text("storage is now a file")
    with pytest.raises(OSError, match=r"exists|Not a directory"):
        mirror.sync()
    assert mirror.status.problem
    assert mirror.status.committed == dst / "ckpt-1"
    dst.unlink()
    (tmp_path / "moved").rename(dst)
    save(src, 2)
    mirror.start()
    try:
        # The thread's passes: wait for its commit of ckpt-2 (no time is asserted: the bound only ends a hang).
        for _ in range(2000):
            if mirror.status.committed == dst / "ckpt-2":
                break
            time.sleep(0.005)
        assert mirror.status.committed == dst / "ckpt-2"
        assert mirror.status.problem == ""
    finally:
        mirror.close()
    assert files_of(dst) == files_of(src)


def test_a_checkpoint_saved_again_under_its_name_is_replaced_only_after_storage_stops_naming_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src, dst = tmp_path / "memory", tmp_path / "storage"
    memo = MirrorMemo()
    save(src, 1, keep=3)
    save(src, 2, keep=3)
    mirror_once(src, dst, memo=memo)
    again = save(src, 2, keep=3, payload=b"the second save of ckpt-2")
    seen_while_replacing: list[str] = []
    real_copy = checkpoint_mirror._copy

    def watching(source: Path, target: Path, listed: os.stat_result) -> tuple[int, bool]:
        if target.name.startswith("ckpt-2."):
            seen_while_replacing.append((dst / "checkpoint").read_text())
        return real_copy(source, target, listed)

    monkeypatch.setattr(checkpoint_mirror, "_copy", watching)
    done = mirror_once(src, dst, memo=memo)
    assert seen_while_replacing
    assert all(text == state_text(["ckpt-1"]) for text in seen_while_replacing)
    assert done.committed == ("checkpoint",)
    assert (dst / "checkpoint").read_text() == state_text(["ckpt-1", "ckpt-2"])
    assert {n: b for n, b in files_of(dst).items() if n.startswith("ckpt-2.")} == again


def test_a_checkpoint_changed_since_the_listing_is_not_committed_in_that_pass(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    src, dst = tmp_path / "memory", tmp_path / "storage"
    save(src, 1)
    real_copy = checkpoint_mirror._copy
    saved_again: list[dict[str, bytes]] = []

    def racing(source: Path, target: Path, listed: os.stat_result) -> tuple[int, bool]:
        if not saved_again:  # after the listing, before the first copy: ckpt-1 is saved again
            saved_again.append(save(src, 1, payload=b"again"))
        return real_copy(source, target, listed)

    monkeypatch.setattr(checkpoint_mirror, "_copy", racing)
    done = mirror_once(src, dst)
    assert done.committed == ()
    assert done.behind
    monkeypatch.setattr(checkpoint_mirror, "_copy", real_copy)
    mirror_once(src, dst)
    assert {n: b for n, b in files_of(dst).items() if n.startswith("ckpt-1.")} == saved_again[0]
