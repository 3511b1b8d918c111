"""FlashCheckpoints: where the chief saves (memory while it has room, else storage for good), what a previous
master left adopted or discarded, nothing lost when memory is left, and the memory directory never outliving its
job unless it holds the only copy."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import attrs
import pytest
from dlrover_testsupport.tf_checkpoints import files_of, save, state_text

from dlrover.common import ManualClock
from dlrover.master.psjob.flash import MARKER_FILE, RECORD_FILE, FlashCheckpoints, checkpoint_number
from dlrover.master.psjob.mirror_thread import CheckpointMirror

pytestmark = pytest.mark.timeout(60)
MIB = 1024 * 1024


class Room:
    """The memory file system's free bytes, as the test sets them."""

    def __init__(self, free: int) -> None:
        self.free = free

    def __call__(self, _path: Path) -> int:
        return self.free


def _flash(tmp_path: Path, room: Room | None = None, **kwargs: object) -> FlashCheckpoints:
    # The mirror thread's first pass would come after an hour: the tests make the passes.
    (tmp_path / "shm").mkdir(exist_ok=True)
    (tmp_path / "storage").mkdir(exist_ok=True)
    settings: dict[str, object] = {"clock": ManualClock(), "free": room or Room(100 * MIB), "reserve_bytes": MIB,
                                   "poll_s": 3600.0, **kwargs}  # fmt: skip
    return FlashCheckpoints(tmp_path / "storage", tmp_path / "shm", "rec/job", **settings)  # type: ignore[arg-type]


def _without_marker(directory: Path) -> dict[str, bytes]:
    return {n: b for n, b in files_of(directory).items() if n not in (MARKER_FILE, RECORD_FILE)}


def _in_memory(tmp_path: Path) -> tuple[FlashCheckpoints, CheckpointMirror]:
    flash = _flash(tmp_path)
    flash.start()
    assert flash._mirror is not None
    return flash, flash._mirror


def _killed(flash: FlashCheckpoints) -> None:
    """What SIGKILL does to a master: its copies stop and its lock goes; it removes nothing."""
    assert flash._mirror is not None
    flash._mirror.close()
    flash._release_lock()


def test_with_room_the_chief_saves_to_memory_filled_from_storage_and_the_end_persists_and_removes_it(
    tmp_path: Path,
) -> None:
    storage = tmp_path / "storage"
    save(storage, 3)
    flash = _flash(tmp_path)
    events = flash.start()
    try:
        assert flash.in_memory
        assert flash.live_dir == flash.memory_dir
        assert flash.memory_dir.parent == tmp_path / "shm"
        assert flash.memory_dir.name.startswith("dlrover-rec_job-")
        assert oct(flash.memory_dir.stat().st_mode & 0o777) == oct(0o700)
        assert [(e.kind, e.data["in_memory"]) for e in events] == [("flash_checkpoints", True)]
        assert "filled from storage" in events[0].message
        assert _without_marker(flash.memory_dir) == files_of(storage)  # the chief restores it from memory
        save(flash.live_dir, 4)
        assert flash.persisted(flash.live_dir / "ckpt-4") == storage / "ckpt-4"
        assert flash.persisted(storage / "ckpt-4") == storage / "ckpt-4"
    finally:
        closed = flash.close()
    assert [e.kind for e in closed] == ["flash_removed"]
    assert "ckpt-4" in closed[0].message
    assert not flash.memory_dir.exists()
    assert not list((tmp_path / "shm").iterdir()), "nothing is left in memory"
    assert (storage / "checkpoint").read_text().startswith('model_checkpoint_path: "ckpt-4"')
    assert flash.committed()[0] == storage / "ckpt-4"
    assert checkpoint_number(flash.committed()[0]) == 4
    assert flash.close() == []


def test_without_room_for_storage_and_two_more_checkpoints_or_without_shared_memory_the_chief_saves_to_storage(
    tmp_path: Path,
) -> None:
    storage = tmp_path / "storage"
    save(storage, 1, keep=3, payload=b"x" * MIB)
    save(storage, 2, keep=3, payload=b"x" * MIB)
    # 4 MiB held and two more checkpoints of 2 MiB and the reserve need 9 MiB.
    tight = _flash(tmp_path, Room(8 * MIB))
    events = tight.start()
    assert not tight.in_memory
    assert tight.live_dir == storage
    assert "saved to storage" in events[0].message
    assert "need 9" in events[0].message
    assert not tight.memory_dir.exists()
    off = _flash(tmp_path, off_reason="the kubernetes backend's tasks share no memory")
    assert "share no memory" in off.start()[0].message
    assert not off.in_memory
    assert tight.committed() == (storage / "ckpt-2", (storage / "checkpoint").stat().st_mtime)


def test_memory_running_out_moves_the_chief_to_storage_at_its_next_launch_with_nothing_lost(tmp_path: Path) -> None:
    room = Room(100 * MIB)
    flash = _flash(tmp_path, room)
    flash.start()
    try:
        save(flash.live_dir, 1, payload=b"y" * MIB)
        assert flash.before_chief_launch() == []  # room enough still
        room.free = 2 * MIB
        events = flash.before_chief_launch()
        assert [e.kind for e in events] == ["flash_to_storage"]
        assert not flash.in_memory
        assert flash.live_dir == tmp_path / "storage"
        assert not flash.memory_dir.exists()
        assert (tmp_path / "storage" / "ckpt-1.index").exists()
        room.free = 100 * MIB
        assert flash.before_chief_launch() == []  # storage for the rest of the job
        assert not flash.in_memory
    finally:
        flash.close()


def test_memory_is_kept_when_the_last_copy_cannot_make_storage_whole(tmp_path: Path) -> None:
    """The newest checkpoint in memory is not complete (its index is gone): moving to storage or removing memory
    would lose what memory holds, so both wait and say why."""
    room = Room(100 * MIB)
    flash = _flash(tmp_path, room)
    flash.start()
    save(flash.live_dir, 1)
    (flash.live_dir / "ckpt-1.index").unlink()
    room.free = 0
    events = flash.before_chief_launch()
    assert [e.kind for e in events] == ["checkpoint_mirror_failed"]
    assert flash.in_memory
    closed = flash.close()
    assert [e.kind for e in closed] == ["checkpoint_mirror_failed"]
    assert "kept in" in closed[0].message
    assert flash.memory_dir.exists()


def test_a_previous_masters_memory_directory_is_adopted_and_what_it_had_not_persisted_is(tmp_path: Path) -> None:
    storage = tmp_path / "storage"
    first = _flash(tmp_path)
    first.start()
    save(first.live_dir, 1)
    first._mirror.sync()  # type: ignore[union-attr]
    save(first.live_dir, 2)
    save(first.live_dir / "chief", 7)  # a Keras BackupAndRestore directory beside it
    _killed(first)
    second = _flash(tmp_path)
    events = second.start()
    try:
        assert second.in_memory
        assert "adopted" in events[0].message
        assert (storage / "checkpoint").read_text().startswith('model_checkpoint_path: "ckpt-2"')
        assert (storage / "chief" / "checkpoint").exists()
        assert _without_marker(second.memory_dir) == files_of(storage)
    finally:
        second.close()
    assert not second.memory_dir.exists()


def test_a_master_does_not_use_a_memory_directory_another_live_master_holds(tmp_path: Path) -> None:
    first = _flash(tmp_path)
    first.start()
    try:
        second = _flash(tmp_path)
        events = second.start()
        assert not second.in_memory
        assert "another master of this job uses" in events[0].message
        assert first.memory_dir.exists()
    finally:
        first.close()


def test_a_memory_directory_storage_moved_on_from_is_discarded_and_filled_again(tmp_path: Path) -> None:
    storage = tmp_path / "storage"
    first = _flash(tmp_path)
    first.start()
    save(first.live_dir, 1)
    _killed(first)
    save(storage, 5)  # a later master, saving to storage, moved on
    second = _flash(tmp_path)
    assert "filled from storage" in second.start()[0].message
    try:
        assert (second.live_dir / "checkpoint").read_text().startswith('model_checkpoint_path: "ckpt-5"')
        assert not (second.live_dir / "ckpt-1.index").exists()
    finally:
        second.close()


def test_a_directory_by_that_name_that_is_not_ours_is_left_alone(tmp_path: Path) -> None:
    probe = _flash(tmp_path)
    probe.memory_dir.mkdir(mode=0o700)
    (probe.memory_dir / "someone-elses").write_text("kept")
    events = _flash(tmp_path).start()
    assert "not a DLRover memory directory" in events[0].message
    os.chmod(probe.memory_dir, 0o755)
    (probe.memory_dir / MARKER_FILE).write_text(str((tmp_path / "storage").resolve()))
    events = _flash(tmp_path).start()
    assert "not a private directory" in events[0].message
    assert (probe.memory_dir / "someone-elses").read_text() == "kept"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    (probe.memory_dir / "someone-elses").unlink()
    (probe.memory_dir / MARKER_FILE).unlink()
    probe.memory_dir.rmdir()
    probe.memory_dir.symlink_to(elsewhere)
    flash = _flash(tmp_path)
    assert not flash.start()[0].data["in_memory"]
    assert list(elsewhere.iterdir()) == []


def test_what_a_save_left_after_the_directory_was_removed_is_cleared(tmp_path: Path) -> None:
    """A server finishing its share after the master removed the directory re-creates it with only `_temp` parts:
    not someone else's, so not a reason to go without memory for good."""
    probe = _flash(tmp_path)
    (probe.memory_dir / "ckpt-9_temp").mkdir(parents=True, mode=0o755)  # (TensorFlow's mode, not ours)
    (probe.memory_dir / "ckpt-9_temp" / "part-00001-of-00002.data-00000-of-00001").write_bytes(b"late")
    flash = _flash(tmp_path)
    assert flash.start()[0].data["in_memory"]
    flash.close()


def test_storage_whose_state_file_cannot_be_restored_from_a_copy_keeps_the_chief_in_storage(tmp_path: Path) -> None:
    storage = tmp_path / "storage"
    save(storage, 1)
    (storage / "checkpoint").write_text(state_text(["/somewhere/else/ckpt-1"]))
    flash = _flash(tmp_path)
    events = flash.start()
    assert not flash.in_memory
    assert "outside its directory" in events[0].message
    assert not flash.memory_dir.exists()


def test_memory_emptied_by_someone_else_fails_the_copies_and_storage_keeps_its_checkpoints(tmp_path: Path) -> None:
    storage = tmp_path / "storage"
    flash, mirror = _in_memory(tmp_path)
    try:
        save(flash.live_dir, 1)
        mirror.sync()
        kept = files_of(storage)
        for path in flash.memory_dir.iterdir():  # a logout's IPC clean-up
            path.unlink()
        with pytest.raises(FileNotFoundError, match="is missing"):
            mirror.sync()
        assert [e.kind for e in flash.look()] == ["checkpoint_mirror_failed"]
        assert files_of(storage) == kept
    finally:
        closed = flash.close()
    assert [e.kind for e in closed] == ["checkpoint_mirror_failed"]
    assert files_of(storage) == kept


def test_storage_failing_is_said_once_and_its_recovery_too(tmp_path: Path) -> None:
    storage = tmp_path / "storage"
    flash, mirror = _in_memory(tmp_path)
    try:
        storage.rename(tmp_path / "away")
        storage.write_text("not a directory")
        with pytest.raises(OSError, match=r"exists|Not a directory"):
            mirror.sync()
        failed = flash.look()
        assert [e.kind for e in failed] == ["checkpoint_mirror_failed"]
        assert flash.look() == []
        storage.unlink()
        (tmp_path / "away").rename(storage)
        mirror.sync()
        assert [e.kind for e in flash.look()] == ["checkpoint_mirror_recovered"]
    finally:
        flash.close()


def test_a_memory_directory_ahead_of_storage_by_more_than_max_to_keep_is_adopted(tmp_path: Path) -> None:
    """Storage was slow or down: memory holds none of the checkpoints storage has, only newer ones. Storage is as
    the copies left it, so memory is the newer: it is adopted, not discarded."""
    storage = tmp_path / "storage"
    first = _flash(tmp_path)
    first.start()
    save(first.live_dir, 1, keep=2)
    first._mirror.sync()  # type: ignore[union-attr]
    for number in (2, 3, 4):
        save(first.live_dir, number, keep=2)
    _killed(first)
    second = _flash(tmp_path)
    events = second.start()
    try:
        assert "adopted" in events[0].message
        assert (storage / "checkpoint").read_text().startswith('model_checkpoint_path: "ckpt-4"')
    finally:
        second.close()


def test_a_memory_directory_is_not_adopted_when_storage_was_saved_to_since_even_in_the_same_sizes(
    tmp_path: Path,
) -> None:
    storage = tmp_path / "storage"
    first = _flash(tmp_path)
    first.start()
    save(first.live_dir, 3, payload=b"a" * 64)
    first._mirror.sync()  # type: ignore[union-attr]
    _killed(first)
    # A run with --flash-root off saved its own ckpt-3, of the same sizes, straight to storage.
    for path in storage.glob("ckpt-3.*"):
        path.unlink()
    theirs = save(storage, 3, payload=b"b" * 64)
    (storage / "checkpoint").write_text(state_text(["ckpt-3"]) + "last_preserved_timestamp: 2.0\n")
    second = _flash(tmp_path)
    assert "filled from storage" in second.start()[0].message
    try:
        assert {n: b for n, b in files_of(storage).items() if n.startswith("ckpt-3.")} == theirs
    finally:
        second.close()


def test_memory_emptied_by_someone_else_moves_the_next_chief_to_storage(tmp_path: Path) -> None:
    flash = _flash(tmp_path)
    flash.start()
    save(flash.live_dir, 1)
    flash._mirror.sync()  # type: ignore[union-attr]
    for path in flash.memory_dir.iterdir():
        path.unlink()
    events = flash.before_chief_launch()
    assert [e.kind for e in events] == ["flash_to_storage"]
    assert "emptied by someone else" in events[0].message
    assert "ckpt-1" in events[0].message
    assert flash.live_dir == tmp_path / "storage"
    assert not flash.memory_dir.exists()


def test_a_backup_keras_drops_when_fit_ends_leaves_storage_at_the_end(tmp_path: Path) -> None:
    storage = tmp_path / "storage"
    flash = _flash(tmp_path)
    flash.start()
    save(flash.live_dir / "chief", 4)
    flash._mirror.sync()  # type: ignore[union-attr]
    assert (storage / "chief" / "checkpoint").exists()
    shutil.rmtree(flash.live_dir / "chief")  # BackupAndRestore.on_train_end
    assert [e.kind for e in flash.close()] == ["flash_removed"]
    assert not any((storage / "chief").iterdir())


def test_a_slow_copy_is_said(tmp_path: Path) -> None:
    clock = ManualClock()
    flash = _flash(tmp_path, clock=clock, slow_copy_s=30.0)
    flash.start()
    mirror = flash._mirror
    assert mirror is not None
    try:
        mirror._status = attrs.evolve(mirror.status, running_since=clock.now())  # a pass under way
        clock.advance(31.0)
        assert [e.kind for e in flash.look()] == ["checkpoint_mirror_failed"]
        assert "running for over 30 s" in flash._last_problem
    finally:
        mirror._status = attrs.evolve(mirror.status, running_since=None)
        flash.close()


def test_the_end_waits_no_longer_than_the_last_copy_timeout_for_a_copy_that_hangs_on_storage(tmp_path: Path) -> None:
    """A background pass stuck in storage (a hung NFS mount): the job's end gives up after the last copy's
    timeout, says so, and keeps memory, which holds the only copy; the pass ends on its own later."""
    import threading

    flash = _flash(tmp_path, poll_s=0.01, last_copy_timeout_s=0.2)
    flash.start()
    save(flash.live_dir, 1)
    mirror = flash._mirror
    assert mirror is not None
    in_pass, storage_back = threading.Event(), threading.Event()
    sync = mirror.sync

    def hangs(*, final: bool = False) -> object:
        in_pass.set()
        storage_back.wait(30)
        return sync(final=final)

    mirror.sync = hangs  # type: ignore[method-assign]
    try:
        assert in_pass.wait(30), "a background pass started"
        closed = flash.close()
        assert [e.kind for e in closed] == ["checkpoint_mirror_failed"]
        assert "did not finish within 0.2 s" in closed[0].message, closed[0].message
        assert "kept in" in closed[0].message
        assert flash.memory_dir.exists()
    finally:
        storage_back.set()
