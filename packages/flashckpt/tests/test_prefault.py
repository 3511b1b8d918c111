"""A stager that is not prepared allocates and pre-faults its other slots behind its first save.

The background thread is gated in these tests (never timed): a save that comes while it runs waits
for it and writes bit for bit; `close` stops it between two chunks and joins it; a failure is an
event, and the save that takes the slot allocates it as before.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from flashckpt_testlib import resident_pages, same_bits

from dlrover.flashckpt.config import StagerConfig
from dlrover.flashckpt.errors import FlashCkptError
from dlrover.flashckpt.memory import MemoryReader
from dlrover.flashckpt.segment import ShmSegment, segment_path
from dlrover.flashckpt.slotio import peek_header
from dlrover.flashckpt.stager import Stager

pytestmark = pytest.mark.timeout(120)

REAL_CREATE_UNLESS_STOPPED = ShmSegment.create_unless_stopped


def _state(seed: int) -> dict[str, Any]:
    g = torch.Generator().manual_seed(seed)
    return {
        "w": torch.randn(300_000, generator=g),
        "b": torch.randint(-100, 100, (4097,), generator=g, dtype=torch.int64),
        "h": torch.randn(33, 7, generator=g).to(torch.bfloat16),
        "step": seed,
    }


def _slot(config: StagerConfig, slot: int) -> Path:
    return segment_path(config.shm_dir, config.job_id, config.run_id, 0, slot)


class _Gate:
    """Stands in for `ShmSegment.create_unless_stopped`: holds the background thread until
    released (or until the stager asks it to stop), then allocates for real."""

    def __init__(self, fail: bool = False) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        self.fail = fail
        self.calls = 0

    def __call__(self, path: Path, size: int, should_stop: Callable[[], bool], chunk_bytes: int = 1 << 20) -> Any:
        self.calls += 1
        self.entered.set()
        while not (self.release.wait(0.01) or should_stop()):
            pass
        if self.fail:
            raise FlashCkptError("injected: no memory for the slot")
        return REAL_CREATE_UNLESS_STOPPED(path, size, should_stop, chunk_bytes=chunk_bytes)


@pytest.fixture
def foreground_creates(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """Paths `ShmSegment.create` allocated: the allocations a save paid for on its blocking path."""
    created: list[Path] = []
    real = ShmSegment.create

    def spy(path: Path, size: int) -> ShmSegment:
        created.append(path)
        return real(path, size)

    monkeypatch.setattr(ShmSegment, "create", staticmethod(spy))
    return created


def test_the_first_save_without_prepare_faults_the_other_slot_in_behind_it(
    config: StagerConfig, foreground_creates: list[Path]
) -> None:
    stager = Stager(config)
    try:
        first = stager.save(1, _state(1))
        assert (first.saved, first.slot) == (True, 0)
        stager.flush()  # joins the background allocation
        other = _slot(config, 1)
        size = _slot(config, 0).stat().st_size
        assert other.stat().st_size == size  # the layout of the slot just written
        assert resident_pages(other) == -(-size // 4096)  # every page backed: nothing left to fault
        assert peek_header(other) is None  # reads as never written
        second = stager.save(2, _state(2))
        assert (second.saved, second.slot) == (True, 1)
        # Only the first save allocated on its blocking path; the second found its slot ready.
        assert foreground_creates == [_slot(config, 0)]
        assert "grow" not in stager.events.kinds()
        stager.flush()
        loaded = MemoryReader(config).load()
        assert loaded.step == 2
        assert same_bits(loaded.state, _state(2))
    finally:
        stager.close(remove=True)


def test_a_prepared_stager_or_an_opted_out_one_allocates_nothing_in_the_background(
    config: StagerConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    gate = _Gate()
    gate.release.set()
    monkeypatch.setattr(ShmSegment, "create_unless_stopped", staticmethod(gate))
    prepared = Stager(config)
    try:
        prepared.prepare(_state(1))
        prepared.save(1, _state(1))
        prepared.flush()
    finally:
        prepared.close(remove=True)
    off = StagerConfig(job_id=config.job_id + "x", run_id="r", prefault_in_background=False)
    lazy = Stager(off)
    try:
        lazy.save(1, _state(1))
        lazy.flush()
        assert not _slot(off, 1).exists()
    finally:
        lazy.close(remove=True)
    assert gate.calls == 0


def test_a_save_during_the_fault_in_waits_for_it_and_is_bit_exact(
    config: StagerConfig, monkeypatch: pytest.MonkeyPatch, foreground_creates: list[Path]
) -> None:
    gate = _Gate()
    monkeypatch.setattr(ShmSegment, "create_unless_stopped", staticmethod(gate))
    stager = Stager(config)
    try:
        stager.save(1, _state(1))
        assert gate.entered.wait(30)
        outcome: list[Any] = []
        saver = threading.Thread(target=lambda: outcome.append(stager.save(2, _state(2))))
        saver.start()
        saver.join(0.5)
        # Held while the slot is being allocated (correct code never lets it through before).
        assert saver.is_alive()
        assert not outcome
        gate.release.set()
        saver.join(60)
        assert not saver.is_alive()
        (second,) = outcome
        assert (second.saved, second.slot) == (True, 1)
        assert foreground_creates == [_slot(config, 0)]
        stager.flush()
        loaded = MemoryReader(config).load()
        assert loaded.step == 2
        assert same_bits(loaded.state, _state(2))
    finally:
        gate.release.set()
        stager.close(remove=True)


def test_close_during_the_fault_in_stops_and_joins_it_and_leaves_nothing(
    config: StagerConfig, monkeypatch: pytest.MonkeyPatch
) -> None:
    gate = _Gate()  # never released: only the stop that close asks for lets it go on
    monkeypatch.setattr(ShmSegment, "create_unless_stopped", staticmethod(gate))
    stager = Stager(config)
    stager.save(1, _state(1))
    assert gate.entered.wait(30)
    stager.close(remove=True)
    assert not any(t.name == "flashckpt-prefault" for t in threading.enumerate())
    assert not _slot(config, 0).exists()
    assert not _slot(config, 1).exists()
    # The `job_id` fixture fails the test if any file of the run is left in shared memory.


def test_a_failed_fault_in_is_an_event_and_the_next_save_allocates_the_slot_itself(
    config: StagerConfig, monkeypatch: pytest.MonkeyPatch, foreground_creates: list[Path]
) -> None:
    gate = _Gate(fail=True)
    gate.release.set()
    monkeypatch.setattr(ShmSegment, "create_unless_stopped", staticmethod(gate))
    stager = Stager(config)
    try:
        stager.save(1, _state(1))
        stager.flush()
        assert "prefault_failed" in stager.events.kinds()
        assert not _slot(config, 1).exists()
        second = stager.save(2, _state(2))
        assert (second.saved, second.slot) == (True, 1)
        assert foreground_creates == [_slot(config, 0), _slot(config, 1)]
        stager.flush()
        assert same_bits(MemoryReader(config).load().state, _state(2))
    finally:
        stager.close(remove=True)


def test_an_allocation_stopped_between_chunks_removes_its_partial_file(tmp_path: Path) -> None:
    asked = []

    def stop_after_two() -> bool:
        asked.append(1)
        return len(asked) > 2

    path = tmp_path / "seg"
    assert ShmSegment.create_unless_stopped(path, 5 << 20, stop_after_two, chunk_bytes=1 << 20) is None
    assert not path.exists()
    done = ShmSegment.create_unless_stopped(path, (3 << 20) + 5, lambda: False, chunk_bytes=1 << 20)
    assert done is not None
    try:
        assert done.size == path.stat().st_size == (3 << 20) + 5
    finally:
        done.close()
    with pytest.raises(FlashCkptError, match="exists already"):
        ShmSegment.create_unless_stopped(path, 4096, lambda: False)
