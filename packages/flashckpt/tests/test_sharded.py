"""Sharded state: splitting, the DCP store's checksums and commit, and real FSDP1 and FSDP2 jobs
resharding."""

from __future__ import annotations

import errno
import json
import subprocess
import sys
import tempfile
import time
import uuid
import zlib
from pathlib import Path
from typing import Any

import attrs
import numpy as np
import pytest
import torch
from flashckpt_testlib import keys, same_bits, states, tied_states, zeros_like_state
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.distributed.checkpoint.filesystem import FileSystemReader, FileSystemWriter
from torch.distributed.checkpoint.state_dict_loader import load as dcp_load

from dlrover.common import processes_mentioning
from dlrover.flashckpt.ckpt_format import CHECKPOINT_FORMAT, TRACKER_PATH, manifest_path, safetensors_path
from dlrover.flashckpt.commit import Committer, RetentionPolicy, Tracker
from dlrover.flashckpt.config import StagerConfig
from dlrover.flashckpt.dcp_store import checksum_file, checksum_owners, manifest_doc, parse_manifest, verify_file
from dlrover.flashckpt.errors import (
    ChecksumError,
    FlashCkptError,
    LayoutError,
    NoCheckpointError,
    StateStructureError,
    StorageError,
)
from dlrover.flashckpt.payloads import payload_from_slot
from dlrover.flashckpt.persist import persist_rank
from dlrover.flashckpt.segment import ShmSegment, remove_run, segment_path
from dlrover.flashckpt.sharded import ShardedCheckpointer
from dlrover.flashckpt.sharded_state import dcp_grouped, rejoin, skeleton, split_sharded
from dlrover.flashckpt.slotio import read_header
from dlrover.flashckpt.storage import PosixStorage
from dlrover.flashckpt.tree import flatten_state

WORKER = str(Path(__file__).with_name("flashckpt_sharded_worker.py"))
KILLED = str(Path(__file__).with_name("flashckpt_sharded_kill.py"))

# Single-rank tests run DCP without a process group on purpose.
pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


def _state(seed: float) -> dict[str, Any]:
    return {
        "model": {"0.weight": torch.full((4, 3), seed), "0.bias": torch.arange(3, dtype=torch.int16)},
        "optim": {"state": {"0.weight": {"step": torch.tensor(seed)}}, "param_groups": [{"lr": seed, "n": None}]},
        "rng": np.arange(5, dtype=np.uint32) + int(seed),
        "step": int(seed),
    }


# -- splitting ---------------------------------------------------------------------------------


def test_split_keys_follow_dcp_flattening_and_share_memory() -> None:
    s = _state(1.0)
    split = split_sharded(s)
    assert split.keys == ("model.0.weight", "model.0.bias", "optim.state.0.weight.step", "rng")
    assert split.dcp["model.0.weight"] is s["model"]["0.weight"]
    assert split.dcp["rng"].data_ptr() == s["rng"].ctypes.data  # a view, not a copy
    assert split.local["model"]["0.weight"] is s["model"]["0.weight"]
    assert split.local["rng"] is s["rng"]
    assert split.local["optim"]["param_groups"] == [{"lr": 1.0, "n": None}]
    assert split.shards == {}
    assert split.describe(1) == {"world_size": 1, "shards": {}}


def test_split_refuses_colliding_keys_and_odd_keys() -> None:
    t = torch.zeros(1)
    with pytest.raises(StateStructureError, match=r"'a\.b'"):
        split_sharded({"a.b": t, "a": {"b": t}})
    with pytest.raises(StateStructureError, match="str or int keys"):
        split_sharded({("x", 1): t})
    with pytest.raises(StateStructureError, match="is a dict"):
        split_sharded([t])


@given(st.dictionaries(keys, states(), max_size=4))
def test_split_views_every_tensor_once_and_rejoins(state: dict[Any, Any]) -> None:
    error = ""
    try:
        split = split_sharded(state)
    except StateStructureError as e:
        error = str(e)
    if error:
        assert "DCP key" in error  # int 1 beside str "1", or "a.b" beside "a" -> "b"
        return
    assert same_bits(split.local, state)  # no DTensor: the local view is the state itself
    leaves = [leaf.tensor for leaf in flatten_state(state).leaves]
    assert len(set(split.keys)) == len(split.keys) == len(leaves)
    assert all(split.dcp[k].data_ptr() == t.data_ptr() for k, t in zip(split.keys, leaves, strict=True))
    # rejoin takes every non-tensor value and keeps every tensor of the target.
    target = zeros_like_state(state)
    assert same_bits(rejoin(target, state), _tensors_zeroed(state))


def _tensors_zeroed(s: Any) -> Any:
    if isinstance(s, torch.Tensor):
        return torch.zeros_like(s)
    if isinstance(s, dict):
        return {k: _tensors_zeroed(v) for k, v in s.items()}
    if isinstance(s, list | tuple):
        return type(s)(_tensors_zeroed(v) for v in s)
    return s


def _assert_round_trips(state: dict[str, Any], memos: tuple[dict[int, torch.Tensor] | None, ...] = (None,)) -> None:
    """Save, persist and load `state` from storage, then from memory, into zeroed targets (one per
    `memos` entry, see `zeros_like_state`): bit for bit. States DCP cannot key are skipped."""
    try:
        split_sharded(state)
    except StateStructureError:
        return
    with tempfile.TemporaryDirectory() as tmp:
        cfg = StagerConfig(job_id="t" + uuid.uuid4().hex[:12], run_id="prop", copy_threads=1)
        c = ShardedCheckpointer(cfg, tmp)
        try:
            assert c.save(1, state).saved
            c.stager.flush()
            assert c.persist(1).commit
            for memo in memos:
                loaded = c.load(zeros_like_state(state, memo), from_memory=False)
                assert loaded.source == "storage"
                assert same_bits(loaded.state, state)
                loaded = c.load(zeros_like_state(state, memo))  # and through memory
                assert loaded.source == "memory"
                assert same_bits(loaded.state, state)
        finally:
            c.close(remove=True)


@settings(max_examples=8, deadline=None)
@given(st.dictionaries(st.text(alphabet="abc", min_size=1, max_size=3), states(), min_size=1, max_size=3))
def test_storage_roundtrip_bit_for_bit(state: dict[str, Any]) -> None:
    _assert_round_trips(state)


@settings(max_examples=8, deadline=None)
@given(tied_states())
def test_tied_tensors_round_trip_through_memory_and_storage(inner: Any) -> None:
    # Every tensor of `a` is tied to its place in `b`; targets whose tensors are apart, then ones
    # keeping the ties.
    _assert_round_trips({"a": inner, "b": inner}, memos=(None, {}))


@given(st.lists(st.text(alphabet="ab.", max_size=5), unique=True, max_size=8))
def test_dcp_grouping_keeps_every_dcp_key(names: list[str]) -> None:
    flat = {n: torch.full((1,), float(i)) for i, n in enumerate(names)}
    grouped = dcp_grouped(flat)
    # DCP names a nested value by its path joined with "."; a grouped leaf's path is (head, rest).
    joined = {}
    for head, value in grouped.items():
        if isinstance(value, dict):
            assert value, "no empty groups"
            joined.update({f"{head}.{rest}": t for rest, t in value.items()})
        else:
            assert "." not in head or grouped == flat
            joined[head] = value
    assert joined.keys() == flat.keys()
    assert all(joined[k] is flat[k] for k in flat)  # the same tensors, nothing copied
    heads = {n.partition(".")[0] for n in names if "." in n}
    if heads.isdisjoint(names):
        assert len(grouped) == len(heads) + sum("." not in n for n in names)


def test_dcp_grouping_keeps_a_key_that_is_also_a_head_flat() -> None:
    t, u = torch.zeros(1), torch.ones(1)
    assert dcp_grouped({"model.w": t, "model.b": u, "rng": t}) == {"model": {"w": t, "b": u}, "rng": t}
    assert dcp_grouped({"a": t, "a.b": u}) == {"a": t, "a.b": u}


def test_rejoin_takes_values_keeps_tensors() -> None:
    live = _state(1.0)
    weight = live["model"]["0.weight"]
    values = _state(2.0)
    out = rejoin(live, values)
    assert out is live
    assert live["model"]["0.weight"] is weight  # tensors are restored in place, never replaced
    assert live["optim"]["param_groups"][0]["lr"] == 2.0
    assert live["step"] == 2
    with pytest.raises(StateStructureError, match="other keys"):
        rejoin(_state(1.0), {"model": {}})


def test_skeleton_ignores_values_not_structure() -> None:
    a = flatten_state(_state(1.0)).tree
    b = flatten_state(_state(2.0)).tree
    assert skeleton(a) == skeleton(b)
    other = _state(1.0)
    other["optim"]["param_groups"].append({"lr": 1.0, "n": None})
    assert skeleton(flatten_state(other).tree) != skeleton(a)


# -- the DCP store -----------------------------------------------------------------------------


def test_verify_file_names_the_damage(tmp_path: Path) -> None:
    f = tmp_path / "x.distcp"
    f.write_bytes(b"abcdef")
    good = checksum_file(f)
    assert good == {"bytes": 6, "crc32": zlib.crc32(b"abcdef")}
    verify_file(f, good)
    f.write_bytes(b"abcdeX")
    with pytest.raises(ChecksumError, match=r"x\.distcp does not match"):
        verify_file(f, good)
    f.write_bytes(b"abc")
    with pytest.raises(ChecksumError, match="truncated"):
        verify_file(f, good)
    f.unlink()
    with pytest.raises(ChecksumError, match="missing"):
        verify_file(f, good)


def test_each_rank_checksums_the_files_it_wrote() -> None:
    names = [".metadata", "__0_0.distcp", "__0_1.distcp", "__1_0.distcp", "__7_0.distcp", "other"]
    assert checksum_owners(names, 2) == {
        ".metadata": 0,  # not a rank's file: in turns
        "__0_0.distcp": 0,
        "__0_1.distcp": 0,
        "__1_0.distcp": 1,
        "__7_0.distcp": 1,  # names no rank of this world: in turns
        "other": 0,
    }
    assert set(checksum_owners(names, 1).values()) == {0}
    assert checksum_owners([], 3) == {}


def test_manifest_needs_exactly_one_checksum_per_file() -> None:
    fs = {"bytes": 1, "crc32": 2}
    done = [{"files": {"a": fs}}, {"files": {"b": fs}}]
    doc = manifest_doc(3, world_size=2, done=done, listed=["a", "b"], tree={}, tensor_keys=[], sharding={})
    assert parse_manifest(json.dumps(doc).encode(), 3)["files"] == {"a": fs, "b": fs}
    with pytest.raises(LayoutError, match=r"without a checksum \['c'\]"):
        manifest_doc(3, world_size=2, done=done, listed=["a", "b", "c"], tree={}, tensor_keys=[], sharding={})
    with pytest.raises(LayoutError, match="twice"):
        manifest_doc(3, world_size=2, done=done + done, listed=["a", "b"], tree={}, tensor_keys=[], sharding={})
    with pytest.raises(LayoutError, match="names step"):
        parse_manifest(json.dumps(doc).encode(), 4)
    with pytest.raises(LayoutError):
        parse_manifest(b'{"format": "dlrover-flashckpt/checkpoint", "version": 1}', 3)


# -- one rank (no process group): memory, storage, checksums, commit ------------------------------


@pytest.fixture
def ckpt(config: StagerConfig, tmp_path: Path) -> Any:
    c = ShardedCheckpointer(config, tmp_path / "ck", retention=RetentionPolicy(keep_last=2))
    yield c
    c.close(remove=True)


def _save(c: ShardedCheckpointer, step: int, persist: bool = True) -> None:
    assert c.save(step, _state(float(step))).saved
    c.stager.flush()
    if persist:
        assert c.persist(step).commit


def test_memory_restore_is_in_place(ckpt: ShardedCheckpointer) -> None:
    _save(ckpt, 1, persist=False)
    _save(ckpt, 2, persist=False)
    target = _state(0.0)
    ptrs = [t.data_ptr() for t in split_sharded(target).dcp.values()]
    loaded = ckpt.load(target)
    assert (loaded.source, loaded.step, loaded.verified) == ("memory", 2, True)
    assert loaded.state is target
    assert [t.data_ptr() for t in split_sharded(target).dcp.values()] == ptrs
    assert same_bits(target, _state(2.0))


def _node_saver_writes(c: ShardedCheckpointer, step: int) -> None:
    """What a node saver does with this rank's snapshot of `step`: write it rank by rank."""
    seg, header = _held_slot(c, step)
    try:
        persist_rank(c.storage, payload_from_slot(seg, header, 0, 1))
    finally:
        seg.unlock()
        seg.close()


def _held_slot(c: ShardedCheckpointer, step: int) -> tuple[ShmSegment, Any]:
    cfg = c.config
    for slot in range(cfg.num_slots):
        seg = ShmSegment.attach(segment_path(cfg.shm_dir, cfg.job_id, cfg.run_id, 0, slot))
        header = read_header(seg)
        if header is not None and header.step == step and seg.try_lock(exclusive=False):
            return seg, header
        seg.close()
    raise AssertionError(f"step {step} is not in memory")


def test_a_dcp_persist_leaves_a_step_a_node_saver_is_writing_alone(ckpt: ShardedCheckpointer) -> None:
    _save(ckpt, 1, persist=False)
    _node_saver_writes(ckpt, 1)  # its done marker is written; the commit has not happened yet
    decision = ckpt.persist(1)
    assert not decision.commit
    assert "being persisted rank by rank by a node saver" in decision.reason
    assert ckpt.storage.exists(safetensors_path(1, 0))  # its files were not cleared
    assert Committer(ckpt.storage).try_commit(1, 1).commit  # and the saver's commit goes through
    loaded = ckpt.load(_state(0.0), from_memory=False)
    assert (loaded.source, loaded.step) == ("storage", 1)


def test_a_step_saved_rank_by_rank_with_other_shapes_is_refused_before_anything_is_written(
    ckpt: ShardedCheckpointer,
) -> None:
    _save(ckpt, 1, persist=False)
    _node_saver_writes(ckpt, 1)
    assert Committer(ckpt.storage).try_commit(1, 1).commit
    other = _state(5.0)
    other["model"]["0.weight"] = torch.full((5, 3), 5.0)  # same structure, another shape
    with pytest.raises(StateStructureError, match=r"'model\.0\.weight' with shape \[4, 3\]"):
        ckpt.load(other, from_memory=False)
    assert bool((other["model"]["0.weight"] == 5.0).all())  # nothing was written


def test_a_step_restored_from_memory_is_persisted_in_the_background(ckpt: ShardedCheckpointer) -> None:
    _save(ckpt, 1)
    _save(ckpt, 2, persist=False)  # the processes died before persisting step 2
    target = _state(0.0)
    assert ckpt.load(target).step == 2
    assert ckpt.restored_persist is not None
    assert ckpt.restored_persist.result(timeout=60).commit
    assert "persist_restored" in ckpt.events.kinds()
    assert Committer(ckpt.storage).tracker() == Tracker(2, 1)
    # Restored again: storage has it, so the persist is refused and nothing is written twice.
    assert ckpt.load(target).step == 2
    assert ckpt.restored_persist is not None
    refused = ckpt.restored_persist.result(timeout=60)
    assert not refused.commit
    assert "not newer" in refused.reason
    # A load from storage starts nothing.
    assert ckpt.load(target, from_memory=False).source == "storage"
    assert ckpt.restored_persist is None


def test_persist_restored_can_be_turned_off(config: StagerConfig, tmp_path: Path) -> None:
    c = ShardedCheckpointer(config, tmp_path / "ck", persist_restored=False)
    try:
        _save(c, 1, persist=False)
        assert c.load(_state(0.0)).source == "memory"
        assert c.restored_persist is None
        assert Committer(c.storage).tracker() is None
    finally:
        c.close(remove=True)


def test_storage_roundtrip_and_readable_by_plain_dcp(ckpt: ShardedCheckpointer, tmp_path: Path) -> None:
    _save(ckpt, 1)
    _save(ckpt, 2)
    _save(ckpt, 3, persist=False)
    target = _state(0.0)
    loaded = ckpt.load(target, from_memory=False)
    assert (loaded.source, loaded.step) == ("storage", 2)
    assert same_bits(target, _state(2.0))
    # A user with only torch: a nested template of the tensors loads with DCP's defaults.
    plain = {"model": {"0.weight": torch.zeros(4, 3), "0.bias": torch.zeros(3, dtype=torch.int16)}}
    dcp_load(plain, storage_reader=FileSystemReader(tmp_path / "ck" / "2"), no_dist=True)
    assert same_bits(plain["model"], _state(2.0)["model"])
    man = json.loads((tmp_path / "ck" / manifest_path(2)).read_text())
    assert man["tensor_keys"][0] == "model.0.weight"
    # DCP was handed the tensors grouped (`dcp_grouped`): its keys are still exactly ours.
    saved = FileSystemReader(tmp_path / "ck" / "2").read_metadata().state_dict_metadata
    assert sorted(saved) == sorted(man["tensor_keys"])
    assert set(man["files"]) >= {".metadata"}


def test_corrupt_file_falls_back_naming_it(ckpt: ShardedCheckpointer, tmp_path: Path) -> None:
    _save(ckpt, 1)
    _save(ckpt, 2)
    data = sorted((tmp_path / "ck" / "2").glob("*.distcp"))[0]
    raw = bytearray(data.read_bytes())
    raw[len(raw) // 2] ^= 0x01
    data.write_bytes(bytes(raw))
    target = _state(0.0)
    loaded = ckpt.load(target, from_memory=False)
    assert loaded.step == 1
    assert same_bits(target, _state(1.0))
    reasons = [e.reason for e in ckpt.events.snapshot() if e.kind == "fallback"]
    assert any(data.name in r and "step 2" in r for r in reasons), reasons


def test_dcp_errors_are_decisions_and_fallbacks_not_escaping_exceptions(
    ckpt: ShardedCheckpointer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # DCP wraps its errors in CheckpointException, a BaseException: `except Exception` misses it.
    # A failed write must come back as a refused decision with an event (every rank returns,
    # none is left in a collective), and a failed read of a verified step must fall back.
    _save(ckpt, 1)
    _save(ckpt, 2, persist=False)

    def write_fails(self: FileSystemWriter, plan: Any, planner: Any) -> Any:
        raise OSError(errno.EIO, "injected write error")

    with monkeypatch.context() as m:
        m.setattr(FileSystemWriter, "write_data", write_fails)
        decision = ckpt.persist(2)
    assert not decision.commit
    failed = [e.reason for e in ckpt.events.snapshot() if e.kind == "persist_failed"]
    assert any("CheckpointException" in r and "injected write error" in r for r in failed), failed
    assert Committer(PosixStorage(ckpt.root)).tracker() == Tracker(1, 1)  # type: ignore[arg-type]
    assert ckpt.persist(2).commit  # the next attempt clears the failed one's leftovers

    real_read = FileSystemReader.read_data

    def step_2_unreadable(self: FileSystemReader, plan: Any, planner: Any) -> Any:
        if Path(self.path).name == "2":
            raise OSError(errno.EIO, "injected read error")
        return real_read(self, plan, planner)

    monkeypatch.setattr(FileSystemReader, "read_data", step_2_unreadable)
    target = _state(0.0)
    loaded = ckpt.load(target, from_memory=False)
    assert loaded.step == 1
    assert same_bits(target, _state(1.0))
    failed = [e.reason for e in ckpt.events.snapshot() if e.kind == "load_failed"]
    assert any("injected read error" in r for r in failed), failed


def test_damaged_metadata_is_never_unpickled(ckpt: ShardedCheckpointer, tmp_path: Path) -> None:
    _save(ckpt, 1)
    (tmp_path / "ck" / "1" / ".metadata").write_bytes(b"not a pickle")
    with pytest.raises(NoCheckpointError, match=r"\.metadata is missing, truncated or corrupt"):
        ckpt.load(_state(0.0), from_memory=False)


def test_failed_commit_keeps_previous_checkpoint(
    ckpt: ShardedCheckpointer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _save(ckpt, 1)
    real = ckpt.storage.write_file

    def failing(path: str, chunks: Any) -> int:
        if path == manifest_path(2):
            raise StorageError(f"{path}: No space left on device")
        return real(path, chunks)

    monkeypatch.setattr(ckpt.storage, "write_file", failing)
    _save(ckpt, 2, persist=False)
    decision = ckpt.persist(2)
    assert not decision.commit
    assert "No space left" in decision.reason
    assert Committer(ckpt.storage).tracker() == Tracker(1, 1)
    target = _state(0.0)
    assert ckpt.load(target, from_memory=False).step == 1
    assert same_bits(target, _state(1.0))
    # The partial step 2 (DCP files and a done marker, no manifest) is replaced by the next try.
    monkeypatch.setattr(ckpt.storage, "write_file", real)
    assert ckpt.persist(2).commit
    assert ckpt.load(_state(0.0), from_memory=False).step == 2


def test_persist_writes_the_staged_snapshot_not_the_live_state(ckpt: ShardedCheckpointer) -> None:
    state = _state(1.0)
    assert ckpt.save(1, state).saved
    ckpt.stager.flush()
    state["model"]["0.weight"].fill_(-5.0)  # training went on after the snapshot
    assert ckpt.persist(1).commit
    future = ckpt.persist_async(2)  # not staged yet: refused, in the background too
    assert not future.result(timeout=60).commit
    assert ckpt.save(2, state).saved
    future = ckpt.persist_async(2)
    state["model"]["0.weight"].fill_(-6.0)
    assert future.result(timeout=60).commit
    target = _state(0.0)
    assert ckpt.load(target, from_memory=False).step == 2
    expected = _state(1.0)
    expected["model"]["0.weight"].fill_(-5.0)
    assert same_bits(target, expected)
    step1 = {"model": {"0.weight": torch.zeros(4, 3)}}
    dcp_load(step1, storage_reader=FileSystemReader(ckpt.root / "1"), no_dist=True)
    assert same_bits(step1["model"]["0.weight"], torch.full((4, 3), 1.0))


def test_persisting_an_older_snapshot_records_its_own_values(ckpt: ShardedCheckpointer) -> None:
    state = _state(2.0)
    assert ckpt.save(2, state).saved
    state["step"] = 3
    state["optim"]["param_groups"][0]["lr"] = 0.5
    state["model"]["0.weight"].fill_(3.0)
    assert ckpt.save(3, state).saved
    ckpt.stager.flush()
    assert ckpt.persist(2).commit  # the older of the two snapshots in memory
    target = _state(0.0)
    assert ckpt.load(target, from_memory=False).step == 2
    assert same_bits(target, _state(2.0))


def test_persist_refusals(ckpt: ShardedCheckpointer, tmp_path: Path) -> None:
    _save(ckpt, 5)
    assert "not newer" in ckpt.persist(5).reason
    assert "not in memory" in ckpt.persist(9).reason
    assert json.loads((tmp_path / "ck" / TRACKER_PATH).read_text())["step"] == 5


def test_a_snapshot_held_by_another_party_is_refused_naming_it(config: StagerConfig, tmp_path: Path) -> None:
    c = ShardedCheckpointer(attrs.evolve(config, lock_timeout_s=0.0), tmp_path / "ck")
    held: list[ShmSegment] = []
    try:
        _save(c, 1, persist=False)
        for slot in range(config.num_slots):
            path = segment_path(config.shm_dir, config.job_id, config.run_id, config.rank, slot)
            if path.exists():
                seg = ShmSegment.attach(path)
                held.append(seg)
                assert seg.try_lock(exclusive=True)  # e.g. a loader of another process
        decision = c.persist(1)
        assert not decision.commit
        assert "not in memory" in decision.reason
        assert "stayed locked" in decision.reason
        assert "persist_failed" in c.events.kinds()
        for seg in held:
            seg.unlock()
        assert c.persist(1).commit  # nothing was left half done
        target = _state(0.0)
        assert c.load(target, from_memory=False).step == 1
        assert same_bits(target, _state(1.0))
    finally:
        for seg in held:
            seg.close()
        c.close(remove=True)


def test_structure_change_is_refused_and_changes_nothing(ckpt: ShardedCheckpointer) -> None:
    _save(ckpt, 1)
    target = _state(0.0)
    target["model"]["extra"] = torch.zeros(2)
    with pytest.raises(StateStructureError, match="another state structure"):
        ckpt.load(target, from_memory=False)
    assert same_bits(target["model"]["0.weight"], torch.zeros(4, 3))


def test_nothing_to_load(ckpt: ShardedCheckpointer) -> None:
    with pytest.raises(NoCheckpointError):
        ckpt.load(_state(0.0))


def test_config_must_match_the_process_group(job_id: str, tmp_path: Path) -> None:
    cfg = StagerConfig(job_id=job_id, run_id="r1", rank=1, world_size=2)
    with pytest.raises(FlashCkptError, match="rank 1 of 2"):
        ShardedCheckpointer(cfg, tmp_path)


# -- a process killed while persisting --------------------------------------------------------


@pytest.mark.integration
@pytest.mark.timeout(90)
@pytest.mark.parametrize("point", ["mid_dcp", "before_done", "before_tracker"])
def test_killed_during_persist_leaves_previous_checkpoint(job_id: str, tmp_path: Path, point: str) -> None:
    storage = tmp_path / "ck"
    try:
        proc = subprocess.run(
            [sys.executable, KILLED, job_id, str(storage), point],
            check=False,
            capture_output=True,
            text=True,
            timeout=80,
        )
        assert proc.returncode == -9, proc.stderr[-2000:]
        assert Committer(PosixStorage(storage)).tracker() == Tracker(1, 1)
        cfg = StagerConfig(job_id=job_id, run_id="kill", copy_threads=1)
        c = ShardedCheckpointer(cfg, storage)
        try:
            target = {"model": {"w": torch.zeros(64, 64), "b": torch.zeros(3)}, "step": -1}
            loaded = c.load(target, from_memory=False)
            assert (loaded.step, target["step"]) == (1, 1)
            assert bool((target["model"]["w"] == 1.0).all())
            # The restarted process finds step 2 in memory and persists it over the leftovers, in
            # the background (`persist_restored`).
            assert c.load(target).step == 2
            assert c.restored_persist is not None
            assert c.restored_persist.result(timeout=60).commit
            assert c.load(target, from_memory=False).step == 2
        finally:
            c.close(remove=True)
    finally:
        remove_run("/dev/shm", job_id, "kill")


# -- real FSDP jobs (gloo, CPU) -------------------------------------------------------------------

# FSDP2, and FSDP1 built with a device_mesh (so its sharded state dict is DTensors) and, on CPU,
# device_id=cpu (see the worker).
FSDP_VERSIONS = pytest.mark.parametrize("fsdp", [1, 2], ids=["fsdp1", "fsdp2"])


def _assert_every_rank_fell_back_to_step_2_naming_the_damage(
    events: list[dict[str, Any]], loaded: dict[tuple[int, int], dict[str, Any]], full: dict[int, Any]
) -> None:
    corrupted = next(e["file"] for e in events if e["event"] == "corrupted")
    for r in range(3):
        e = loaded[(3, r)]
        assert (e["source"], e["step"], e["state_step"]) == ("storage", 2, 2)
        assert e["full"] == full[2]
        assert any(k == "fallback" and corrupted in reason for k, _, reason in e["events"])


def _python(args: list[str], timeout_s: float, job_id: str, run_id: str) -> str:
    """Run ``python ARGS`` to success (bounded); its standard output. The job's shared memory of
    `run_id` is removed whatever happens, so a failed run leaves nothing behind."""
    try:
        proc = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=timeout_s, check=False)
    finally:
        remove_run("/dev/shm", job_id, run_id)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def _run_phases(job_id: str, tmp_path: Path, *phases: str, fsdp: int = 2) -> list[dict[str, Any]]:
    """Run the FSDP worker's phases (storage in ``tmp_path/ck``); every JSON event they printed."""
    args = [WORKER, "--job", job_id, "--storage", str(tmp_path / "ck"), "--tmp", str(tmp_path), f"--fsdp={fsdp}"]
    args += phases
    out = _python(args, 140, job_id, "fsdp")
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


@pytest.mark.integration
@pytest.mark.timeout(150)
@FSDP_VERSIONS
def test_fsdp_saved_on_2_loads_on_2_from_memory_and_on_1_and_3_from_storage(
    job_id: str, tmp_path: Path, fsdp: int
) -> None:
    storage = tmp_path / "ck"
    events = _run_phases(job_id, tmp_path, "train:2", "restore:1", "corrupt:3", "restore:3", fsdp=fsdp)
    full = {e["step"]: e["full"] for e in events if e["event"] == "trained"}
    # Step 1 persisted in the foreground; step 2 in the background, reported after step 3.
    assert [e["committed"] for e in events if e["event"] == "trained"] == [True, None, True]
    assert full[1] != full[2] != full[3]
    loaded = {(e["world"], e["rank"]): e for e in events if e["event"] == "loaded"}
    assert sorted(loaded) == [(1, 0), (2, 0), (2, 1), (3, 0), (3, 1), (3, 2)]
    # Same size: step 3 (never persisted) from memory, into the existing shards (FSDP1's: its flat
    # parameters), bit for bit; then persisted in the background (`persist_restored`), as a node
    # saver persists a failure's.
    for r in (0, 1):
        e = loaded[(2, r)]
        assert (e["source"], e["step"], e["state_step"], e["same_memory"]) == ("memory", 3, 3, True)
        assert e["full"] == full[3]
        assert any(k == "persist_restored" for k, _, _ in e["events"])
    # One rank: rank 0's snapshot is sharded for two, so step 3, committed since, is resharded
    # (FSDP1 on one rank does not shard at all: NO_SHARD, as torch warns).
    e = loaded[(1, 0)]
    assert (e["source"], e["step"], e["state_step"]) == ("storage", 3, 3)
    assert e["full"] == full[3]
    # Three ranks after a DCP file of step 3 was damaged: every rank names it and uses step 2.
    _assert_every_rank_fell_back_to_step_2_naming_the_damage(events, loaded, full)
    assert Committer(PosixStorage(storage)).tracker() == Tracker(3, 2)


@pytest.mark.integration
@pytest.mark.timeout(170)
@FSDP_VERSIONS
def test_fsdp_processes_die_and_the_node_saver_persists_their_step_loadable_resharded(
    job_id: str, tmp_path: Path, fsdp: int
) -> None:
    phases = ["traindie:2", "awaitcommit:3", "stopsaver:2", "restore:3", "restore:1", "corruptrank:3", "restore:2"]
    events = _run_phases(job_id, tmp_path, *phases, fsdp=fsdp)
    full = {e["step"]: e["full"] for e in events if e["event"] == "trained"}
    # Both training processes were SIGKILLed with step 3 only in memory (steps 1 and 2 went to
    # storage with DCP); the detached node saver persisted step 3 rank by rank, by itself.
    assert [(e["step"], e["format"]) for e in events if e["event"] == "committed"] == [
        (3, "dlrover-flashckpt/checkpoint")
    ]
    (saver,) = [e["pid"] for e in events if e["event"] == "saver"]
    assert [e["pid"] for e in events if e["event"] == "saver_stopped"] == [saver]  # and it is gone
    loaded = {(e["world"], e["rank"]): e for e in events if e["event"] == "loaded"}
    # The saver removed the memory at the job's end: three ranks, then one, load step 3 from the
    # two ranks' files, resharded through DCP's planner, bit for bit, into their own shards.
    for key in [(3, 0), (3, 1), (3, 2), (1, 0)]:
        e = loaded[key]
        assert (e["source"], e["step"], e["state_step"], e["same_memory"]) == ("storage", 3, 3, True), key
        assert e["full"] == full[3]
    # Once the last rank's file of step 3 is damaged, both ranks name it and load the DCP step 2.
    corrupted = next(e["file"] for e in events if e["event"] == "corrupted")
    for r in range(2):
        e = loaded[(2, r)]
        assert (e["source"], e["step"], e["state_step"]) == ("storage", 2, 2)
        assert e["full"] == full[2]
        assert any(k == "fallback" and corrupted in reason for k, _, reason in e["events"])
    assert not list(Path("/dev/shm").glob(f"dlrover-fc.{job_id}.*"))


PARTIAL_WITH_SAVER = """
import os, sys, tempfile
import torch, torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Partial, Shard
from dlrover.flashckpt.config import StagerConfig
from dlrover.flashckpt.errors import StateStructureError
from dlrover.flashckpt.sharded import ShardedCheckpointer

job, storage, init = sys.argv[1:4]
dist.init_process_group("gloo", init_method=init, rank=0, world_size=1)
mesh = init_device_mesh("cpu", (1,))
state = {
    "w": DTensor.from_local(torch.ones(4), mesh, [Shard(0)]),
    "p": DTensor.from_local(torch.ones(4), mesh, [Partial()]),
}
ckpt = ShardedCheckpointer(StagerConfig(job_id=job, run_id="r"), storage, saver="auto")
try:
    ckpt.save(1, state)
except StateStructureError as e:
    print("refused:", e)
else:
    print("saved")
finally:
    ckpt.close(remove=True, job_end=True)
    dist.destroy_process_group()
"""


@pytest.mark.integration
@pytest.mark.timeout(90)
def test_with_a_node_saver_a_layout_its_files_cannot_place_is_refused_at_save(job_id: str, tmp_path: Path) -> None:
    script = tmp_path / "partial.py"
    script.write_text(PARTIAL_WITH_SAVER)
    out = _python([str(script), job_id, str(tmp_path / "ck"), f"file://{tmp_path / 'pg'}"], 80, job_id, "r")
    assert "refused: with a node saver (saver='auto') every DTensor must be placed by Shard or Replicate" in out
    assert "'p' has ['P(sum)']" in out
    # The detached saver was told the job ended; it exits on its own time (bounded wait).
    deadline = time.monotonic() + 60
    while processes_mentioning(job_id):
        assert time.monotonic() < deadline, f"the detached saver outlived the job: {processes_mentioning(job_id)}"
        time.sleep(0.05)


DEFAULT_SAVER_UNDER_AN_AGENT = """
import json, os, sys
from pathlib import Path
import torch, torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Partial, Shard
from dlrover.flashckpt.config import StagerConfig
from dlrover.flashckpt.host import HOST_SOCKET_ENV_VAR, SaverHost, SaverHostConfig, host_socket_path
from dlrover.flashckpt.sharded import ShardedCheckpointer

job, storage, init, host_dir, shm, layout = sys.argv[1:7]
dist.init_process_group("gloo", init_method=init, rank=0, world_size=1)
mesh = init_device_mesh("cpu", (1,))
# The agent's saver, as dlrover-run hosts it: its socket named in the workers' environment.
host = SaverHost(SaverHostConfig(str(host_socket_path(Path(host_dir))), stop_timeout_s=60))
host.start()
os.environ[HOST_SOCKET_ENV_VAR] = str(host.socket_path)
cfg = StagerConfig(job_id=job, run_id="r", shm_dir=shm)
second = Partial() if layout == "partial" else Shard(0)

def state(value):
    return {
        "w": DTensor.from_local(torch.full((4,), value), mesh, [Shard(0)]),
        "p": DTensor.from_local(torch.full((4,), value), mesh, [second]),
    }

out = {}
ckpt = ShardedCheckpointer(cfg, storage, group=dist.new_group(backend="gloo"))  # saver left to its default
try:
    out["hosted"] = ckpt.client is not None and ckpt.client.saver_pid == os.getpid()
    for step in (1, 2):
        assert ckpt.save(step, state(float(step))).saved
    ckpt.stager.flush()
    out["warned"] = [e.reason for e in ckpt.events.snapshot() if e.kind == "saver_cannot_write"]
    ckpt.client.request_persist(1)
    told = ckpt.client.wait_persisted(1, 60)
    out["saver_persist"] = [told.ok, told.reason]
finally:
    ckpt.close(job_end=False)  # as a restart: the memory stays with the agent's saver
again = ShardedCheckpointer(cfg, storage, group=dist.new_group(backend="gloo"))
try:
    target = state(0.0)
    loaded = again.load(target)
    out["loaded"] = [loaded.source, loaded.step, target["p"].to_local().tolist()]
    out["restored_by"] = "saver" if again.restored_persist is None else "dcp"
    if again.restored_persist is not None:
        out["restored_committed"] = again.restored_persist.result(60).commit
        out["persist_failed"] = [e.reason for e in again.events.snapshot() if e.kind == "persist_failed"]
    else:
        out["restored_committed"] = again.client.wait_persisted(2, 60).committed
finally:
    again.close(job_end=True)
host.stop(remove_memory=True)
dist.destroy_process_group()
print("RESULT " + json.dumps(out))
"""


@pytest.mark.integration
@pytest.mark.timeout(120)
@pytest.mark.parametrize("layout", ["partial", "sharded"])
def test_under_an_agent_the_default_saver_writes_only_what_it_can_place(
    job_id: str, tmp_path: Path, layout: str
) -> None:
    # Under dlrover-run a ShardedCheckpointer uses the agent's saver without being asked. A state
    # it cannot write rank by rank (a Partial DTensor) still saves to memory, with one warning;
    # the saver refuses to persist its steps, and a step restored from memory is left to DCP.
    script = tmp_path / "default_saver.py"
    script.write_text(DEFAULT_SAVER_UNDER_AN_AGENT)
    host_dir, shm, ckpt = tmp_path / "host", tmp_path / "shm", tmp_path / "ck"
    host_dir.mkdir()
    shm.mkdir()
    args = [str(script), job_id, str(ckpt), f"file://{tmp_path / 'pg'}", str(host_dir), str(shm), layout]
    out = json.loads(_python(args, 100, job_id, "r").split("RESULT ", 1)[1])
    assert out["hosted"]
    assert out["loaded"] == ["memory", 2, [2.0] * 4]
    tracker = Committer(PosixStorage(ckpt)).tracker()
    if layout == "partial":
        # Nobody can persist a Partial DTensor (DCP refuses it too): nothing is committed, and
        # the saver, unable to place it, wrote nothing at all rather than a step that never loads.
        assert out["restored_committed"] is False
        assert "CheckpointException" in out["persist_failed"][0]  # DCP's own error, as an event
        assert tracker is None
        assert not list(ckpt.glob("*/*.safetensors"))
        assert len(out["warned"]) == 1  # once, for two saves
        assert "'p' has ['P(sum)']" in out["warned"][0]
        assert "will not persist it after a failure" in out["warned"][0]
        ok, reason = out["saver_persist"]
        assert not ok
        assert "not all placed by Shard or Replicate alone" in reason
        assert out["restored_by"] == "dcp"
    else:
        assert out["restored_committed"] is True
        assert tracker is not None
        assert tracker.step == 2
        assert out["warned"] == []
        assert out["saver_persist"][0]
        assert out["restored_by"] == "saver"
        assert json.loads(PosixStorage(ckpt).read_bytes(manifest_path(2)))["format"] == CHECKPOINT_FORMAT
    assert list(host_dir.iterdir()) == []
    assert list(shm.iterdir()) == []
