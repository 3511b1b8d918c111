"""Commit protocol, retention, on-disk format and fallback loading from storage."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from flashckpt_testlib import assert_restores, same_bits, tied_states, zeros_like_state
from hypothesis import given
from hypothesis import strategies as st

from dlrover.common import ConfigError
from dlrover.flashckpt.ckpt_format import TRACKER_PATH, manifest_path, rank_manifest_path, safetensors_path
from dlrover.flashckpt.commit import Committer, RetentionPolicy, Tracker, decide_commit, select_removals
from dlrover.flashckpt.errors import NoCheckpointError, StateStructureError, StorageError, WorldSizeError
from dlrover.flashckpt.payloads import payload_from_state
from dlrover.flashckpt.persist import persist_rank
from dlrover.flashckpt.storage import InMemoryStorage, PosixStorage, Storage
from dlrover.flashckpt.storage_loader import StorageReader


def _rank_state(step: int, rank: int) -> dict[str, Any]:
    return {
        "w": torch.full((4, 3), float(step * 10 + rank)),
        "b": torch.arange(5, dtype=torch.int8),
        "meta": {"step": step, "rank": rank, "lr": float("inf"), "tag": ("a", b"\x00")},
    }


def _checkpoint(storage: Storage, step: int, world: int = 2, commit: bool = True) -> None:
    for rank in range(world):
        persist_rank(storage, payload_from_state(step, rank, world, _rank_state(step, rank)))
    if commit:
        assert Committer(storage).try_commit(step, world).commit


def test_decide_commit_reasons() -> None:
    assert decide_commit(5, 3, {0, 1, 2}, None).commit
    d = decide_commit(5, 3, {0, 2}, Tracker(4, 3))
    assert not d.commit
    assert "[1]" in d.reason
    d = decide_commit(4, 3, {0, 1, 2}, Tracker(4, 3))
    assert not d.commit
    assert "not newer" in d.reason


def test_commit_and_readable_without_us(tmp_path: Path) -> None:
    from safetensors.torch import load_file

    storage = PosixStorage(tmp_path)
    _checkpoint(storage, 10)
    tracker = json.loads((tmp_path / TRACKER_PATH).read_text())
    assert tracker["step"] == 10
    assert tracker["world_size"] == 2
    manifest = json.loads((tmp_path / manifest_path(10)).read_text())
    assert [r["rank"] for r in manifest["ranks"]] == [0, 1]
    tensors = load_file(str(tmp_path / safetensors_path(10, 1)))
    assert torch.equal(tensors["w"], torch.full((4, 3), 101.0))
    rank_doc = json.loads((tmp_path / rank_manifest_path(10, 1)).read_text())
    assert {t["name"] for t in rank_doc["tensors"]} == {"w", "b"}
    assert "crc32" in rank_doc["tensors"][0]
    assert not list(tmp_path.rglob("*.tmp-*"))
    loaded = StorageReader(storage).load(rank=1, world_size=2)
    assert loaded.step == 10
    assert same_bits(loaded.state, _rank_state(10, 1))


def test_uncommitted_step_is_not_loaded_and_tracker_is_not_moved(tmp_path: Path) -> None:
    storage = PosixStorage(tmp_path)
    _checkpoint(storage, 1)
    persist_rank(storage, payload_from_state(2, 0, 2, _rank_state(2, 0)))  # rank 1 never finishes
    d = Committer(storage).try_commit(2, 2)
    assert not d.commit
    assert "[1]" in d.reason
    assert StorageReader(storage).load(0, 2).step == 1


@pytest.mark.parametrize("damage", ["flip", "truncate", "delete_rank_manifest", "garbage_tracker"])
def test_damaged_checkpoint_falls_back_with_warning_naming_file(damage: str) -> None:
    storage = InMemoryStorage()
    _checkpoint(storage, 1)
    _checkpoint(storage, 2)
    fpath = safetensors_path(2, 0)
    if damage == "flip":
        storage.corrupt(fpath, storage.size(fpath) - 3)
    elif damage == "truncate":
        storage.corrupt(fpath, storage.size(fpath) - 3, truncate=True)
    elif damage == "delete_rank_manifest":
        storage.remove_tree("2")
        for rank in range(2):
            persist_rank(storage, payload_from_state(2, rank, 2, _rank_state(2, rank)))
        # manifest.json is gone: step 2 is no longer committed although the tracker names it
    else:
        storage.write_file(TRACKER_PATH, [b"{not json"])
    target = zeros_like_state(_rank_state(0, 0))
    reader = StorageReader(storage)
    loaded = reader.load(0, 2, target=target)
    if damage == "garbage_tracker":
        assert loaded.step == 2
        assert any("tracker is unreadable" in e.reason for e in reader.events.snapshot())
        return
    assert loaded.step == 1
    assert same_bits(target, _rank_state(1, 0))
    warnings = [e.reason for e in reader.events.snapshot() if e.kind == "fallback"]
    assert warnings
    if damage in ("flip", "truncate"):
        assert fpath in warnings[0]


def test_no_checkpoint_and_world_size_errors() -> None:
    storage = InMemoryStorage()
    with pytest.raises(NoCheckpointError, match="no loadable"):
        StorageReader(storage).load(0, 1)
    _checkpoint(storage, 3)
    with pytest.raises(WorldSizeError, match="saved by 2 ranks; this job has 4"):
        StorageReader(storage).load(0, 4)
    target = {"w": torch.zeros(4, 3), "b": torch.zeros(5), "meta": None}
    with pytest.raises(StateStructureError, match="I8"):
        StorageReader(storage).load(0, 2, target=target)
    assert torch.equal(target["w"], torch.zeros(4, 3))


def test_full_disk_keeps_previous_checkpoint() -> None:
    storage = InMemoryStorage()
    _checkpoint(storage, 1)
    storage.capacity_bytes = sum(storage.size(f"1/{n}") for n in storage.list_dir("1")) + 2000
    with pytest.raises(Exception, match="no space left"):
        _checkpoint(storage, 2)
    assert Committer(storage).tracker() == Tracker(1, 2)
    assert StorageReader(storage).load(1, 2).step == 1


def test_retention_policy_selection() -> None:
    policy = RetentionPolicy(keep_last=2, keep_every=10)
    assert select_removals([5, 10, 15, 20, 25], [3, 30], 25, policy) == [3, 5, 15]
    # A committed step newer than the tracker (committed but tracker write lost) is kept.
    assert select_removals([1, 2, 3], [], 2, RetentionPolicy(keep_last=1)) == [1]
    with pytest.raises(ConfigError, match="keep_last"):
        RetentionPolicy(keep_last=0)
    with pytest.raises(ConfigError, match="keep_every"):
        RetentionPolicy(keep_every=0)


def test_retention_travels_as_two_counts() -> None:
    for policy in (None, RetentionPolicy(keep_last=2), RetentionPolicy(keep_last=3, keep_every=50)):
        assert RetentionPolicy.from_counts(*RetentionPolicy.counts(policy)) == policy
    assert RetentionPolicy.counts(None) == (0, 0)
    with pytest.raises(ConfigError, match="keep_every needs keep_last"):
        RetentionPolicy.from_counts(0, 10)
    with pytest.raises(ConfigError, match=">= 0"):
        RetentionPolicy.from_counts(-1, 0)


def test_retention_applied_on_commit() -> None:
    storage = InMemoryStorage()
    committer = Committer(storage, RetentionPolicy(keep_last=2, keep_every=4))
    for step in range(1, 7):
        for rank in range(2):
            persist_rank(storage, payload_from_state(step, rank, 2, _rank_state(step, rank)))
        assert committer.try_commit(step, 2).commit
    assert committer.steps() == ([4, 5, 6], [])


def test_a_retention_failure_does_not_undo_a_commit() -> None:
    class UndeletableStorage(InMemoryStorage):
        def remove_tree(self, path: str) -> None:
            raise StorageError(f"cannot remove {path}: read-only")

    storage = UndeletableStorage()
    committer = Committer(storage, RetentionPolicy(keep_last=1))
    for step in (1, 2):
        for rank in range(2):
            persist_rank(storage, payload_from_state(step, rank, 2, _rank_state(step, rank)))
        decision = committer.try_commit(step, 2)
        assert decision.commit
    assert "retention failed" in decision.reason
    assert committer.tracker() == Tracker(2, 2)


@given(crash_at=st.integers(0, 9))
def test_crash_at_any_write_leaves_previous_checkpoint(crash_at: int) -> None:
    """Writes of step 2 for 2 ranks: 3 files per rank, manifest.json, tracker = 8 writes."""
    storage = InMemoryStorage()
    _checkpoint(storage, 1)
    count = [0]

    class Crash(Exception):
        pass

    def before(path: str) -> None:
        if count[0] == crash_at:
            raise Crash(path)
        count[0] += 1

    storage.before_write = before
    try:
        _checkpoint(storage, 2)
        crashed = False
    except Crash:
        crashed = True
    storage.before_write = None
    tracker = Committer(storage).tracker()
    assert tracker is not None
    expected = 1 if crashed else 2
    assert tracker.step == expected
    for rank in range(2):
        loaded = StorageReader(storage).load(rank, 2)
        assert loaded.step == expected
        assert same_bits(loaded.state, _rank_state(expected, rank))


@given(state=tied_states())
def test_storage_roundtrip_bit_for_bit(state: Any) -> None:
    storage = InMemoryStorage()
    persist_rank(storage, payload_from_state(0, 0, 1, state))
    assert Committer(storage).try_commit(0, 1).commit
    assert_restores(state, lambda target: StorageReader(storage).load(0, 1, target=target).state)


def test_a_done_marker_of_another_kind_is_waited_for_not_committed(tmp_path: Path) -> None:
    # A sharded DCP persist of step 3 was cut short after rank 1's done marker; a node saver now
    # persists step 3 rank by rank, and rank 0's files are there first.
    storage = PosixStorage(tmp_path)
    persist_rank(storage, payload_from_state(3, 0, 2, _rank_state(3, 0)))
    (tmp_path / "3" / "rank_00001.done").write_text(json.dumps({"format": "dlrover-flashckpt/dcp-done", "rank": 1}))
    decision = Committer(storage).try_commit(3, 2)
    assert (decision.commit, decision.waiting_for) == (False, (1,))
    assert Committer(storage).tracker() is None
    assert not (tmp_path / manifest_path(3)).exists()
    persist_rank(storage, payload_from_state(3, 1, 2, _rank_state(3, 1)))  # the saver replaces it
    assert Committer(storage).try_commit(3, 2).commit
    assert StorageReader(storage).load(1, 2).step == 3


def test_the_tracker_never_moves_back_when_another_writer_commits_meanwhile() -> None:
    storage = InMemoryStorage()
    for rank in range(2):
        persist_rank(storage, payload_from_state(2, rank, 2, _rank_state(2, rank)))
        persist_rank(storage, payload_from_state(3, rank, 2, _rank_state(3, rank)))

    def newer_commit_lands_first(path: str) -> None:
        # Another writer (the training processes' own persist) commits step 3 while this one
        # commits step 2: between its decision and its tracker write.
        if path == manifest_path(2):
            storage.before_write = None
            assert Committer(storage).try_commit(3, 2).commit

    storage.before_write = newer_commit_lands_first
    decision = Committer(storage).try_commit(2, 2)
    assert not decision.commit
    assert "step 3 was committed meanwhile" in decision.reason
    assert Committer(storage).tracker() == Tracker(3, 2)
