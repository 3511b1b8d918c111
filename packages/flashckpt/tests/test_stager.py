"""Stager and memory reader behaviour: slots, busy policy, re-layout, crashes, corruption, cleanup."""

from __future__ import annotations

import os
import subprocess
import sys

import attrs
import pytest
import torch
from flashckpt_testlib import our_files

from dlrover.common import ConfigError, ManualClock
from dlrover.flashckpt.config import StagerConfig
from dlrover.flashckpt.errors import ChecksumError, NoCheckpointError, SlotBusyError, StateStructureError
from dlrover.flashckpt.layout import SlotState
from dlrover.flashckpt.memory import MemoryReader
from dlrover.flashckpt.segment import ShmSegment, cleanup_stale, owner_path, segment_path, write_owner
from dlrover.flashckpt.slotio import read_header, write_header
from dlrover.flashckpt.slots import BusyPolicy
from dlrover.flashckpt.stager import Stager


def _state(v: float, n: int = 100) -> dict[str, object]:
    return {"w": torch.full((n,), v), "step": int(v)}


def test_double_buffering_keeps_newest_and_alternates(config: StagerConfig) -> None:
    stager = Stager(config)
    try:
        slots = []
        for step in range(1, 6):
            r = stager.save(step, _state(step))
            slots.append(r.slot)
            stager.flush()
        assert slots == [0, 1, 0, 1, 0]
        snaps = MemoryReader(config).snapshots()
        assert [s.step for s in snaps] == [5, 4]
        assert MemoryReader(config).load(step=4).state["step"] == 4
        with pytest.raises(NoCheckpointError, match="step 3"):
            MemoryReader(config).load(step=3)
    finally:
        stager.close()


def _hold_slot(config: StagerConfig, slot: int) -> ShmSegment:
    seg = ShmSegment.attach(segment_path(config.shm_dir, config.job_id, config.run_id, config.rank, slot))
    assert seg.try_lock(exclusive=False)
    return seg


@pytest.mark.parametrize("policy", [BusyPolicy.SKIP, BusyPolicy.WAIT, BusyPolicy.RAISE])
def test_busy_policy_never_silent(config: StagerConfig, policy: BusyPolicy) -> None:
    clock = ManualClock()
    cfg = attrs.evolve(config, busy_policy=policy, busy_wait_timeout_s=1.0, busy_poll_interval_s=0.25)
    stager = Stager(cfg, clock=clock)
    try:
        stager.save(1, _state(1))
        stager.save(2, _state(2))
        stager.flush()
        # A reader holds the older slot (step 1); slot 1 holds the newest and is protected.
        held = _hold_slot(cfg, 0)
        try:
            if policy is BusyPolicy.RAISE:
                with pytest.raises(SlotBusyError, match="step 3"):
                    stager.save(3, _state(3))
            else:
                r = stager.save(3, _state(3))
                assert not r.saved
                assert r.slot == -1
                # WAIT waited its full bound on the injected clock, in poll-sized steps.
                assert clock.now() == (1.0 if policy is BusyPolicy.WAIT else 0.0)
            assert stager.events.kinds().count("save_skipped") == 1
        finally:
            held.unlock()
            held.close()
        assert stager.save(4, _state(4)).slot == 0
        stager.flush()
        assert MemoryReader(cfg).load().step == 4
    finally:
        stager.close()


def test_a_kept_slot_is_written_over_only_once_released(config: StagerConfig) -> None:
    cfg = attrs.evolve(config, busy_policy=BusyPolicy.SKIP)
    stager = Stager(cfg)
    released = False
    try:
        first = stager.save(1, _state(1))
        stager.keep_until(first.slot, 1, lambda: released)  # e.g. until the saver holds it for a persist
        assert stager.save(2, _state(2)).slot != first.slot
        stager.flush()  # both seals done: only the keep can make a slot busy now
        skipped = stager.save(3, _state(3))
        assert not skipped.saved, "the only other slot holds the newest snapshot (step 2)"
        (event,) = [e for e in stager.events.snapshot() if e.kind == "save_skipped"]
        assert f"slot {first.slot} keeps step 1 until the saver holds it for its persist" in event.reason
        stager.flush()
        assert MemoryReader(cfg).load(step=1).state["step"] == 1
        assert stager.slot_of(1) == first.slot
        assert stager.slot_of(3) is None
        released = True
        assert stager.save(4, _state(4)).slot == first.slot
        assert stager.slot_of(1) is None
        with pytest.raises(ValueError, match="slot 2 is not one of the 2 slots"):
            stager.keep_until(2, 4, lambda: True)
    finally:
        stager.close()


@pytest.mark.parametrize("how", ["released", "expired"])
def test_a_keep_ends_when_let_go_or_after_one_busy_wait(config: StagerConfig, how: str) -> None:
    clock = ManualClock()
    cfg = attrs.evolve(config, busy_policy=BusyPolicy.SKIP, busy_wait_timeout_s=5.0)
    stager = Stager(cfg, clock=clock)
    try:
        first = stager.save(1, _state(1))
        stager.keep_until(first.slot, 1, lambda: False)  # a saver that never gets to it
        stager.save(2, _state(2))
        # Both seals done (they run in the background, slowly on a loaded machine): only the
        # keep can make a slot busy now.
        stager.flush()
        assert not stager.save(3, _state(3)).saved
        if how == "released":
            stager.release_kept("the agent asked for a save")
        else:
            clock.advance(5.0)
        assert stager.save(4, _state(4)).slot == first.slot
        (event,) = [e for e in stager.events.snapshot() if e.kind == "keep_released"]
        assert event.step == 1
        assert ("the agent asked" if how == "released" else "busy_wait_timeout_s=5.0") in event.reason
    finally:
        stager.close()


def test_structure_change_relays_out_and_grows(config: StagerConfig) -> None:
    stager = Stager(config)
    try:
        stager.prepare(_state(1, n=10))
        stager.save(1, _state(1, n=10))
        stager.save(2, {"w": torch.ones(3, 3, dtype=torch.float64), "extra": torch.arange(200_000)})
        stager.save(3, {"w": torch.ones(3, 3, dtype=torch.float64), "extra": torch.arange(200_000)})
        stager.flush()
        kinds = stager.events.kinds()
        assert "grow" in kinds
        assert "relayout" in kinds
        loaded = MemoryReader(config).load()
        assert loaded.step == 3
        assert torch.equal(loaded.state["extra"], torch.arange(200_000))
    finally:
        stager.close()


def test_manifest_outgrowing_its_region_lays_the_slot_out_again(config: StagerConfig) -> None:
    # The same tensors each save, so the slot's layout is reused and the copy starts before the
    # manifest is encoded; a note that outgrows the manifest region must still end in a whole slot.
    stager = Stager(config)
    try:
        for step in (1, 2, 3):  # each slot holds a layout planned for a short note
            stager.save(step, {"w": torch.full((1000,), float(step)), "note": "short"})
        long_note = "n" * (200 * 1024)  # past the 64 KiB a first layout reserves
        r = stager.save(4, {"w": torch.full((1000,), 4.0), "note": long_note})
        stager.flush()
        assert "relayout" not in stager.events.kinds()  # the tensors did not change, only their offset
        loaded = MemoryReader(config).load()
        assert (loaded.step, loaded.state["note"]) == (4, long_note)
        assert torch.equal(loaded.state["w"], torch.full((1000,), 4.0))
        # The next save into the same slot reuses the larger layout.
        stager.save(5, {"w": torch.full((1000,), 5.0), "note": long_note})
        assert stager.save(6, {"w": torch.full((1000,), 6.0), "note": long_note}).slot == r.slot
        stager.flush()
        assert torch.equal(MemoryReader(config).load().state["w"], torch.full((1000,), 6.0))
    finally:
        stager.close()


def test_bad_leaf_after_steady_saves_changes_nothing(config: StagerConfig) -> None:
    # With a reused layout the copy overlaps the manifest: a state that cannot be encoded must
    # still be refused before any byte of either slot changes.
    stager = Stager(config)
    try:
        stager.save(1, _state(1))
        stager.save(2, _state(2))
        stager.flush()
        # Refused while walking the state: an unsupported leaf, an int JSON cannot carry, depth.
        deep: list[object] = []
        for _ in range(120):
            deep = [deep]
        for bad in (object(), 10**5000, deep, torch.eye(3).to_sparse()):
            with pytest.raises(StateStructureError, match="'extra"):
                stager.save(3, {"w": torch.full((100,), 3.0), "step": 3, "extra": bad})
        assert [s.step for s in MemoryReader(config).snapshots()] == [2, 1]
        assert torch.equal(MemoryReader(config).load(step=1).state["w"], torch.full((100,), 1.0))
    finally:
        stager.close()


def test_half_written_slot_is_never_read(config: StagerConfig) -> None:
    stager = Stager(config)
    try:
        stager.save(1, _state(1))
        stager.save(2, _state(2))
        stager.flush()
        # Simulate a writer that died half way through step 3 in slot 0.
        seg = ShmSegment.attach(segment_path(config.shm_dir, config.job_id, config.run_id, 0, 0))
        header = read_header(seg)
        assert header is not None
        write_header(seg, attrs.evolve(header, state=SlotState.WRITING, seq=99, step=3))
        seg.close()
        assert MemoryReader(config).load().step == 2
        # The broken slot is the first one reused.
        assert stager.save(4, _state(4)).slot == 0
    finally:
        stager.close()


def test_corrupt_snapshot_is_detected_and_changes_nothing(config: StagerConfig) -> None:
    stager = Stager(config)
    try:
        stager.save(1, _state(1))
        stager.flush()
        seg = ShmSegment.attach(segment_path(config.shm_dir, config.job_id, config.run_id, 0, 0))
        header = read_header(seg)
        assert header is not None
        seg.mm[header.data_off + 8] ^= 0xFF
        seg.close()
        target = _state(0)
        with pytest.raises(ChecksumError, match="'w'"):
            MemoryReader(config).load(target=target)
        assert torch.equal(target["w"], torch.zeros(100))
        assert target["step"] == 0
    finally:
        stager.close()


def test_structure_mismatch_changes_nothing(config: StagerConfig) -> None:
    stager = Stager(config)
    try:
        stager.save(1, {"a": torch.ones(4), "b": {"c": torch.ones(2)}, "n": 1})
        stager.flush()
        reader = MemoryReader(config)
        target = {"a": torch.zeros(4), "b": {"c": torch.zeros(3)}, "n": 0}
        with pytest.raises(StateStructureError, match=r"b/c.*F32\[2\].*F32\[3\]"):
            reader.load(target=target)
        assert torch.equal(target["a"], torch.zeros(4))
        assert target["n"] == 0
        with pytest.raises(StateStructureError, match="keys differ"):
            reader.load(target={"a": torch.zeros(4), "n": 0})
        with pytest.raises(StateStructureError, match="unsupported leaf of type object"):
            stager.save(2, {"x": object()})
    finally:
        stager.close()


def test_restarted_process_adopts_its_run_and_cleans_dead_runs(job_id: str) -> None:
    cfg = StagerConfig(job_id=job_id, run_id="live")
    # A dead job's run: its owner is a process that has exited.
    dead = StagerConfig(job_id=job_id + "x", run_id="old")
    proc = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, check=True)
    dead_pid = int(proc.stdout)
    write_owner(dead.shm_dir, dead.job_id, dead.run_id, pid=dead_pid)
    ShmSegment.create(segment_path(dead.shm_dir, dead.job_id, dead.run_id, 0, 0), 4096).close()
    # Our run's snapshot written by a process that died (stager not closed, owner recorded as dead).
    first = Stager(cfg)
    first.save(5, _state(5))
    first.flush()
    write_owner(cfg.shm_dir, cfg.job_id, cfg.run_id, pid=dead_pid)
    try:
        second = Stager(cfg)  # cleans up stale runs at start, keeping its own
        try:
            assert our_files(dead.job_id) == []
            assert second.owns_segments
            assert MemoryReader(cfg).load().step == 5
            assert second.save(6, _state(6)).seq > 1
        finally:
            second.close()
    finally:
        first.close(remove=False)
    assert our_files(job_id) == []


def test_cleanup_keeps_runs_with_live_owner(job_id: str) -> None:
    cfg = StagerConfig(job_id=job_id, run_id="a")
    write_owner(cfg.shm_dir, job_id, "a", pid=os.getpid())
    ShmSegment.create(segment_path(cfg.shm_dir, job_id, "a", 0, 0), 4096).close()
    assert cleanup_stale(cfg.shm_dir) == []
    owner_path(cfg.shm_dir, job_id, "a").unlink()
    assert len(cleanup_stale(cfg.shm_dir)) == 1


def test_config_rejects_bad_values(job_id: str) -> None:
    with pytest.raises(ConfigError, match="'a b'"):
        StagerConfig(job_id="a b", run_id="r")
    with pytest.raises(ConfigError, match="num_slots"):
        StagerConfig(job_id=job_id, run_id="r", num_slots=1)
    with pytest.raises(ConfigError, match="rank 2"):
        StagerConfig(job_id=job_id, run_id="r", rank=2, world_size=2)
    with pytest.raises(ConfigError, match="busy_wait_timeout_s"):
        StagerConfig(job_id=job_id, run_id="r", busy_wait_timeout_s=-1)
    with pytest.raises(ValueError, match="'later'"):
        StagerConfig(job_id=job_id, run_id="r", busy_policy="later")  # type: ignore[arg-type]
